//! The sandbox's resolver (issue 14) through `airlock exec` and the real `airlockd`: the
//! sandbox's `resolv.conf` names `127.0.0.53`, whose UDP and TCP sockets are made inside and
//! answered by the daemon. An allowed name gets a synthetic `198.18.0.0/15` address, a refused
//! one NXDOMAIN, AAAA no address; every query is an audit line; a client that resolves first and
//! then uses the explicit proxy with the synthetic address reaches the (loopback) upstream the
//! test resolver maps the name to. Runs as root and unprivileged (`.ci/unprivileged`).

use crate::harness::{Harness, Options};
use crate::support::{World, have, in_ci};

/// An HTTP server on `ip` answering every request with `body` (its port).
fn http_upstream(ip: &str, body: &'static str) -> u16 {
    crate::support::http_upstream(ip, body).0
}

/// A DNS query for `name`/`qtype` in Python, sent over TCP (RFC 7766 length prefix) or UDP;
/// prints `tag:rcode=R an=N addr=A.B.C.D`.
fn py_query(tag: &str, name: &str, qtype: u16, tcp: bool) -> String {
    format!(
        r#"import socket, struct
q = struct.pack('>HHHHHH', 0x4242, 0x0100, 1, 0, 0, 0)
q += b''.join(bytes([len(l)]) + l.encode() for l in '{name}'.split('.')) + b'\0' + struct.pack('>HH', {qtype}, 1)
if {tcp}:
    s = socket.create_connection(('127.0.0.53', 53), timeout=5)
    s.sendall(struct.pack('>H', len(q)) + q)
    n = struct.unpack('>H', s.recv(2, socket.MSG_WAITALL))[0]
    r = s.recv(n, socket.MSG_WAITALL)
else:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
    s.sendto(q, ('127.0.0.53', 53)); r = s.recv(4096)
an = struct.unpack('>H', r[6:8])[0]
addr = '.'.join(map(str, r[-4:])) if an else '-'
print('{tag}:id=%x rcode=%d an=%d addr=%s' % (struct.unpack('>H', r[:2])[0], r[3] & 15, an, addr))
"#,
        tcp = if tcp { "True" } else { "False" }
    )
}

