//! Hold-and-resume of a gate decided on a review server (issue 18), end to end with the real
//! binaries: a sandboxed curl's CONNECT to a gated target is held by airlockd, relayed by the
//! session's supervisor to a real `airlockd review` (embedded store), approved there by an
//! automatic approver (a reviewer's token polling `GET /api/v1/gates?state=pending` and
//! posting `approve`), handed back to airlockd, and let through — against the same CONNECT to
//! an ungated target of the same upstream, alternating in one session. Everything is on
//! 127.0.0.0/8; the test resolver maps the names (hence `test-hooks`).
//!
//! Run: `cargo bench --features test-hooks --bench gate_server` (`-- --quick`: 20 pairs).
//! Measured: curl's `time_total` inside the sandbox (connect to the proxy, CONNECT, the held
//! wait, the tunnel, one HTTP exchange with the upstream, close). Targets: ≤ 1 s more than the
//! ungated attempt at p50, ≤ 2 s at p99.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const AIRLOCK: &str = env!("CARGO_BIN_EXE_airlock");
const AIRLOCKD: &str = env!("CARGO_BIN_EXE_airlockd");

fn upstream(ip: &str) -> u16 {
    let l = TcpListener::bind((ip, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = c.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n",
                );
            });
        }
    });
    port
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// One HTTP/1.1 exchange on a fresh loopback connection: (status, body).
fn http(port: u16, method: &str, path: &str, token: &str, body: Option<&str>) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
    (status, body)
}

