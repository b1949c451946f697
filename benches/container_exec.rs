//! Issue 21's benchmark: `airlock exec --backend podman -- true` against a same-run pair of
//! `podman run`s doing the same work by hand (a proxy container running `airlockd proxy
//! --layers`, waited for through its ready file, then the sandbox container with the session's
//! hardening flags and binds, then `podman stop -t 7` of the proxy), plus one bare `podman run
//! --rm --network none` for reference. Target: ≤ 1.3× the pair (median of per-round ratios).
//!
//! This driver only finds the binaries and runs
//! `tests/containers/sealed.sh <tmp workdir> podman -- benches/support/container_exec.sh
//! AIRLOCK AIRLOCKD`, streaming its output: the engine lives only in a fresh network namespace
//! with no uplink, and the measuring (interleaved rounds, medians, the per-command breakdown)
//! is the script's. Needs root and podman (prints SKIP and exits 0 otherwise).
//!
//! Run: `cargo build --release && cargo bench --bench container_exec`. Binaries: `AIRLOCK_BIN`
//! and `AIRLOCKD_BIN` (default: the `airlock` Cargo built for this bench, and `airlockd` beside
//! it). Knobs (passed through): `BENCH_ROUNDS` (default 20), `BENCH_TRACE_RUNS` (default 5);
//! `BENCH_WORKDIR` keeps the engine's image store between runs (default: a fresh temporary
//! directory, so the images are imported again each run).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn on_path(tool: &str) -> Option<PathBuf> {
    ["/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.exists())
}

fn main() {
    // `cargo bench` passes `--bench`; there are no filters (one scenario).
    if !nix::unistd::geteuid().is_root() {
        println!("container_exec: SKIP (needs root: sealed.sh unshares a network namespace)");
        return;
    }
    if on_path("podman").is_none() {
        println!("container_exec: SKIP (podman is not installed)");
        return;
    }
    let airlock = std::env::var_os("AIRLOCK_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_airlock")));
    let airlockd = std::env::var_os("AIRLOCKD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| airlock.with_file_name("airlockd"));
    for bin in [&airlock, &airlockd] {
        assert!(
            bin.exists(),
            "{} not found (build it, or set AIRLOCK_BIN/AIRLOCKD_BIN)",
            bin.display()
        );
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // sealed.sh refuses work directories under /run and a few engine paths; /tmp is fine.
    let tmp = tempfile::Builder::new().prefix("airlock-bench-ct.").tempdir_in("/tmp").expect("tmp");
    let workdir = std::env::var_os("BENCH_WORKDIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tmp.path().to_path_buf());
    println!(
        "container_exec: airlock {}, airlockd {}, engine work directory {}",
        airlock.display(),
        airlockd.display(),
        workdir.display()
    );
    let status = Command::new(root.join("tests/containers/sealed.sh"))
        .arg(&workdir)
        .args(["podman", "--"])
        .arg(root.join("benches/support/container_exec.sh"))
        .arg(&airlock)
        .arg(&airlockd)
        .status()
        .expect("run tests/containers/sealed.sh");
    assert!(status.success(), "container_exec.sh failed: {status}");
}
