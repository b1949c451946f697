//! `airlockd proxy` with real clients (curl, Python urllib, git) against loopback upstreams
//! of our own. Names resolve only through the test resolver; every upstream sits on its own
//! 127.0.x.y so tests can run in parallel; `pastebin.com` appears only as a denied name.

use std::io::Write;

use crate::proxy_support::{ProxyProc, Serve, TestPki, Upstream, curl, lines_for};
use crate::support::World;

/// Issue 3's "done when", exactly.
#[test]
fn done_when_allowed_tls_and_denied_pastebin() {
    let world = World::new();
    let pki = TestPki::new(&["example.test"]);
    let ca = pki.write_ca(&world, "dw");
    let up = Upstream::start(
        "127.0.0.2:443",
        Serve::Http { name: "example.test".into(), root: None },
        Some(pki.server_config()),
    );
    let proxy = ProxyProc::start(
        &world,
        "dw",
        "[network]\nallow = [\"example.test\"]\nallow_private = [\"127.0.0.2/32\"]\n",
        "example.test 127.0.0.2\n",
        &[],
    );
    let ca = ca.to_str().unwrap();
    let (code, body, err) = curl(&["-x", &proxy.url(), "--cacert", ca, "https://example.test/"]);
    assert_eq!(code, 0, "curl failed: {err}\nproxy: {}", proxy.stderr.lock().unwrap());
    assert!(body.starts_with("hello from example.test"), "{body}");
    assert_eq!(up.hits(), 1);

    let lines = proxy.wait_audit(|l| l.iter().any(|x| x["host"] == "example.test"));
    let allowed = lines_for(&lines, "example.test");
    assert_eq!(allowed.len(), 1, "{lines:#?}");
    let a = allowed[0];
    assert_eq!(a["allowed"], true);
    assert_eq!(a["method"], "CONNECT");
    assert_eq!(a["addr"], "127.0.0.2:443");
    assert_eq!(a["port"], 443);
    assert_eq!(a["repo"], "demo");
    assert_eq!(a["user_id"], "u-test");
    assert!(a["bytes_sent"].as_u64().unwrap() > 0, "{a}");
    assert!(a["bytes_recv"].as_u64().unwrap() > 0, "{a}");
    assert!(a["duration_ms"].is_u64(), "{a}");

    let (code, _, err) = curl(&["-v", "-x", &proxy.url(), "https://pastebin.com/"]);
    assert_eq!(code, 56, "{err}");
    assert!(err.contains("< HTTP/1.1 403 Forbidden by airlock policy"), "{err}");
    assert!(err.contains("< X-Airlock-Reason: not_allowed"), "{err}");
    assert!(err.contains("< X-Airlock-Layer: none"), "{err}");
    // The denial's line is on disk as soon as curl has the response (written before it).
    let lines = proxy.audit();
    let denied = lines_for(&lines, "pastebin.com");
    assert_eq!(denied.len(), 1, "{lines:#?}");
    assert_eq!(denied[0]["allowed"], false);
    assert_eq!(denied[0]["reason"], "not_allowed");
    assert_eq!(denied[0]["layer"], "none");
    assert!(denied[0]["duration_ms"].is_u64(), "the page's denied line has duration_ms");
    // The allowed name was resolved (so the log exists), the denied one never.
    assert_eq!(proxy.queries(), ["example.test"], "denied name was resolved");
    let out = proxy.wait_stdout("reason=not_allowed layer=none\n");
    assert!(out.contains(" ALLOW example.test:443 CONNECT"), "{out}");
    let deny = out.lines().find(|l| l.contains(" DENY pastebin.com:443 CONNECT ")).unwrap();
    assert!(deny.ends_with("ms reason=not_allowed layer=none"), "{deny}");
}