fn airlockd(home: &Path, args: &[&str]) -> String {
    let out = Command::new(AIRLOCKD)
        .env_clear()
        .env("HOME", home)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "airlockd {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let pairs = if quick { 20 } else { 200 };
    let tmp = tempfile::tempdir().unwrap();
    let home = tmp.path().join("home");
    let repo = tmp.path().join("bench");
    std::fs::create_dir_all(home.join(".airlock")).unwrap();
    std::fs::create_dir_all(repo.join(".git")).unwrap();
    let ip = "127.0.0.21";
    let port = upstream(ip);
    std::fs::write(tmp.path().join("resolver"), format!("gated.test {ip}\nplain.test {ip}\n"))
        .unwrap();
    std::fs::write(
        home.join(".airlock/config.toml"),
        format!(
            "[network]\nallow = [\"gated.test:{port}\", \"plain.test:{port}\"]\n\
             allow_private = [\"{ip}/32\"]\n[gate]\nhosts = [\"=gated.test:{port}\"]\n"
        ),
    )
    .unwrap();

    // The review server: an embedded store with the developer and a reviewer.
    let store = tmp.path().join("store");
    let store_arg = store.display().to_string();
    airlockd(&home, &["review", "init", "--admin", "admin@bench.test", "--data-dir", &store_arg]);
    let add = |email: &str, role: &str| {
        airlockd(
            &home,
            &["admin", "user", "add", "--email", email, "--role", role, "--data-dir", &store_arg],
        );
        airlockd(&home, &["admin", "token", "create", "--user", email, "--data-dir", &store_arg])
    };
    let dev = add("dev@bench.test", "member");
    let rev = add("rev@bench.test", "reviewer");
    let review_port = free_port();
    let mut server = Command::new(AIRLOCKD)
        .env_clear()
        .env("HOME", &home)
        .args(["review", "--listen", &format!("127.0.0.1:{review_port}"), "--data-dir", &store_arg])
        // The approver polls every 2 ms: far above the per-token rate limit, which is tested
        // elsewhere (tests/it/review_limits.rs) and would only add its waits here.
        .args(["--rate-limit-per-token", "100000", "--rate-limit-burst", "100000"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let up = Instant::now();
    while TcpStream::connect(("127.0.0.1", review_port)).is_err() {
        assert!(up.elapsed() < Duration::from_secs(30), "the review server did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let base = format!("http://127.0.0.1:{review_port}");
    let mut login = Command::new(AIRLOCK)
        .env_clear()
        .env("HOME", &home)
        .args(["login", "--server", &base, "--token-stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    login.stdin.take().unwrap().write_all(format!("{dev}\n").as_bytes()).unwrap();
    assert!(login.wait().unwrap().success(), "airlock login");

    // The automatic approver: approves every pending gate the moment it sees it.
    let stop = Arc::new(AtomicBool::new(false));
    let approved = Arc::new(AtomicUsize::new(0));
    let approver = {
        let (stop, approved, rev) = (Arc::clone(&stop), Arc::clone(&approved), rev.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let (status, body) =
                    http(review_port, "GET", "/api/v1/gates?state=pending", &rev, None);
                if status == 200 {
                    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
                    for g in v["gates"].as_array().into_iter().flatten() {
                        let id = g["id"].as_str().unwrap();
                        let decision =
                            serde_json::json!({"action": "approve", "digest": g["digest"]});
                        let path = format!("/api/v1/gates/{id}");
                        let (s, _) =
                            http(review_port, "POST", &path, &rev, Some(&decision.to_string()));
                        if s == 200 {
                            approved.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };

    // One session: pairs of an ungated and a gated attempt, alternating.
    let each = "-sS -o /dev/null -w '%{http_connect} %{time_total}\\n' -m 30 -p";
    let script = format!(
        "i=0; while [ $i -lt {pairs} ]; do \
           printf 'u '; curl {each} http://plain.test:{port}/; \
           printf 'g '; curl {each} http://gated.test:{port}/; \
           i=$((i+1)); done"
    );
    let sock_dir = tmp.path().join("run");
    std::fs::create_dir_all(&sock_dir).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&sock_dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    let started = Instant::now();
    let out = Command::new(AIRLOCK)
        .current_dir(&repo)
        .env_clear()
        .env("HOME", &home)
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("AIRLOCK_SOCKET", sock_dir.join("airlock.sock"))
        .env("AIRLOCK_TEST_RESOLVER", tmp.path().join("resolver"))
        .args(["exec", "--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    approver.join().unwrap();
    let _ = server.kill();
    let _ = server.wait();
    assert!(out.status.success(), "airlock exec: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let (mut ungated, mut gated) = (Vec::new(), Vec::new());
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (kind, code, t) = (parts.next().unwrap(), parts.next().unwrap(), parts.next().unwrap());
        assert_eq!(code, "200", "an attempt was refused: {text}");
        let ms = t.parse::<f64>().unwrap() * 1000.0;
        if kind == "u" { ungated.push(ms) } else { gated.push(ms) }
    }
    assert_eq!((ungated.len(), gated.len()), (pairs, pairs), "{text}");
    assert_eq!(approved.load(Ordering::Relaxed), pairs, "every gated attempt was approved");
    let mut deltas: Vec<f64> = gated.iter().zip(&ungated).map(|(g, u)| g - u).collect();
    ungated.sort_by(f64::total_cmp);
    gated.sort_by(f64::total_cmp);
    deltas.sort_by(f64::total_cmp);
    println!(
        "gate decided on a review server, {pairs} paired CONNECTs in one sandbox session ({:.1} s):",
        took.as_secs_f64()
    );
    println!(
        "  ungated  p50 {:8.2} ms  p99 {:8.2} ms",
        percentile(&ungated, 0.5),
        percentile(&ungated, 0.99)
    );
    println!(
        "  gated    p50 {:8.2} ms  p99 {:8.2} ms",
        percentile(&gated, 0.5),
        percentile(&gated, 0.99)
    );
    println!(
        "  added    p50 {:+8.2} ms  p99 {:+8.2} ms  (targets: +1000 ms p50, +2000 ms p99)",
        percentile(&gated, 0.5) - percentile(&ungated, 0.5),
        percentile(&gated, 0.99) - percentile(&ungated, 0.99)
    );
    println!(
        "  per-pair added  p50 {:+8.2} ms  p99 {:+8.2} ms",
        percentile(&deltas, 0.5),
        percentile(&deltas, 0.99)
    );
}
