//! Policy loaded once (issue 15): `airlock exec -- true` through a warm `airlockd` with a
//! 50,000-entry user policy against the same with a 3-entry policy, run in turn (3-entry,
//! 50,000-entry, 3-entry, …) so a drift in the machine's speed hits both alike; the figure is
//! the median of the per-pair ratios. Target: within 1.5×.
//!
//! Run: `cargo bench --bench policy_load` (`-- --pairs N`, default 40). Each policy has its own
//! HOME and its own one-shot daemon (activated by the first, unmeasured, run; it stays up for
//! its idle timeout), so after the warm-up both sides hold their policy by digest — what a
//! developer's second and later sessions see.

#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");

/// One world: a HOME with a user policy of `entries` entries and a repo.
struct World {
    home: PathBuf,
    repo: PathBuf,
    socket: PathBuf,
}

fn world(root: &Path, name: &str, entries: usize) -> World {
    let home = root.join(name).join("home");
    let repo = root.join(name).join("repo");
    std::fs::create_dir_all(home.join(".airlock")).expect("home");
    std::fs::create_dir_all(repo.join(".git")).expect("repo");
    // A mix of exact names, subtrees and ports, as a large corporate allowlist has.
    let mut policy = String::from("[network]\nallow = [\n");
    for i in 0..entries {
        policy.push_str(&match i % 3 {
            0 => format!("\"h{i}.ex.test\",\n"),
            1 => format!("\"*.s{i}.corp\",\n"),
            _ => format!("\"=a{i}.v.test:8443\",\n"),
        });
    }
    policy.push_str("]\n");
    std::fs::write(home.join(".airlock/config.toml"), policy).expect("config");
    let socket = root.join(name).join("run/airlock.sock");
    World { home, repo, socket }
}

fn exec_true(w: &World) -> Duration {
    let start = Instant::now();
    let status = Command::new(AIRLOCK)
        .current_dir(&w.repo)
        .env_clear()
        .env("HOME", &w.home)
        .env("PATH", "/usr/bin:/bin")
        .env("AIRLOCK_SOCKET", &w.socket)
        .args(["exec", "--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("spawn airlock");
    let took = start.elapsed();
    assert!(status.success(), "airlock exec -- true failed: {status}");
    took
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let mut pairs = 40;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        if a == "--pairs" {
            pairs = args.next().and_then(|n| n.parse().ok()).expect("--pairs N");
        }
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let small = world(tmp.path(), "small", 3);
    let large = world(tmp.path(), "large", 50_000);
    // Warm-up: activates each daemon and fills both caches.
    for _ in 0..3 {
        exec_true(&small);
        exec_true(&large);
    }
    let (mut s, mut l, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..pairs {
        let a = exec_true(&small).as_secs_f64() * 1e3;
        let b = exec_true(&large).as_secs_f64() * 1e3;
        s.push(a);
        l.push(b);
        ratio.push(b / a);
    }
    println!(
        "exec -- true, warm daemon, {pairs} interleaved pairs: 3 entries p50 {:.2} ms, 50,000 entries p50 {:.2} ms, median pair ratio {:.2}x",
        median(&mut s),
        median(&mut l),
        median(&mut ratio)
    );
}
