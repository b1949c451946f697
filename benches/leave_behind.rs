//! Cost of what a session leaves behind (SECURITY §7, issue 11) on a repo of 10,000 files in
//! 200 directories: the start scan (`protect::scan`: listed paths, and every git dir of the
//! repo found with one `getdents` per directory) and the end-of-session sweep (`sweep::run`),
//! against a plain recursive `read_dir` + `symlink_metadata` walk of the same tree (what
//! `find` does) in the same run, so the ratio survives a noisy machine. Issue 22's target is
//! ≤ 2 µs per entry for the end scan.
//!
//! Run: `cargo bench --bench leave_behind`.

#![allow(clippy::expect_used)]

use std::path::Path;
use std::time::Duration;

use airlock::sandbox::{gitptr, protect, quarantine, sweep};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

const DIRS: usize = 200;
const FILES_PER_DIR: usize = 50;

fn plain_walk(dir: &Path) -> u64 {
    let mut n = 0;
    for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
        n += 1;
        let meta = std::fs::symlink_metadata(entry.path()).expect("stat");
        if meta.is_dir() {
            n += plain_walk(&entry.path());
        }
    }
    n
}

fn bench(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let root = std::fs::canonicalize(tmp.path()).expect("canonical");
    let repo = root.join("repo");
    std::fs::create_dir_all(repo.join(".git/hooks")).expect("repo");
    std::fs::write(repo.join(".git/config"), "[core]\n\trepositoryformatversion = 0\n")
        .expect("config");
    for d in 0..DIRS {
        let dir = repo.join(format!("src/m{d:03}"));
        std::fs::create_dir_all(&dir).expect("dir");
        for f in 0..FILES_PER_DIR {
            std::fs::write(dir.join(format!("f{f:02}.rs")), "fn main() {}\n").expect("file");
        }
    }
    let entries = plain_walk(&repo);
    let rules = airlock::hostpath::HostPathRules::new(
        &root.join("home"),
        &root.join("home/.airlock"),
        &root.join("sock"),
        None,
        &[],
    );
    let found = gitptr::discover(&repo, &rules).expect("pointers");
    let prot = protect::scan(&repo, &found, &[]).expect("scan");
    // Nothing changed since "the start" (an hour from now): the sweep's steady-state cost is
    // the walk itself.
    let now = sweep::threshold(&[]).since;
    let since = (now.0 + 3600, now.1);

    let mut g = c.benchmark_group("end_of_session_sweep");
    g.throughput(Throughput::Elements(entries));
    g.sample_size(30).measurement_time(Duration::from_secs(10));
    g.bench_function("plain_read_dir_walk", |b| b.iter(|| plain_walk(&repo)));
    g.bench_function("start_scan", |b| {
        b.iter(|| protect::scan(&repo, &found, &[]).expect("scan").listed.len())
    });
    g.bench_function("sweep_run", |b| {
        b.iter(|| {
            let mut store = quarantine::Store::new(root.join("q"), "s", &repo);
            let report = sweep::run(
                &sweep::Sweep { repo: &repo, prot: &prot, home: None, since },
                &mut store,
            );
            assert!(report.items.is_empty());
            report.entries
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
