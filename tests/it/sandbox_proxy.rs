//! `airlock exec` with the real `airlockd` (through the activation harness): the sandbox's only
//! way out is the proxy, which allows what the policy allows and refuses the rest with a 403
//! naming the host, writing an attributed audit line for each attempt. Upstreams are loopback
//! servers of the test's own; the test resolver maps test names to them.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;

use crate::harness::{Harness, Options};
use crate::support::{World, have};

/// An HTTP server on `ip` answering every request with `body` (its port).
fn http_upstream(ip: &str, body: &'static str) -> u16 {
    crate::support::http_upstream(ip, body).0
}

/// A static file server on `ip` for `root` (git's dumb HTTP protocol needs nothing more).
fn file_server(ip: &str, root: std::path::PathBuf) -> u16 {
    let l = TcpListener::bind((ip, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            let root = root.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 8192];
                let n = c.read(&mut buf).unwrap_or(0);
                let req = String::from_utf8_lossy(&buf[..n]).into_owned();
                // Absolute-form (through a proxy) or origin-form request targets.
                let target = req.split(' ').nth(1).unwrap_or("/");
                let path = target
                    .split_once("://")
                    .map_or(target, |(_, rest)| rest.find('/').map_or("/", |i| &rest[i..]));
                let path = path.split('?').next().unwrap_or("/");
                let file = root.join(path.trim_start_matches('/'));
                match (path.contains(".."), std::fs::read(&file)) {
                    (false, Ok(body)) => {
                        let _ = write!(
                            c,
                            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                            body.len()
                        );
                        let _ = c.write_all(&body);
                    }
                    _ => {
                        let _ = c.write_all(
                            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        );
                    }
                }
            });
        }
    });
    port
}

fn git(dir: &Path, args: &[&str]) {
    let ok = std::process::Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.test",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .status()
        .unwrap()
        .success();
    assert!(ok, "git {args:?}");
}

#[test]
fn allowed_host_through_the_proxy_and_denied_host_refused_and_audited() {
    if !have("curl") || !have("python3") || !have("git") {
        return;
    }
    let world = World::new();
    let repo = world.repo("egress");
    let port = http_upstream("127.0.0.2", "upstream-ok\n");
    // A bare repo served over git's dumb HTTP protocol on the same allowed name, another port.
    let served = world.tmp.path().join("served");
    let work = served.join("work");
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q"]);
    world.write(work.join("README"), "cloned-through-the-proxy\n");
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-qm", "c"]);
    git(&served, &["clone", "-q", "--bare", "work", "repo.git"]);
    git(&served.join("repo.git"), &["update-server-info"]);
    let git_port = file_server("127.0.0.2", served.clone());
    let resolver = world.write(world.tmp.path().join("resolver"), "allowed.test 127.0.0.2\n");
    world.write(
        world.home.join(".airlock/config.toml"),
        &format!(
            "[network]\nallow = [\"allowed.test:{port}\", \"allowed.test:{git_port}\"]\nallow_private = [\"127.0.0.2/32\"]\n"
        ),
    );
    world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    let h = Harness::start(
        &world,
        Options {
            env: vec![("AIRLOCK_TEST_RESOLVER".into(), resolver.into())],
            ..Default::default()
        },
    );
    let exec = |script: &str| {
        let run = world
            .airlock(&repo)
            .env("AIRLOCK_SOCKET", h.socket())
            .args(["exec", "--", "sh", "-c", script])
            .run();
        if run.code() == 125 {
            eprintln!(
                "--- airlockd log\n{}\nexits {:?} activations {}",
                h.log(),
                h.exits(),
                h.activations()
            );
        }
        run
    };
    // One session (as an agent would): every attempt, then what the session can see. One
    // session per daemon keeps this test independent of back-to-back session registration.
    let script = format!(
        "set -u\n\
         echo \"allowed:$(curl -sS -m 10 http://allowed.test:{port}/)\"\n\
         python3 -c \"import urllib.request; print('python:' + urllib.request.urlopen('http://allowed.test:{port}/', timeout=10).read().decode(), end='')\"\n\
         git clone -q http://allowed.test:{git_port}/repo.git /tmp/clone && echo \"git:$(cat /tmp/clone/README)\"\n\
         echo \"denied:$(curl -sS -m 10 http://pastebin.com/ | head -c 300 | tr '\\n' ' ')\"\n\
         curl -sS -m 10 https://pastebin.com/ 2>/dev/null; echo \"https:$?\"\n\
         curl -sS -m 10 -D - -o /dev/null http://pastebin.com/ | tr -d '\\r' | sed 's/^/header:/'\n\
         for f in /proc/self/fd/*; do echo \"fd:$(readlink $f)\"; done\n\
         python3 -c \"import socket\ns = socket.socket(socket.AF_UNIX)\ntry:\n  s.connect('{sock}'); print('daemon:CONNECTED')\nexcept OSError as e: print('daemon:refused', e.errno)\"\n",
        sock = h.socket().display()
    );
    let run = exec(&script).expect_code(0);
    let out = run.stdout();
    assert!(out.contains("allowed:upstream-ok\n"), "{out}\n{}", run.stderr());
    assert!(out.contains("python:upstream-ok\n"), "{out}");
    assert!(out.contains("git:cloned-through-the-proxy\n"), "{out}\n{}", run.stderr());
    let denied = out.lines().find(|l| l.starts_with("denied:")).unwrap();
    assert!(denied.contains("pastebin.com"), "the refusal names the host: {out}");
    assert!(out.contains("https:56\n"), "CONNECT refused → curl exit 56: {out}");
    assert!(out.contains("header:HTTP/1.1 403"), "{out}");
    assert!(out.to_ascii_lowercase().contains("header:x-airlock-reason:"), "{out}");
    assert!(!out.lines().any(|l| l.starts_with("fd:socket:")), "{out}");
    assert!(out.contains("daemon:refused"), "{out}");

    let lines = world.audit_lines("egress");
    let allowed: Vec<_> = lines.iter().filter(|l| l["allowed"] == true).collect();
    let refused: Vec<_> = lines.iter().filter(|l| l["allowed"] == false).collect();
    assert!(allowed.len() >= 2, "{lines:?}");
    assert!(refused.len() >= 3, "{lines:?}");
    let user_id = lines[0]["user_id"].as_str().unwrap().to_string();
    assert!(user_id.starts_with("u_"), "{lines:?}");
    assert!(lines.iter().all(|l| l["user_id"] == user_id.as_str() && l["repo"] == "egress"));
    assert!(refused.iter().all(|l| l["host"] == "pastebin.com"), "{refused:?}");
}

