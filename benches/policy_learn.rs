//! `airlock policy learn` over 1,000,000 audit lines (issue 20: ≤ 2 s). The harness writes a
//! realistic log into a temporary HOME — 10 sessions of 100,000 lines each over two date files:
//! allowed tunnels to a few dozen hosts (most lines), refusals of a few hundred hosts across
//! many registrable domains (some on odd ports, some blocked, some private), DNS lines,
//! `suppressed` summaries and a few malformed lines — then times the real release binary:
//!
//! - `--since 30days`: every line parsed (the worst case);
//! - `--session ID` (the default selection's path): one session's lines parsed, the rest
//!   skipped by a substring check;
//! - `cat` of the same files to `/dev/null`, in the same run, as the floor (reading the bytes).
//!
//! Run: `cargo bench --bench policy_learn` (`-- --runs N`, default 5; medians reported).
//! Nothing is written to the policy (no `--yes`) and no network is used.

#![allow(clippy::expect_used)]

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");
const LINES: usize = 1_000_000;
const SESSIONS: usize = 10;

fn line(out: &mut String, i: usize, session: &str, ts: &str) {
    let seq = i % (LINES / SESSIONS) + 1;
    let common = format!(
        r#""repo":"bench","id":"{session}-b1-{seq}","session":"{session}","boot":"b1","seq":{seq},"user_id":"u_5f0c2a91d3e84b17","repo_path":"/src/bench","repo_key":"bench-1a2b3c4d""#
    );
    match i % 100 {
        // Allowed tunnels (most of a real session's lines).
        0..=79 => {
            let host = [
                "api.anthropic.com",
                "github.com",
                "objects.githubusercontent.com",
                "pypi.org",
                "files.pythonhosted.org",
            ][i % 5];
            let _ = write!(
                out,
                r#"{{"ts":"{ts}","host":"{host}","method":"CONNECT","allowed":true,"bytes_sent":{},"bytes_recv":{},"duration_ms":{},{common},"port":443,"addr":"127.0.0.2:443","reason":"allowed","layer":"repo","policy":"/src/bench/.airlock.toml","rule":"{host}"}}"#,
                1000 + i % 5000,
                20000 + i % 90000,
                i % 3000
            );
        }
        // Refusals: many hosts over many domains, some on other ports.
        80..=91 => {
            let port = if i.is_multiple_of(7) { 8443 } else { 443 };
            let _ = write!(
                out,
                r#"{{"ts":"{ts}","host":"h{}.d{}.example","method":"CONNECT","allowed":false,"duration_ms":0,{common},"port":{port},"reason":"not_allowed","layer":"none"}}"#,
                i % 7,
                i % 53
            );
        }
        92..=93 => {
            let _ = write!(
                out,
                r#"{{"ts":"{ts}","host":"pastebin.com","method":"CONNECT","allowed":false,"duration_ms":0,{common},"port":443,"reason":"blocked","layer":"repo","policy":"/src/bench/.airlock.toml","rule":"pastebin.com"}}"#
            );
        }
        94 => {
            let _ = write!(
                out,
                r#"{{"ts":"{ts}","host":"db.internal.example","method":"CONNECT","allowed":false,"duration_ms":0,{common},"port":5432,"reason":"private_address","layer":"none","refused_addrs":["10.0.{}.5"]}}"#,
                i % 4
            );
        }
        95..=97 => {
            let _ = write!(
                out,
                r#"{{"ts":"{ts}","host":"n{}.dns{}.example","method":"DNS","allowed":false,"duration_ms":0,{common},"reason":"not_allowed","layer":"none","qtype":"A","answer":"NXDOMAIN"}}"#,
                i % 3,
                i % 11
            );
        }
        98 => {
            let _ = write!(
                out,
                r#"{{"ts":"{ts}","host":"flood.example","method":"CONNECT","allowed":false,"duration_ms":0,{common},"port":443,"reason":"not_allowed","layer":"none","seqs":[[{seq},{}]],"count":50}}"#,
                seq + 49
            );
        }
        // A torn or hand-edited line now and then.
        _ if i % 10_000 == 99 => out.push_str(r#"{"ts":"2026-01-01T00:00:00.000Z","host":"tor"#),
        _ => {
            let _ = write!(
                out,
                r#"{{"ts":"{ts}","host":"api.anthropic.com","method":"CONNECT","allowed":true,"bytes_sent":1,"bytes_recv":2,"duration_ms":3,{common},"port":443,"reason":"allowed","layer":"repo","rule":"anthropic.com"}}"#
            );
        }
    }
    out.push('\n');
}

fn populate(home: &Path) -> (PathBuf, Vec<PathBuf>, u64) {
    let dir = home.join(".airlock/logs/bench");
    std::fs::create_dir_all(&dir).expect("log dir");
    let now = time::OffsetDateTime::now_utc();
    let days = [now - time::Duration::days(1), now];
    let mut files = Vec::new();
    let mut bytes = 0u64;
    let mut sessions = String::new();
    for (d, day) in days.iter().enumerate() {
        let date = format!("{:04}-{:02}-{:02}", day.year(), u8::from(day.month()), day.day());
        let path = dir.join(format!("audit-{date}.jsonl"));
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).expect("audit file"));
        let mut buf = String::with_capacity(1 << 20);
        let per_day = LINES / days.len();
        for i in d * per_day..(d + 1) * per_day {
            let s = i / (LINES / SESSIONS);
            let session = format!("sess-{s:02}");
            let ts = format!(
                "{date}T{:02}:{:02}:{:02}.{:03}Z",
                (i / 3_600_000) % 24,
                (i / 60_000) % 60,
                (i / 1000) % 60,
                i % 1000
            );
            if i % (LINES / SESSIONS) == 0 {
                let _ = writeln!(
                    sessions,
                    r#"{{"id":"{session}:start","kind":"start","session":"{session}","ts":"{ts}","repo":"bench"}}"#
                );
            }
            line(&mut buf, i, &session, &ts);
            if buf.len() > (1 << 20) - 4096 {
                f.write_all(buf.as_bytes()).expect("write");
                bytes += buf.len() as u64;
                buf.clear();
            }
        }
        f.write_all(buf.as_bytes()).expect("write");
        bytes += buf.len() as u64;
        f.flush().expect("flush");
        files.push(path);
    }
    std::fs::write(
        dir.join(format!("sessions-{}.jsonl", {
            let day = days[1];
            format!("{:04}-{:02}-{:02}", day.year(), u8::from(day.month()), day.day())
        })),
        sessions,
    )
    .expect("sessions");
    (dir, files, bytes)
}