#[test]
fn curl_plain_http_regenerates_host_and_strips_proxy_headers() {
    let world = World::new();
    let up = Upstream::start(
        "127.0.1.10:80",
        Serve::Http { name: "plain.test".into(), root: None },
        None,
    );
    let proxy = ProxyProc::start(
        &world,
        "plain",
        "[network]\nallow = [\"plain.test\"]\nallow_private = [\"127.0.1.10/32\"]\n",
        "plain.test 127.0.1.10\n",
        &[],
    );
    let (code, body, err) = curl(&[
        "-x",
        &proxy.url(),
        "-H",
        "Proxy-Authorization: Basic c2VjcmV0",
        "-H",
        "Proxy-Secret: x",
        "-H",
        "X-Keep: yes",
        "http://plain.test/path?q=1",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(body.starts_with("hello from plain.test"), "{body}");
    assert!(body.contains("GET /path?q=1 HTTP/1.1\r\n"), "origin-form upstream: {body}");
    assert!(
        body.contains("Host: plain.test\r\n") || body.contains("host: plain.test\r\n"),
        "{body}"
    );
    assert!(body.to_ascii_lowercase().contains("x-keep: yes"), "{body}");
    assert!(!body.to_ascii_lowercase().contains("proxy-"), "proxy headers leaked: {body}");

    // Host header ≠ target: the target decides, and Host is regenerated from it.
    let (code, body, err) =
        curl(&["-x", &proxy.url(), "-H", "Host: pastebin.com", "http://plain.test/"]);
    assert_eq!(code, 0, "{err}");
    assert!(!body.contains("pastebin.com"), "Host header passed through: {body}");
    // …and an allowed name in Host does not open a denied target.
    let (code, body, _) = curl(&[
        "-x",
        &proxy.url(),
        "-H",
        "Host: plain.test",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "http://pastebin.com/",
    ]);
    assert_eq!((code, body.as_str()), (0, "403"));
    assert_eq!(up.hits(), 2);

    // Keep-alive: two URLs on one connection, each decided and audited.
    let (code, _, err) =
        curl(&["-x", &proxy.url(), "http://plain.test/one", "http://pastebin.com/two"]);
    assert_eq!(code, 0, "{err}");
    let lines = proxy.wait_audit(|l| l.len() >= 5);
    let urls: Vec<_> = lines.iter().map(|l| (l["url"].clone(), l["allowed"].clone())).collect();
    assert!(urls.contains(&("http://plain.test/one".into(), true.into())), "{urls:?}");
    assert!(urls.contains(&("http://pastebin.com/two".into(), false.into())), "{urls:?}");
    let first = &lines_for(&lines, "plain.test")[0];
    assert_eq!(first["status"], 200);
    assert_eq!(first["method"], "GET");
    assert_eq!(first["addr"], "127.0.1.10:80");
    let queries = proxy.queries();
    assert!(queries.iter().any(|q| q == "plain.test"), "{queries:?}");
    assert!(!queries.iter().any(|q| q == "pastebin.com"), "{queries:?}");

    // Origin-form is not a proxy request.
    let (_s, head) = proxy.ask("GET / HTTP/1.1\r\nHost: plain.test\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 400 "), "{head}");
    assert!(head.contains("X-Airlock-Reason: malformed"), "{head}");
}

#[test]
fn python_urllib_with_proxy_variables() {
    let world = World::new();
    let pki = TestPki::new(&["py.test"]);
    let ca = pki.write_ca(&world, "py");
    let _tls = Upstream::start(
        "127.0.1.11:443",
        Serve::Http { name: "py.test".into(), root: None },
        Some(pki.server_config()),
    );
    let _plain =
        Upstream::start("127.0.1.11:80", Serve::Http { name: "py.test".into(), root: None }, None);
    let proxy = ProxyProc::start(
        &world,
        "py",
        "[network]\nallow = [\"py.test\"]\nallow_private = [\"127.0.1.11/32\"]\n",
        "py.test 127.0.1.11\n",
        &[],
    );
    let script = r#"
import ssl, sys, urllib.request, urllib.error
ctx = ssl.create_default_context(cafile=sys.argv[1])
print(urllib.request.urlopen("https://py.test/", context=ctx, timeout=20).read().decode().splitlines()[0])
print(urllib.request.urlopen("http://py.test/x", timeout=20).read().decode().splitlines()[0])
try:
    urllib.request.urlopen("http://pastebin.com/", timeout=20)
except urllib.error.HTTPError as e:
    print("denied", e.code, e.headers["X-Airlock-Reason"])
"#;
    let out = std::process::Command::new("python3")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HTTPS_PROXY", proxy.url())
        .env("HTTP_PROXY", proxy.url())
        .args(["-c", script, ca.to_str().unwrap()])
        .output()
        .expect("python3 is a test prerequisite");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout, "hello from py.test\nhello from py.test\ndenied 403 not_allowed\n");
}

