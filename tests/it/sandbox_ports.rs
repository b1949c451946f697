//! `--port [HOST_IP:]HOSTPORT:PORT` with the real `airlockd` (activation harness): a server
//! inside the sandbox reached from the host on the session's own loopback address, each
//! connection an `inbound` audit line; the walls: an undeclared port is unreachable, the default
//! address is never 127.0.0.1, two sessions never share one, the agent cannot reach init's port
//! channel, and ports never come from configuration. Loopback only.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::harness::{Harness, Options};
use crate::support::{World, have, in_ci, wait_until};

/// A host port nothing listens on right now (the kernel's pick, released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A running `airlock exec` whose stderr is collected line by line.
struct Session {
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl Session {
    fn start(world: &World, repo: &Path, h: &Harness, ports: &[String], script: &str) -> Self {
        let mut cmd = world.airlock(repo).env("AIRLOCK_SOCKET", h.socket()).cmd;
        cmd.arg("exec");
        for p in ports {
            cmd.args(["--port", p]);
        }
        cmd.args(["--", "sh", "-c", script]).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let (pipe, sink) = (child.stderr.take().unwrap(), Arc::clone(&stderr));
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Self { child, stderr }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The host address printed for sandbox port `port` (`airlock: port A → sandbox …`).
    fn published(&self, port: u16) -> SocketAddr {
        let suffix = format!(" → sandbox 127.0.0.1:{port}");
        let found = wait_until(Duration::from_secs(30), || {
            self.stderr().lines().any(|l| l.starts_with("airlock: port ") && l.ends_with(&suffix))
        });
        assert!(found, "no published address for {port}; stderr:\n{}", self.stderr());
        let err = self.stderr();
        let line = err.lines().find(|l| l.ends_with(&suffix)).unwrap();
        line["airlock: port ".len()..line.len() - suffix.len()].parse().unwrap()
    }

    /// Waits for the session to end; its exit code and stdout.
    fn finish(mut self) -> (i32, String, String) {
        let mut out = String::new();
        self.child.stdout.take().unwrap().read_to_string(&mut out).unwrap();
        let status = self.child.wait().unwrap();
        // The stderr thread ends with the pipe.
        std::thread::sleep(Duration::from_millis(100));
        (status.code().unwrap_or(-1), out, self.stderr())
    }
}

/// One HTTP GET to `addr` from the host; the whole response, or the error.
fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out)
}

fn needs_tools() -> bool {
    let ok = have("python3") && have("curl");
    assert!(ok || !in_ci(), "python3 and curl are required in CI");
    ok
}

/// Inside: an http.server for `dir` on 127.0.0.1:`port` in the background, then `then`, then
/// wait until the host creates `.done` in the repo.
fn serving(dir: &str, port: u16, then: &str) -> String {
    format!(
        "python3 -m http.server {port} --bind 127.0.0.1 --directory {dir} >/dev/null 2>&1 &\n\
         {then}\n\
         i=0; while [ ! -e .done ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n\
         exit 0\n"
    )
}

#[test]
fn a_server_inside_is_reached_from_the_host_and_each_connection_is_audited() {
    if !needs_tools() {
        return;
    }
    let world = World::new();
    let repo = world.repo("ports");
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"example.test\"]\n");
    world.write(repo.join("site/index.html"), "served-from-inside-the-sandbox\n");
    world.write(repo.join("other/index.html"), "not-published\n");
    let h = Harness::start(&world, Options::default());
    let host_port = free_port();
    // The agent's side: the published server, one on a port that is not published, and an
    // attempt to reach init's port channel — among its own fds, or init's through
    // pidfd_getfd(2) and /proc/1/fd — and to use any socket it finds as the channel.
    let probe = r#"
import ctypes, os, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
found = []
for name in os.listdir('/proc/self/fd'):
    fd = int(name)
    try:
        s = socket.socket(fileno=os.dup(fd))
    except OSError:
        continue
    found.append((fd, s.family))
    if s.family == socket.AF_UNIX:
        try:
            s.settimeout(2)
            s.send(struct.pack('>HI', 8001, 1))
            print('channel-answered', s.recv(64))
        except OSError as e:
            print('unix-fd-unusable', fd, e.errno)
