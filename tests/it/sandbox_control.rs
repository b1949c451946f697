//! The control socket refuses peers outside the daemon's user and network namespace (SECURITY
//! §7). A sandboxed process that reaches the socket anyway — here through a hard link in the
//! repo, standing in for a bad mount: same inode, so connect(2) reaches the daemon from inside
//! the sandbox's mount namespace — must not be served, while the host side still is.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use crate::harness::{Harness, Options};
use crate::support::{World, have};

/// The `hello` frame both the host and the sandboxed client send (protocol.rs: 4-byte
/// big-endian length, then JSON).
const HELLO: &str = r#"{"op":"hello","protocol":{"min":1,"max":1},"client_version":"0.1.0"}"#;

/// Every reply frame (JSON) the daemon sends until it closes the connection or goes quiet.
fn replies(data: &[u8]) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut rest = data;
    while rest.len() >= 4 {
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let Some(body) = rest.get(4..4 + len) else { break };
        out.push(serde_json::from_slice(body).unwrap());
        rest = &rest[4 + len..];
    }
    out
}

/// Sends HELLO from this (host) process and returns the first reply.
fn host_hello(path: &Path) -> serde_json::Value {
    let mut s = UnixStream::connect(path).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut frame = (HELLO.len() as u32).to_be_bytes().to_vec();
    frame.extend_from_slice(HELLO.as_bytes());
    s.write_all(&frame).unwrap();
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    while replies(&data).is_empty() {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "the daemon closed the host's connection without a reply");
        data.extend_from_slice(&buf[..n]);
    }
    replies(&data).remove(0)
}

#[test]
fn sandbox_peer_on_the_control_socket_is_refused_and_the_host_is_served() {
    if !have("python3") {
        return;
    }
    let world = World::new();
    let repo = world.repo("ctl");
    world.write(world.home.join(".airlock/config.toml"), "[network]\nallow = [\"example.test\"]\n");
    let h = Harness::start(&world, Options::default());
    // The test-only "copy" of the socket the sandbox can reach (the repo is bound inside).
    let reachable = repo.join("ctl.sock");
    std::fs::hard_link(h.socket(), &reachable).unwrap();

    // Positive control: the same hello from the host is answered (through the same link).
    let reply = host_hello(&reachable);
    assert_eq!(reply["reply"], "hello", "the host's hello: {reply}\n{}", h.log());

    // Inside: hello, then a session_start with a forged identity, its own user layer (blocklist
    // mode: everything allowed) and a listener made inside (which passes the listener checks:
    // another netns, 127.0.0.1).
    let code = format!(
        r#"
import json, socket, struct, sys
def frame(b): return struct.pack('>I', len(b)) + b
s = socket.socket(socket.AF_UNIX); s.settimeout(10)
try:
    s.connect('/ctl/ctl.sock')
except OSError as e:
    print('connect-failed', e.errno); sys.exit(3)
print('connected', flush=True)
lst = socket.socket(); lst.bind(('127.0.0.1', 0)); lst.listen(1)
start = {{"op": "session_start", "repo": "forged", "repo_path": "/forged",
          "identity": {{"email": "attacker@example.test", "user_id": "u_forged"}},
          "config": {{"user": {{"kind": "user", "name": "~/.airlock/config.toml",
                               "digest": "0" * 64, "network": {{"mode": "blocklist"}}}},
                      "repo": None, "review_servers": []}},
          "layers": ["none"], "command": ["forged"], "airlock_version": "0.1.0"}}
data = b''
def read_frame():
    global data
    while True:
        if len(data) >= 4 and len(data) >= 4 + struct.unpack('>I', data[:4])[0]:
            n = struct.unpack('>I', data[:4])[0]
            f, data = data[4:4 + n], data[4 + n:]
            print('reply', f.decode(errors='replace'), flush=True)
            return True
        try:
            d = s.recv(65536)
        except OSError as e:
            print('recv-ended', e.errno); return False
        if not d:
            print('eof'); return False
        data += d
# Like the real client: hello, wait for its reply, then the request.
try:
    s.sendall(frame('{hello}'.encode()))
    read_frame()
    socket.send_fds(s, [frame(json.dumps(start).encode())], [lst.fileno()])
    read_frame()
except OSError as e:
    print('send-failed', e.errno)
"#,
        hello = HELLO
    );
    let run = world
        .airlock(&repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .args(["exec", "--", "python3", "-c", &code])
        .run();
    let log = h.log();
    assert_eq!(run.code(), 0, "stdout:\n{}\nstderr:\n{}\nlog:\n{log}", run.stdout(), run.stderr());
    let out = run.stdout();
    assert!(out.contains("connected\n"), "the sandbox must reach the socket for this test: {out}");
    assert!(!out.contains("\"reply\":\"hello\""), "the sandbox got a hello reply: {out}");
    assert!(!out.contains("session_started"), "the sandbox started a session: {out}");
    for reply in out.lines().filter(|l| l.starts_with("reply ")) {
        assert!(reply.contains("\"code\":\"peer_namespace\""), "only a refusal: {out}");
    }
    // The daemon says why, naming the peer and the namespaces that differ.
    let warning = log
        .lines()
        .find(|l| l.contains(" WARN ") && l.contains(": refused a control connection: "))
        .unwrap_or_else(|| panic!("no warning in the daemon log:\n{log}"));
    assert!(warning.contains("peer pid "), "{warning}");
    assert!(warning.contains("network namespace"), "{warning}");

    // No extra session: none for the forged repo, only the exec's own one for this repo, and
    // the daemon lists no session now that the exec has ended.
    assert!(world.session_records("forged").is_empty(), "{:?}", world.session_records("forged"));
    let starts = world.session_records("ctl").into_iter().filter(|r| r["kind"] == "start").count();
    assert_eq!(starts, 1, "{:?}", world.session_records("ctl"));
    let status = world
        .airlock(world.tmp.path())
        .env("AIRLOCK_SOCKET", h.socket())
        .args(["status", "--json"])
        .run()
        .expect_code(0);
    let status: serde_json::Value = serde_json::from_str(&status.stdout()).unwrap();
    assert_eq!(status["sessions"].as_array().map(Vec::len), Some(0), "{status}");
}