#[test]
fn git_clone_over_https_through_the_proxy() {
    let world = World::new();
    let pki = TestPki::new(&["git.test"]);
    let ca = pki.write_ca(&world, "git");
    // A repository with one commit, published as a dumb-HTTP bare repo.
    let src = world.tmp.path().join("src");
    let serve_root = world.tmp.path().join("srv");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&serve_root).unwrap();
    let git = |dir: &std::path::Path, args: &[&str]| {
        let out = std::process::Command::new("git")
            .current_dir(dir)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", &world.home)
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_SSL_CAINFO", &ca)
            .env("https_proxy", proxy_url_placeholder())
            .args(["-c", "user.name=T", "-c", "user.email=t@example.test"])
            .args(args)
            .output()
            .expect("git is a test prerequisite");
        assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    std::fs::File::create(src.join("README")).unwrap().write_all(b"through the airlock\n").unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    git(&src, &["add", "README"]);
    git(&src, &["commit", "-q", "-m", "first"]);
    git(&serve_root, &["clone", "-q", "--bare", src.to_str().unwrap(), "repo.git"]);
    git(&serve_root.join("repo.git"), &["update-server-info"]);

    let _up = Upstream::start(
        "127.0.1.12:443",
        Serve::Http { name: "git.test".into(), root: Some(serve_root.clone()) },
        Some(pki.server_config()),
    );
    let proxy = ProxyProc::start(
        &world,
        "git",
        "[network]\nallow = [\"git.test\"]\nallow_private = [\"127.0.1.12/32\"]\n",
        "git.test 127.0.1.12\n",
        &[],
    );
    let dest = world.tmp.path().join("clone");
    let out = std::process::Command::new("git")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &world.home)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_SSL_CAINFO", &ca)
        .env("https_proxy", proxy.url())
        .args(["clone", "-q", "https://git.test/repo.git", dest.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "clone: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read_to_string(dest.join("README")).unwrap(), "through the airlock\n");
    let lines = proxy.wait_audit(|l| !l.is_empty());
    assert!(lines.iter().all(|l| l["host"] == "git.test" && l["allowed"] == true), "{lines:#?}");
}

/// Setup-time git commands never talk to a network; this proxy address goes nowhere.
fn proxy_url_placeholder() -> &'static str {
    "http://127.0.0.1:9"
}

#[test]
fn env_fallbacks_and_missing_config() {
    let world = World::new();
    let cfg = world.write(world.tmp.path().join("env.toml"), "[network]\nallow = [\"env.test\"]\n");
    let logs = world.tmp.path().join("env-logs");
    let mut cmd = world
        .airlockd(world.tmp.path())
        .args(["proxy"])
        .env("AIRLOCK_REPO_NAME", "envrepo")
        .env("AIRLOCK_LISTEN", "127.0.0.1:0")
        .env("AIRLOCK_CONFIG", &cfg)
        .env("AIRLOCK_LOG_DIR", &logs)
        .env("AIRLOCK_USER_ID", "u-env")
        .cmd;
    cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let err = child.stderr.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(err));
    let addr = loop {
        let line = lines.next().expect("proxy exited before listening").unwrap();
        if let Some(rest) = line.split("listening on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    let (code, _, _) =
        curl(&["-x", &format!("http://{addr}"), "-o", "/dev/null", "http://pastebin.com/"]);
    assert_eq!(code, 0);
    let _ = child.kill();
    let _ = child.wait();
    let lines = crate::proxy_support::audit_lines(&logs);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!(lines[0]["repo"], "envrepo");
    assert_eq!(lines[0]["user_id"], "u-env");

    // No --config: refuses to start and says what to do.
    let run = world
        .airlockd(world.tmp.path())
        .args(["proxy", "--repo-name", "demo", "--listen", "127.0.0.1:0"])
        .args(["--log-dir".as_ref(), logs.as_os_str()])
        .run();
    assert_eq!(run.code(), 1, "{}", run.stderr());
    assert!(run.stderr().contains("--config"), "{}", run.stderr());
}

#[test]
fn sigterm_drains_and_logs_open_tunnels_as_interrupted() {
    use std::io::Read;
    let world = World::new();
    let _up = Upstream::start("127.0.1.24:7443", Serve::Echo, None);
    let mut proxy = ProxyProc::start(
        &world,
        "term",
        "[network]\nallow = [\"term.test:7443\"]\nallow_private = [\"127.0.1.24/32\"]\n",
        "term.test 127.0.1.24\n",
        &["--drain-grace", "200ms"],
    );
    let (mut t, head) = proxy.ask("CONNECT term.test:7443 HTTP/1.1\r\n\r\n");
    assert!(head.starts_with("HTTP/1.1 200 "), "{head}");
    t.write_all(b"abc").unwrap();
    let mut e = [0u8; 3];
    t.read_exact(&mut e).unwrap();
    let status = proxy.signal_and_wait(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(status.code(), Some(0), "{}", proxy.stderr.lock().unwrap());
    let lines = proxy.audit();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert_eq!(lines[0]["interrupted"], true);
    assert_eq!(lines[0]["bytes_sent"], 3);
    assert_eq!(lines[0]["bytes_recv"], 3);
}