print('own-sockets', found)
pidfd = libc.syscall(434, 1, 0)  # pidfd_open(init)
got = []
for fd in range(64):
    if pidfd >= 0 and libc.syscall(438, pidfd, fd, 0) >= 0:  # pidfd_getfd
        got.append(fd)
print('pidfd_getfd', got)
# As root the directory may be listed (proc(5): a non-dumpable process's entries belong to
# root), but no entry may be followed or opened.
try:
    names = os.listdir('/proc/1/fd')
except OSError as e:
    names = []
    print('proc1-fds-denied', e.errno)
for name in names:
    for how in ('readlink', 'open'):
        try:
            r = os.readlink('/proc/1/fd/' + name) if how == 'readlink' else os.open('/proc/1/fd/' + name, os.O_RDWR)
            print('proc1-fd-usable', how, name, r)
        except OSError:
            pass
print('proc1-done')
"#;
    world.write(repo.join("probe.py"), probe);
    let script = serving(
        "site",
        8000,
        "python3 -m http.server 8001 --bind 127.0.0.1 --directory other >/dev/null 2>&1 &\n\
         python3 probe.py",
    );
    let session = Session::start(&world, &repo, &h, &[format!("{host_port}:8000")], &script);
    let addr = session.published(8000);
    assert_ne!(addr.ip().to_string(), "127.0.0.1", "the default address is the session's own");
    assert!(addr.ip().is_loopback() && addr.port() == host_port, "{addr}");
    let err = session.stderr();
    assert!(err.contains("runs in your browser with your host's own network"), "{err}");
    // The server inside may still be starting: retry until it answers.
    let mut page = String::new();
    let served = wait_until(Duration::from_secs(20), || {
        page = http_get(addr, "/").unwrap_or_default();
        page.contains("served-from-inside-the-sandbox")
    });
    assert!(served, "no page through {addr}: {page:?}\n{}", session.stderr());
    // curl, as a person would.
    let curl = std::process::Command::new("curl")
        .args(["-sS", "-m", "10", &format!("http://{addr}/index.html")])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&curl.stdout).contains("served-from-inside-the-sandbox"),
        "{curl:?}"
    );
    // Not published: nothing on the host leads to 8001 inside, nor to the server on
    // 127.0.0.1 (the host's own loopback address).
    let other = SocketAddr::new(addr.ip(), free_port());
    assert!(http_get(other, "/").is_err(), "an undeclared port answered on {other}");
    let own = SocketAddr::from(([127, 0, 0, 1], host_port));
    if let Ok(r) = http_get(own, "/") {
        assert!(!r.contains("served-from-inside"), "127.0.0.1 reached the sandbox: {r}");
    }
    std::fs::write(repo.join(".done"), "").unwrap();
    let (code, out, err) = session.finish();
    assert_eq!(code, 0, "{out}\n{err}\n--- airlockd\n{}", h.log());
    // The agent found no way to the channel.
    assert!(!out.contains("channel-answered"), "{out}");
    assert!(!out.contains("AF_UNIX") && !out.contains("unix-fd-unusable"), "{out}");
    assert!(out.contains("pidfd_getfd []"), "{out}");
    assert!(out.contains("proc1-done") && !out.contains("proc1-fd-usable"), "{out}");

    let lines = world.audit_lines("ports");
    let inbound: Vec<_> = lines.iter().filter(|l| l["method"] == "INBOUND").collect();
    let ok: Vec<_> = inbound.iter().filter(|l| l["allowed"] == true).collect();
    assert!(ok.len() >= 2, "{inbound:#?}");
    let session_id = lines[0]["session"].as_str().unwrap();
    for l in &ok {
        assert_eq!(l["reason"], "allowed", "{l}");
        assert_eq!(l["port"], 8000, "{l}");
        assert_eq!(l["host"], "127.0.0.1", "{l}");
        assert_eq!(l["listen"], addr.to_string(), "{l}");
        let peer: SocketAddr = l["peer"].as_str().unwrap().parse().unwrap();
        assert!(peer.ip().is_loopback(), "{l}");
        assert!(l["bytes_sent"].as_u64().unwrap() > "served-from-inside-the-sandbox".len() as u64);
        assert!(l["bytes_recv"].as_u64().unwrap() > 0, "{l}");
        assert!(l["duration_ms"].is_u64(), "{l}");
        assert_eq!(l["session"], session_id, "{l}");
        assert_eq!(l["repo"], "ports", "{l}");
        assert!(l["seq"].as_u64().unwrap() >= 1, "{l}");
    }
    // Attempts made before the server inside listened are lines too, refused.
    for l in inbound.iter().filter(|l| l["allowed"] == false) {
        assert_eq!(l["reason"], "connect_failed", "{l}");
    }
    // Each line comes before the session's end record.
    let records = world.session_records("ports");
    assert!(records.iter().any(|r| r["id"].as_str().unwrap().ends_with(":end")), "{records:?}");
}

