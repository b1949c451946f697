//! `airlock status --no-start` (docs/service.md): never starts airlockd — no socket bound, no
//! process — reports "not running" with exit 3, and reports a running daemon like `status`.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::support::{World, wait_until};

/// A one-shot socket path whose directory does not exist yet.
fn oneshot_socket(world: &World) -> PathBuf {
    world.tmp.path().join("run").join("airlock.sock")
}

fn status(world: &World, socket: &Path, args: &[&str]) -> crate::support::Run {
    world
        .airlock(world.tmp.path())
        .args(["status"])
        .args(args)
        .env("AIRLOCK_SOCKET", socket)
        .env("AIRLOCK_IDLE_TIMEOUT", "600ms")
        .run()
}

/// Pids of `airlockd` processes started for `socket` (their environment names it).
fn daemons_for(socket: &Path) -> Vec<i32> {
    let needle = format!("AIRLOCK_SOCKET={}", socket.display());
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else { continue };
        let argv0 = cmdline.split(|b| *b == 0).next().unwrap_or_default();
        if !String::from_utf8_lossy(argv0).ends_with("airlockd") {
            continue;
        }
        let Ok(environ) = std::fs::read(entry.path().join("environ")) else { continue };
        if environ.split(|b| *b == 0).any(|v| v == needle.as_bytes()) {
            pids.push(pid);
        }
    }
    pids
}

#[test]
fn no_start_never_starts_the_daemon_and_says_not_running() {
    let world = World::new();
    let sock = oneshot_socket(&world);
    let run = status(&world, &sock, &["--no-start"]).expect_code(3);
    assert!(run.stdout().contains("airlockd is not running"), "{}", run.stdout());
    assert!(run.stdout().contains(&sock.display().to_string()), "{}", run.stdout());
    let json = status(&world, &sock, &["--no-start", "--json"]).expect_code(3);
    let v: Value = serde_json::from_str(&json.stdout()).unwrap();
    assert_eq!(v["running"], false, "{v}");
    // Give a wrongly started daemon time to appear: none did, and nothing bound the socket.
    std::thread::sleep(Duration::from_millis(300));
    assert!(!sock.exists(), "a socket was bound at {}", sock.display());
    assert!(daemons_for(&sock).is_empty(), "a daemon was started: {:?}", daemons_for(&sock));

    // Positive control: plain `status` starts one, and `--no-start` then reports it (exit 0).
    let started: Value =
        serde_json::from_str(&status(&world, &sock, &["--json"]).expect_code(0).stdout()).unwrap();
    let pid = started["pid"].as_i64().unwrap();
    let seen: Value = serde_json::from_str(
        &status(&world, &sock, &["--no-start", "--json"]).expect_code(0).stdout(),
    )
    .unwrap();
    assert_eq!(seen["pid"], pid);
    let text = status(&world, &sock, &["--no-start"]).expect_code(0).stdout();
    assert!(text.contains("is up"), "{text}");

    // After its idle exit the stale socket file stays: still "not running", nothing restarted.
    assert!(
        wait_until(Duration::from_secs(20), || daemons_for(&sock).is_empty()),
        "the daemon did not idle out"
    );
    status(&world, &sock, &["--no-start"]).expect_code(3);
    std::thread::sleep(Duration::from_millis(300));
    assert!(daemons_for(&sock).is_empty(), "a daemon was restarted: {:?}", daemons_for(&sock));
    let err = UnixStream::connect(&sock).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ECONNREFUSED), "{err}");
}
