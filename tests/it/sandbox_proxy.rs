//! `airlock exec` with the real `airlockd` (through the activation harness): the sandbox's only
//! way out is the proxy, which allows what the policy allows and refuses the rest with a 403
//! naming the host, writing an attributed audit line for each attempt. Upstreams are loopback
//! servers of the test's own; the test resolver maps test names to them.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::Path;

use crate::harness::{Harness, Options};
use crate::support::{World, in_ci};

/// An HTTP server on `ip` answering every request with `body`.
fn http_upstream(ip: &str, body: &'static str) -> u16 {
    let l = TcpListener::bind((ip, 0)).unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in l.incoming().flatten() {
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = c.read(&mut buf);
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

fn have(tool: &str) -> bool {
    let ok = Path::new("/usr/bin").join(tool).exists();
    assert!(ok || !in_ci(), "prerequisite {tool} missing (CI must have it)");
    ok
}

fn audit_lines(world: &World, repo: &str) -> Vec<serde_json::Value> {
    let dir = world.home.join(".airlock/logs").join(repo);
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        if e.file_name().to_string_lossy().starts_with("audit-") {
            for l in std::fs::read_to_string(e.path()).unwrap().lines() {
                out.push(serde_json::from_str(l).unwrap());
            }
        }
    }
    out
}

#[test]
fn allowed_host_through_the_proxy_and_denied_host_refused_and_audited() {
    if !have("curl") || !have("python3") {
        return;
    }
    let world = World::new();
    let repo = world.repo("egress");
    let port = http_upstream("127.0.0.2", "upstream-ok\n");
    let resolver = world.write(world.tmp.path().join("resolver"), "allowed.test 127.0.0.2\n");
    world.write(
        world.home.join(".airlock/config.toml"),
        &format!(
            "[network]\nallow = [\"allowed.test:{port}\"]\nallow_private = [\"127.0.0.2/32\"]\n"
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
        world
            .airlock(&repo)
            .env("AIRLOCK_SOCKET", h.socket())
            .args(["exec", "--", "sh", "-c", script])
            .run()
    };
    // Allowed: curl and python (both honour the proxy variables).
    let out = exec(&format!("curl -sS -m 10 http://allowed.test:{port}/")).expect_code(0);
    assert_eq!(out.stdout(), "upstream-ok\n", "{}", out.stderr());
    let py = format!(
        "python3 -c \"import urllib.request; print(urllib.request.urlopen('http://allowed.test:{port}/', timeout=10).read().decode(), end='')\""
    );
    assert_eq!(exec(&py).expect_code(0).stdout(), "upstream-ok\n");
    // Denied: the refusal names the host; HTTPS through CONNECT fails with curl's 56.
    let denied = exec("curl -sS -m 10 http://pastebin.com/").expect_code(0);
    assert!(denied.stdout().contains("pastebin.com"), "{}", denied.stdout());
    let https = exec("curl -sS -m 10 https://pastebin.com/");
    assert_eq!(https.code(), 56, "{}", https.stderr());
    let headers = exec("curl -sS -m 10 -D - -o /dev/null http://pastebin.com/").stdout();
    assert!(headers.starts_with("HTTP/1.1 403"), "{headers}");
    assert!(headers.to_ascii_lowercase().contains("x-airlock-reason:"), "{headers}");

    let lines = audit_lines(&world, "egress");
    let allowed: Vec<_> = lines.iter().filter(|l| l["allowed"] == true).collect();
    let refused: Vec<_> = lines.iter().filter(|l| l["allowed"] == false).collect();
    assert!(allowed.len() >= 2, "{lines:?}");
    assert!(refused.len() >= 3, "{lines:?}");
    let user_id = lines[0]["user_id"].as_str().unwrap().to_string();
    assert!(user_id.starts_with("u_"), "{lines:?}");
    assert!(lines.iter().all(|l| l["user_id"] == user_id.as_str() && l["repo"] == "egress"));
    assert!(refused.iter().all(|l| l["host"] == "pastebin.com"), "{refused:?}");
}