fn timed(mut cmd: Command) -> Duration {
    let start = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("spawn");
    let took = start.elapsed();
    assert!(out.status.success(), "{:?}: {}", cmd, String::from_utf8_lossy(&out.stderr));
    took
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let runs: usize = std::env::args()
        .skip_while(|a| a != "--runs")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(5);
    let root = tempfile::tempdir().expect("tempdir");
    let home = root.path().join("home");
    let repo = root.path().join("bench");
    std::fs::create_dir_all(repo.join(".git")).expect("repo");
    std::fs::write(repo.join(".airlock.toml"), "[network]\nallow = [\"anthropic.com\", \"github.com\", \"githubusercontent.com\", \"pypi.org\", \"pythonhosted.org\"]\nblock = [\"pastebin.com\"]\n").expect("policy");
    let t = Instant::now();
    let (_dir, files, bytes) = populate(&home);
    eprintln!("wrote {LINES} lines ({:.1} MB) in {:.1?}", bytes as f64 / 1e6, t.elapsed());
    let learn = |args: &[&str]| {
        let mut c = Command::new(AIRLOCK);
        c.current_dir(&repo).env_clear().env("HOME", &home).env("PATH", "/usr/bin:/bin");
        c.args(["policy", "learn"]).args(args);
        c
    };
    let cat = || {
        let mut c = Command::new("cat");
        c.args(&files).stdout(Stdio::null());
        c
    };
    // Once unmeasured: page cache warm for every side alike.
    timed(learn(&["--since", "30days"]));
    let (mut all, mut one, mut floor) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..runs {
        floor.push(timed(cat()));
        all.push(timed(learn(&["--since", "30days"])));
        one.push(timed(learn(&["--session", "sess-09"])));
    }
    let (all, one, floor) = (median(all), median(one), median(floor));
    println!(
        "policy learn over {LINES} lines ({:.1} MB), median of {runs} runs:",
        bytes as f64 / 1e6
    );
    println!(
        "  --since 30days (every line parsed): {:>8.1?}  ({:.1}x cat)",
        all,
        all.as_secs_f64() / floor.as_secs_f64()
    );
    println!(
        "  --session sess-09 (one session):    {:>8.1?}  ({:.1}x cat)",
        one,
        one.as_secs_f64() / floor.as_secs_f64()
    );
    println!("  cat of the same files (floor):      {:>8.1?}", floor);
    println!("  target <= 2 s: {}", if all <= Duration::from_secs(2) { "met" } else { "MISSED" });
}
