//! airlockd control-plane latency, as ratios against baselines measured in the same run:
//!
//! - cold start: connect to an idle activation socket → first `status` reply, i.e. exec of a
//!   fresh airlockd with the socket as fd 3, adoption, runtime start, hello, status. Baseline:
//!   the same fork/exec path running `/bin/true` to completion.
//! - warm status round trip on an open connection. Baseline: a length-prefixed frame of the same
//!   size echoed by a thread over a unix socket pair.
//!
//! `cargo bench --bench daemon` (results: docs/benchmarks/daemon.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::time::{Duration, Instant};

use airlock::client::Endpoint;
use airlock::env::MapEnv;
use airlock::sys::spawn::{ActivatedSpawn, Mode, spawn_activated};
use criterion::{Criterion, criterion_group, criterion_main};
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

const AIRLOCKD: &str = env!("CARGO_BIN_EXE_airlockd");

fn spawn(program: &Path, listener: &UnixListener, home: &Path) -> i32 {
    let env: Vec<(OsString, OsString)> = vec![("HOME".into(), home.into())];
    let args: Vec<OsString> = vec!["--idle-timeout".into(), "60s".into()];
    spawn_activated(&ActivatedSpawn {
        program,
        args: &args,
        env: &env,
        listener: listener.as_fd(),
        fd_name: "airlock",
        stderr: None,
        mode: Mode::Attached,
    })
    .unwrap()
    .unwrap()
}

fn bench(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::set_permissions(tmp.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .unwrap();
    let home = tmp.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let env = |sock: &Path| MapEnv::new().with("HOME", &home).with("AIRLOCK_SOCKET", sock);

    let mut g = c.benchmark_group("daemon_cold_start");
    g.sample_size(30).measurement_time(Duration::from_secs(10));
    g.bench_function("baseline_spawn_true", |b| {
        let sock = tmp.path().join("true.sock");
        let _ = std::fs::remove_file(&sock);
        let l = UnixListener::bind(&sock).unwrap();
        b.iter(|| {
            let pid = spawn(Path::new("/bin/true"), &l, &home);
            waitpid(Pid::from_raw(pid), None).unwrap();
        })
    });
    g.bench_function("airlockd_connect_to_first_status", |b| {
        let sock = tmp.path().join("cold.sock");
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let _ = std::fs::remove_file(&sock);
                let l = UnixListener::bind(&sock).unwrap();
                let endpoint = Endpoint::resolve(&env(&sock));
                let start = Instant::now();
                let pid = spawn(Path::new(AIRLOCKD), &l, &home);
                let status = endpoint.connect().unwrap().status().unwrap();
                total += start.elapsed();
                assert_eq!(status.pid as i32, pid);
                kill(Pid::from_raw(pid), Signal::SIGTERM).unwrap();
                waitpid(Pid::from_raw(pid), None).unwrap();
            }
            total
        })
    });
    g.finish();

    let mut g = c.benchmark_group("daemon_warm");
    let sock = tmp.path().join("warm.sock");
    let l = UnixListener::bind(&sock).unwrap();
    let pid = spawn(Path::new(AIRLOCKD), &l, &home);
    let mut client = Endpoint::resolve(&env(&sock)).connect().unwrap();
    let reply_len = airlock::protocol::encode(&airlock::protocol::Response::Status(Box::new(
        client.status().unwrap(),
    )))
    .unwrap()
    .len();
    g.bench_function("baseline_unix_frame_echo", |b| {
        let (mut a, mut peer) = UnixStream::pair().unwrap();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; reply_len];
            while peer.read_exact(&mut buf[..4]).is_ok() {
                if peer.write_all(&buf).is_err() {
                    break;
                }
            }
        });
        let mut buf = vec![0u8; reply_len];
        b.iter(|| {
            a.write_all(&[0, 0, 0, 1]).unwrap();
            a.read_exact(&mut buf).unwrap();
        })
    });
    g.bench_function("status_round_trip", |b| b.iter(|| client.status().unwrap()));
    g.finish();
    drop(client);
    kill(Pid::from_raw(pid), Signal::SIGTERM).unwrap();
    waitpid(Pid::from_raw(pid), None).unwrap();
}

criterion_group!(benches, bench);
criterion_main!(benches);