#[test]
fn the_sandbox_resolver_answers_synthetic_addresses_and_audits_every_query() {
    let needs = ["curl", "python3", "getent"];
    if let Some(missing) = needs.iter().find(|t| !have(t)) {
        assert!(!in_ci(), "CI=true but {missing} is missing");
        return;
    }
    let world = World::new();
    let repo = world.repo("resolver");
    let port = http_upstream("127.0.0.2", "upstream-ok\n");
    let resolver = world.write(world.tmp.path().join("resolver-map"), "allowed.test 127.0.0.2\n");
    world.write(
        world.home.join(".airlock/config.toml"),
        &format!(
            "[network]\nallow = [\"allowed.test:{port}\"]\nallow_private = [\"127.0.0.2/32\"]\n"
        ),
    );
    let queried = world.tmp.path().join("resolver-queries");
    world.airlock(&repo).args(["login", "--email", "dev@example.test"]).run().expect_code(0);
    let h = Harness::start(
        &world,
        Options {
            env: vec![
                ("AIRLOCK_TEST_RESOLVER".into(), resolver.into()),
                ("AIRLOCK_TEST_RESOLVER_LOG".into(), queried.clone().into()),
            ],
            ..Default::default()
        },
    );
    // Scripts in the repo: the sandbox's working directory.
    let q = |file: &str, body: String| {
        std::fs::write(repo.join(file), body).unwrap();
        file.to_string()
    };
    let (tcp_a, tcp_refused, udp_https) = (
        q("tcp_a.py", py_query("tcp", "allowed.test", 1, true)),
        q("tcp_refused.py", py_query("tcprefused", "refused.test", 1, true)),
        q("udp_https.py", py_query("https", "allowed.test", 65, false)),
    );
    let script = format!(
        "set -u\n\
         echo \"resolv:$(cat /etc/resolv.conf | tr '\\n' '|')\"\n\
         addr=$(getent hosts allowed.test | cut -d' ' -f1); echo \"getent:$addr\"\n\
         getent hosts refused.test; echo \"refused:$?\"\n\
         python3 -c \"import socket; print('gai4:' + socket.getaddrinfo('allowed.test', 80, socket.AF_INET)[0][4][0])\"\n\
         python3 -c \"import socket\ntry:\n  print('gai6:', socket.getaddrinfo('allowed.test', 80, socket.AF_INET6))\nexcept socket.gaierror as e: print('gai6:none', e.errno)\"\n\
         python3 -c \"import socket\ntry:\n  socket.getaddrinfo('refused.test', 80); print('gairefused:RESOLVED')\nexcept socket.gaierror as e: print('gairefused:none', e.errno)\"\n\
         echo \"proxied:$(curl -sS -m 10 -x http://127.0.0.1:8888 http://$addr:{port}/)\"\n\
         echo \"tunneled:$(curl -sS -m 10 -p -x http://127.0.0.1:8888 http://$addr:{port}/)\"\n\
         python3 {tcp_a}\n python3 {tcp_refused}\n python3 {udp_https}\n",
    );
    let run = world
        .airlock(&repo)
        .env("AIRLOCK_SOCKET", h.socket())
        .args(["exec", "--", "sh", "-c", &script])
        .run();
    let out = run.stdout();
    let diag = format!("{out}\n--- stderr\n{}\n--- airlockd log\n{}", run.stderr(), h.log());
    assert_eq!(run.code(), 0, "{diag}");
    assert!(out.contains("resolv:nameserver 127.0.0.53|\n"), "{diag}");
    let addr = out.lines().find_map(|l| l.strip_prefix("getent:")).unwrap_or("").to_string();
    assert!(addr.starts_with("198.18.") || addr.starts_with("198.19."), "synthetic: {diag}");
    assert!(out.contains("refused:2\n"), "getent exits 2 for an unknown name: {diag}");
    assert!(out.contains(&format!("gai4:{addr}\n")), "stable for the session: {diag}");
    assert!(out.contains("gai6:none"), "AAAA gives no address: {diag}");
    assert!(out.contains("gairefused:none"), "{diag}");
    assert!(out.contains("proxied:upstream-ok\n"), "{diag}");
    assert!(out.contains("tunneled:upstream-ok\n"), "{diag}");
    assert!(out.contains(&format!("tcp:id=4242 rcode=0 an=1 addr={addr}\n")), "{diag}");
    assert!(out.contains("tcprefused:id=4242 rcode=3 an=0"), "NXDOMAIN over TCP: {diag}");
    assert!(out.contains("https:id=4242 rcode=0 an=0"), "HTTPS: NODATA: {diag}");

    let lines = world.audit_lines("resolver");
    let dns: Vec<_> = lines.iter().filter(|l| l["method"] == "DNS").collect();
    let find = |host: &str, qtype: &str| {
        dns.iter()
            .find(|l| l["host"] == host && l["qtype"] == qtype)
            .unwrap_or_else(|| panic!("no DNS line for {host} {qtype}: {dns:#?}"))
    };
    let a = find("allowed.test", "A");
    assert_eq!((a["allowed"].as_bool(), a["reason"].as_str()), (Some(true), Some("allowed")));
    assert_eq!(a["answer"], addr.as_str());
    assert!(a["seq"].as_u64().is_some() && a["user_id"].as_str().is_some(), "{a}");
    let refused = find("refused.test", "A");
    assert_eq!(refused["allowed"], false);
    assert_eq!(refused["reason"], "not_allowed");
    assert_eq!(refused["answer"], "NXDOMAIN");
    assert_eq!(find("allowed.test", "AAAA")["answer"], "NODATA");
    assert_eq!(find("allowed.test", "HTTPS")["answer"], "NODATA");
    // The explicit-proxy attempts with the synthetic address are decided as the name.
    let proxied: Vec<_> =
        lines.iter().filter(|l| l["method"] != "DNS" && l["host"] == "allowed.test").collect();
    assert!(proxied.len() >= 2 && proxied.iter().all(|l| l["allowed"] == true), "{lines:#?}");
    // Nothing is resolved at query time, and a refused name never: the test resolver's log
    // holds the allowed name (asked when the proxy dialed it) and never the refused one.
    let asked = std::fs::read_to_string(&queried).unwrap_or_default();
    assert!(asked.contains("allowed.test"), "the log must work before absence counts: {asked}");
    assert!(!asked.contains("refused.test"), "{asked}");
}
