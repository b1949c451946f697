//! Audit write path cost, as ratios against raw `write(2)` of the same bytes in the same run:
//! a denial line (stamp + encode + one write), an allowed attempt (journal open + audit line +
//! close marker: three writes), a hostile line that needs capping, and the baselines.
//!
//! `cargo bench --bench audit` (results: docs/benchmarks/audit.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::OpenOptions;
use std::hint::black_box;
use std::io::Write;

use airlock::audit::{AuditSink, FileAuditSink, SessionInfo, encode_line};
use airlock::policy::{LayerKind, Reason};
use criterion::{Criterion, criterion_group, criterion_main};

fn bench(c: &mut Criterion) {
    let tmp = tempfile::tempdir().unwrap();
    let info = SessionInfo {
        session: "0123456789abcdef0123456789abcdef".into(),
        repo: "some-repo".into(),
        repo_path: Some("/home/dev/src/some-repo".into()),
        repo_key: None,
        user_id: Some("41f0c2aa41f0c2aa".into()),
    };
    let sink = FileAuditSink::open(tmp.path().join("logs"), "bench-boot", info).unwrap();
    let mut deny = sink.line("pastebin.com", Some(443), "CONNECT");
    deny.reason = Some(Reason::NotAllowed);
    deny.layer = Some(LayerKind::None);
    deny.duration_ms = Some(0);
    let bytes = encode_line(&deny).unwrap();
    let raw = OpenOptions::new().append(true).create(true).open(tmp.path().join("raw")).unwrap();

    let mut g = c.benchmark_group("audit");
    g.bench_function("baseline_raw_write", |b| {
        b.iter(|| assert_eq!((&raw).write(black_box(&bytes)).unwrap(), bytes.len()))
    });
    g.bench_function("baseline_raw_write_x3", |b| {
        b.iter(|| {
            for _ in 0..3 {
                assert_eq!((&raw).write(black_box(&bytes)).unwrap(), bytes.len());
            }
        })
    });
    g.bench_function("denial_line", |b| {
        b.iter(|| {
            let mut l = sink.line("pastebin.com", Some(443), "CONNECT");
            l.reason = Some(Reason::NotAllowed);
            l.layer = Some(LayerKind::None);
            l.duration_ms = Some(0);
            sink.append(black_box(&l)).unwrap();
        })
    });
    g.bench_function("allowed_open_close", |b| {
        b.iter(|| {
            let mut l = sink.line("api.anthropic.com", Some(443), "CONNECT");
            l.allowed = true;
            l.reason = Some(Reason::Allowed);
            l.layer = Some(LayerKind::Repo);
            sink.journal_open(&l).unwrap();
            l.bytes_sent = Some(18204);
            l.bytes_recv = Some(91544);
            l.duration_ms = Some(2311);
            l.addr = Some("127.0.0.2:443".into());
            sink.journal_close(black_box(&l)).unwrap();
        })
    });
    let hostile = format!("{}\"\\", "\u{1b}a".repeat(2000));
    g.bench_function("hostile_denial_line", |b| {
        b.iter(|| {
            let mut l = sink.line(&hostile, Some(443), "CONNECT");
            l.url = Some(hostile.clone());
            l.reason = Some(Reason::Malformed);
            sink.append(black_box(&l)).unwrap();
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
