//! Issue 22's floor: `airlock exec -- true` against `bwrap --unshare-all --ro-bind / / true`
//! (and bare `true`, `unshare -Urn true`), whole commands run interleaved in one process so
//! load drift hits every row alike; prints each row's median wall time and the **median of
//! the per-round ratios** against bwrap (target ≤ 1.2×) and, for the cold row (a fresh socket
//! every run, so every run activates a new `airlockd`), against the warm row (target ≤ 2×).
//!
//! Run: `cargo bench --bench exec_floor` (as root and as an unprivileged user: the binary
//! takes `AIRLOCK_BIN` to point at an `airlock` that user can run; `airlockd` must sit beside
//! it). `EXEC_FLOOR_BASELINE_BIN` adds a row for a second build (e.g. the commit before a
//! change) with its own warm daemon, and the median pair ratio of this build against it, so a
//! before/after comparison is made in one run. Knobs: `EXEC_FLOOR_RUNS`
//! (rounds, default 60), `EXEC_FLOOR_COLD_RUNS` (default 15). Without `bwrap` installed
//! (`apt-get install bubblewrap`) its row is skipped and the ratio is given against
//! `unshare -Urn` only.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn on_path(tool: &str) -> Option<PathBuf> {
    ["/usr/bin", "/bin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.exists())
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Wall time of one run (spawn to reaped); the command must succeed.
fn time(cmd: &mut Command) -> Duration {
    let t = Instant::now();
    let status = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status();
    let d = t.elapsed();
    assert!(status.as_ref().is_ok_and(|s| s.success()), "benchmark command failed: {cmd:?}");
    d
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

struct Row {
    name: &'static str,
    make: Box<dyn Fn() -> Command>,
    ms: Vec<f64>,
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported (few rows).
    let runs = env_usize("EXEC_FLOOR_RUNS", 60);
    let cold_runs = env_usize("EXEC_FLOOR_COLD_RUNS", 15);
    let airlock = std::env::var_os("AIRLOCK_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_airlock")));
    let tmp = tempfile::tempdir().expect("tempdir");
    let home = tmp.path().join("home");
    let repo = tmp.path().join("bench");
    let run_dir = tmp.path().join("run");
    std::fs::create_dir_all(home.join(".airlock")).expect("home");
    std::fs::create_dir_all(repo.join(".git")).expect("repo");
    std::fs::create_dir_all(&run_dir).expect("run dir");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&run_dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    std::fs::write(home.join(".airlock/config.toml"), "[network]\nallow = [\"example.test\"]\n")
        .expect("config");

    let exec_in = {
        let (airlock, repo, home) = (airlock.clone(), repo.clone(), home.clone());
        move |sock: &Path| {
            let mut cmd = Command::new(&airlock);
            cmd.current_dir(&repo)
                .env_clear()
                .env("HOME", &home)
                .env("PATH", "/usr/bin:/bin")
                .env("AIRLOCK_SOCKET", sock)
                .args(["exec", "--", "true"]);
            cmd
        }
    };
    let mut rows: Vec<Row> = Vec::new();
    rows.push(Row { name: "/bin/true", make: Box::new(|| Command::new("/bin/true")), ms: vec![] });
    if let Some(unshare) = on_path("unshare") {
        rows.push(Row {
            name: "unshare -Urn true",
            make: Box::new(move || {
                let mut c = Command::new(&unshare);
                c.args(["-Urn", "true"]);
                c
            }),
            ms: vec![],
        });
    }
    let bwrap = on_path("bwrap");
    match &bwrap {
        Some(bwrap) => {
            let bwrap = bwrap.clone();
            rows.push(Row {
                name: "bwrap --unshare-all --ro-bind / / true",
                make: Box::new(move || {
                    let mut c = Command::new(&bwrap);
                    c.args(["--unshare-all", "--ro-bind", "/", "/", "true"]);
                    c
                }),
                ms: vec![],
            });
        }
        None => eprintln!(
            "exec_floor: bwrap is not installed (apt-get install bubblewrap): its row and the \
             ratio against it are skipped"
        ),
    }
    let warm_sock = run_dir.join("airlock.sock");
    {
        let exec_in = exec_in.clone();
        rows.push(Row {
            name: "airlock exec -- true (warm airlockd)",
            make: Box::new(move || exec_in(&warm_sock)),
            ms: vec![],
        });
    }
    let baseline = std::env::var_os("EXEC_FLOOR_BASELINE_BIN").map(PathBuf::from);
    if let Some(base) = &baseline {
        let (base, repo, home) = (base.clone(), repo.clone(), home.clone());
        let dir = tmp.path().join("run-baseline");
        std::fs::create_dir_all(&dir).expect("baseline run dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let sock = dir.join("airlock.sock");
        rows.push(Row {
            name: "airlock exec -- true (baseline build, warm)",
            make: Box::new(move || {
                let mut cmd = Command::new(&base);
                cmd.current_dir(&repo)
                    .env_clear()
                    .env("HOME", &home)
                    .env("PATH", "/usr/bin:/bin")
                    .env("AIRLOCK_SOCKET", &sock)
                    .args(["exec", "--", "true"]);
                cmd
            }),
            ms: vec![],
        });
    }
    // Warm-up: activates the warm daemon and pages everything in.
    for _ in 0..3 {
        for row in &rows {
            time(&mut (row.make)());
        }
    }
    println!("exec_floor: {runs} interleaved rounds, load before: {}", load());
    let airlock_row =
        rows.iter().position(|r| r.name.starts_with("airlock exec -- true (warm")).expect("row");
    let base_row = rows.iter().position(|r| r.name.contains("baseline"));
    let mut ratios_base = Vec::new();
    let mut ratios_bwrap = Vec::new();
    let mut ratios_unshare = Vec::new();
    for i in 0..runs {
        let n = rows.len();
        let mut this = vec![0.0; n];
        // Rotate the order each round so no row always runs right after another.
        for k in 0..n {
            let r = (i + k) % n;
            this[r] = time(&mut (rows[r].make)()).as_secs_f64() * 1e3;
        }
        for (row, ms) in rows.iter_mut().zip(&this) {
            row.ms.push(*ms);
        }
        if let Some(b) = rows.iter().position(|r| r.name.starts_with("bwrap")) {
            ratios_bwrap.push(this[airlock_row] / this[b]);
        }
        if let Some(u) = rows.iter().position(|r| r.name.starts_with("unshare")) {
            ratios_unshare.push(this[airlock_row] / this[u]);
        }
        if let Some(b) = base_row {
            ratios_base.push(this[airlock_row] / this[b]);
        }
    }
    // Cold: a fresh socket path (and so a freshly activated daemon) every run, paired with a
    // warm run right after.
    let mut cold = Vec::new();
    let mut cold_vs_warm = Vec::new();
    let mut cold_socks = Vec::new();
    for i in 0..cold_runs {
        let dir = tmp.path().join(format!("cold{i}"));
        std::fs::create_dir_all(&dir).expect("cold dir");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let sock = dir.join("airlock.sock");
        // A short idle timeout: the activated daemon goes away soon after its session.
        let mut cmd = exec_in(&sock);
        cmd.env("AIRLOCK_IDLE_TIMEOUT", "2s");
        let c = time(&mut cmd).as_secs_f64() * 1e3;
        let w = time(&mut (rows[airlock_row].make)()).as_secs_f64() * 1e3;
        cold.push(c);
        cold_vs_warm.push(c / w);
        cold_socks.push(sock);
    }
    println!("load after: {}", load());
    println!("{:<44} {:>10} {:>10}", "row", "median ms", "p90 ms");
    for row in &mut rows {
        let mut v = row.ms.clone();
        v.sort_by(f64::total_cmp);
        let p90 = v.get(v.len() * 9 / 10).copied().unwrap_or(f64::NAN);
        println!("{:<44} {:>10.2} {:>10.2}", row.name, median(&mut row.ms), p90);
    }
    if !cold.is_empty() {
        println!("{:<44} {:>10.2}", "airlock exec -- true (cold: new airlockd)", median(&mut cold));
    }
    if bwrap.is_some() {
        println!(
            "median pair ratio airlock exec / bwrap:   {:.2}x (target <= 1.2x)",
            median(&mut ratios_bwrap)
        );
    }
    if !ratios_unshare.is_empty() {
        println!("median pair ratio airlock exec / unshare: {:.2}x", median(&mut ratios_unshare));
    }
    if !ratios_base.is_empty() {
        println!("median pair ratio this build / baseline:  {:.2}x", median(&mut ratios_base));
    }
    if !cold_vs_warm.is_empty() {
        println!(
            "median pair ratio cold / warm:            {:.2}x (target <= 2x)",
            median(&mut cold_vs_warm)
        );
    }
    // The cold daemons exit after their 2 s idle timeout; the warm one after the default.
    drop(cold_socks);
}
