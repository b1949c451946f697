//! Cost of one sandboxed command: `airlock exec -- true` against bare `true`, plain
//! `unshare -U -r -n -m -p -f true`, and `bwrap --unshare-all … true` (if installed), measured
//! side by side in one run (issue 5: overhead p50 ≤ 15 ms, stretch 8 ms).
//!
//! Run: `cargo bench --features test-hooks --bench sandbox`. `airlock_exec_true` hands the
//! session to the test-only `hold` bridge (the sandbox alone: namespaces, mounts, seccomp,
//! Landlock, init, relay); `airlock_exec_true_warm_daemon` registers it with a warm `airlockd`.

#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};

fn run(cmd: &mut Command) {
    let status = cmd.stdin(Stdio::null()).stdout(Stdio::null()).status();
    assert!(status.is_ok_and(|s| s.success()), "benchmark command failed: {cmd:?}");
}

fn on_path(tool: &str) -> Option<PathBuf> {
    ["/usr/bin", "/bin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.exists())
}

fn bench(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let home = tmp.path().join("home");
    let repo = tmp.path().join("bench");
    std::fs::create_dir_all(home.join(".airlock")).expect("home");
    std::fs::create_dir_all(repo.join(".git")).expect("repo");
    std::fs::write(home.join(".airlock/config.toml"), "[network]\nallow = [\"example.test\"]\n")
        .expect("config");
    let airlock = env!("CARGO_BIN_EXE_airlock");

    let mut g = c.benchmark_group("exec_true");
    g.sample_size(60).measurement_time(Duration::from_secs(8));
    g.bench_function("bare_true", |b| b.iter(|| run(&mut Command::new("/bin/true"))));
    if let Some(unshare) = on_path("unshare") {
        g.bench_function("unshare_user_net_mount_pid", |b| {
            b.iter(|| {
                run(Command::new(&unshare).args(["-U", "-r", "-n", "-m", "-p", "-f", "/bin/true"]))
            })
        });
    }
    if let Some(bwrap) = on_path("bwrap") {
        g.bench_function("bwrap_unshare_all", |b| {
            b.iter(|| {
                run(Command::new(&bwrap).args([
                    "--unshare-all",
                    "--ro-bind",
                    "/usr",
                    "/usr",
                    "--symlink",
                    "usr/bin",
                    "/bin",
                    "--symlink",
                    "usr/lib",
                    "/lib",
                    "--symlink",
                    "usr/lib64",
                    "/lib64",
                    "--proc",
                    "/proc",
                    "--dev",
                    "/dev",
                    "/bin/true",
                ]))
            })
        });
    }
    // `airlock` in the repo with only this user's HOME and `path`.
    let airlock_in_repo = |path: &str| {
        let mut cmd = Command::new(airlock);
        cmd.current_dir(&repo).env_clear().env("HOME", &home).env("PATH", path);
        cmd
    };
    g.bench_function("airlock_exec_true", |b| {
        b.iter(|| {
            run(airlock_in_repo("/usr/bin:/bin")
                .env("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
                .args(["exec", "--", "true"]))
        })
    });
    // `airlock run` with a stand-in agent named `claude` (a `#!/bin/sh` script that execs its
    // arguments) and a shared credential: adds resolution, the per-repo home (open, copy-in,
    // transcript snapshot; no identity, so no `.gitconfig`), its bind, and copy-back and the
    // transcript walk at the end.
    let fakebin = tmp.path().join("fakebin");
    std::fs::create_dir_all(&fakebin).expect("fakebin");
    let fake = fakebin.join("claude");
    std::fs::write(&fake, "#!/bin/sh\nexec \"$@\"\n").expect("fake agent");
    std::fs::set_permissions(
        &fake,
        <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o755),
    )
    .expect("chmod");
    std::fs::create_dir_all(home.join(".airlock/agent/claude/shared")).expect("shared");
    std::fs::write(
        home.join(".airlock/agent/claude/shared/.credentials.json"),
        r#"{"claudeAiOauth":{"accessToken":"a","refreshToken":"r","expiresAt":1}}"#,
    )
    .expect("credential");
    let fake_path = format!("{}:/usr/bin:/bin", fakebin.display());
    g.bench_function("airlock_run_agent_true", |b| {
        b.iter(|| {
            run(airlock_in_repo(&fake_path)
                .env("AIRLOCK_TEST_PROXY_BRIDGE", "hold")
                .args(["run", "claude", "--", "true"]))
        })
    });
    // The same through a warm airlockd (one-shot activation on the first call; the daemon
    // stays up for its idle timeout): session registration + proxy serving included.
    let sock = tmp.path().join("run/airlock.sock");
    g.bench_function("airlock_exec_true_warm_daemon", |b| {
        b.iter(|| {
            run(airlock_in_repo("/usr/bin:/bin")
                .env("AIRLOCK_SOCKET", &sock)
                .args(["exec", "--", "true"]))
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