/// A listener on `ip` that only counts the connections reaching it.
fn counting_listener(ip: &str) -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let l = TcpListener::bind((ip, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = std::sync::Arc::new(AtomicUsize::new(0));
    let h = std::sync::Arc::clone(&hits);
    std::thread::spawn(move || {
        for c in l.incoming() {
            if c.is_ok() {
                h.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    (port, hits)
}

/// Blocklist mode allows any name without a rule, but a review-plane server stays refused
/// (SECURITY §3, `policy::eval` step 1): by name, subdomain, any port, plain HTTP and CONNECT,
/// never resolved and never dialed. Both addresses are in `allow_private`, so nothing but the
/// review rule stands between the session and the review host's listener.
#[test]
fn review_plane_hosts_are_refused_in_blocklist_mode() {
    if !have("curl") {
        return;
    }
    let world = World::new();
    let repo = world.repo("blocklist");
    let port = http_upstream("127.0.0.3", "upstream-ok\n");
    let (review_port, review_hits) = counting_listener("127.0.0.4");
    let resolver = world.write(
        world.tmp.path().join("resolver"),
        "other.test 127.0.0.3\nreview.test 127.0.0.4\napi.review.test 127.0.0.4\n",
    );
    world.write(
        world.home.join(".airlock/config.toml"),
        "[network]\nmode = \"blocklist\"\nallow_private = [\"127.0.0.3/32\", \"127.0.0.4/32\"]\n\
         [review]\nservers = [\"https://review.test:8443\"]\n",
    );
    world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    let h = Harness::start(
        &world,
        Options {
            env: vec![("AIRLOCK_TEST_RESOLVER".into(), resolver.clone().into())],
            ..Default::default()
        },
    );
    let script = format!(
        "echo \"other:$(curl -sS -m 10 http://other.test:{port}/)\"\n\
         curl -sS -m 10 -o /dev/null -w 'review:%{{http_code}}\\n' http://review.test:{review_port}/\n\
         curl -sS -m 10 -o /dev/null -w 'sub:%{{http_code}}\\n' http://api.review.test:{review_port}/\n\
         curl -sS -m 10 https://review.test:{review_port}/ 2>/dev/null; echo \"https:$?\"\n\
         curl -sS -m 10 -D - -o /dev/null http://review.test:8443/ | tr -d '\\r' | grep -i '^x-airlock-reason:'\n"
    );
    let run = world
        .airlock(&repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .args(["exec", "--", "sh", "-c", &script])
        .run();
    let out = run.expect_code(0).stdout();
    assert_eq!(
        out,
        "other:upstream-ok\nreview:403\nsub:403\nhttps:56\nX-Airlock-Reason: review_plane\n",
        "airlockd:\n{}",
        h.log()
    );
    use std::sync::atomic::Ordering;
    assert_eq!(review_hits.load(Ordering::SeqCst), 0, "the review host was dialed");

    let lines = world.audit_lines("blocklist");
    let decided: Vec<(String, bool, String)> = lines
        .iter()
        .map(|l| {
            let reason = l["reason"].as_str().unwrap_or_default().to_string();
            (l["host"].as_str().unwrap().to_string(), l["allowed"] == true, reason)
        })
        .collect();
    let want = |host: &str, allowed: bool, reason: &str| (host.to_string(), allowed, reason.into());
    assert_eq!(
        decided,
        vec![
            want("other.test", true, "allowed"), // allowed lines carry their reason
            want("review.test", false, "review_plane"),
            want("api.review.test", false, "review_plane"),
            want("review.test", false, "review_plane"),
            want("review.test", false, "review_plane"),
        ],
        "{lines:#?}"
    );
    // The resolver was asked for the allowed name (so its log exists) and never for the review
    // host.
    let queries = std::fs::read_to_string(format!("{}.queries", resolver.display()))
        .expect("the resolver log exists once other.test was resolved");
    assert_eq!(queries, "other.test\n");
}