#[test]
fn two_sessions_at_once_get_different_addresses() {
    if !needs_tools() {
        return;
    }
    let world = World::new();
    let (a, b) = (world.repo("ports-a"), world.repo("ports-b"));
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"example.test\"]\n");
    let h = Harness::start(&world, Options::default());
    // The same host port for both: only different addresses let both listen.
    let port = free_port();
    let wait = "i=0; while [ ! -e .done ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done";
    let one = Session::start(&world, &a, &h, &[format!("{port}:8000")], wait);
    let first = one.published(8000);
    let two = Session::start(&world, &b, &h, &[format!("{port}:8000")], wait);
    let second = two.published(8000);
    std::fs::write(a.join(".done"), "").unwrap();
    std::fs::write(b.join(".done"), "").unwrap();
    let (c1, _, e1) = one.finish();
    let (c2, _, e2) = two.finish();
    assert_eq!((c1, c2), (0, 0), "{e1}\n{e2}");
    assert_ne!(first.ip(), second.ip(), "{first} {second}");
    for addr in [first, second] {
        assert_ne!(addr.ip().to_string(), "127.0.0.1");
        assert_eq!(addr.port(), port);
    }
}

#[test]
fn bad_port_syntax_exits_125_and_says_what_to_write() {
    let world = World::new();
    let repo = world.repo("ports-bad");
    for (value, why) in [
        ("3000", "both HOSTPORT and PORT are needed"),
        ("70000:80", "HOSTPORT must be a number from 1 to 65535"),
        ("3000:0", "PORT must be from 1 to 65535, found 0"),
        ("localhost:3000:3000", "is not an IPv4 address"),
        ("3000:8888", "Airlock's proxy listener"),
    ] {
        for cmd in ["exec", "run"] {
            let mut args = vec![cmd, "--port", value];
            args.extend(if cmd == "exec" { &["--", "true"][..] } else { &["claude"][..] });
            let run = world.airlock(&repo).args(&args).run().expect_code(125);
            let err = run.stderr();
            assert!(err.contains(why), "{cmd} --port {value}: {err}");
            assert!(err.contains("expected [HOST_IP:]HOSTPORT:PORT"), "{err}");
        }
    }
}

#[test]
fn ports_never_come_from_configuration() {
    let world = World::new();
    let repo = world.repo("ports-config");
    for (file, text) in [
        (world.home.join(".airlock/config.toml"), "ports = [\"3000:3000\"]\n"),
        (world.home.join(".airlock/config.toml"), "[network]\nport = \"3000:3000\"\n"),
    ] {
        world.write(&file, text);
        let run = world.airlock(&repo).args(["exec", "--", "true"]).run().expect_code(125);
        let err = run.stderr();
        assert!(err.contains("ports cannot be published from a configuration file"), "{err}");
        assert!(err.contains("--port [HOST_IP:]HOSTPORT:PORT"), "{err}");
        assert!(err.contains("config.toml:"), "names the file and place: {err}");
    }
}

#[cfg(feature = "test-hooks")]
#[test]
fn a_daemon_without_session_inbound_refuses_port_with_a_reason() {
    let world = World::new();
    let repo = world.repo("ports-old");
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"example.test\"]\n");
    // A version-1 daemon: no capabilities at all.
    let h = Harness::start(
        &world,
        Options {
            env: vec![(airlock::protocol::TEST_DAEMON_PROTOCOL_VAR.into(), "1-1".into())],
            ..Default::default()
        },
    );
    let run = world
        .airlock(&repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .args(["exec", "--port", &format!("{}:8000", free_port()), "--", "true"])
        .run()
        .expect_code(125);
    let err = run.stderr();
    assert!(err.contains("--port needs an airlockd that audits inbound connections"), "{err}");
    assert!(!err.contains("→ sandbox"), "nothing was published: {err}");
}
