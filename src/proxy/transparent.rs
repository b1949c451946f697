//! Transparent capture (issue 14): TCP connections from inside the sandbox to any non-loopback
//! address, redirected by the sandbox's nftables rule ([`crate::sys::netfilter`]) to the capture
//! listener (127.0.0.1:8889, and [::1]:8889 for IPv6 where the sandbox has it). Each accepted
//! connection's original destination comes back from conntrack (`SO_ORIGINAL_DST`,
//! `IP6T_SO_ORIGINAL_DST` on the IPv6 listener); a synthetic address of the session maps back
//! to its name; from there it is a `CONNECT` without the head: the same policy decision for
//! (name-or-IP, port) — IP literals, IPv6 ones included, follow the IP-literal rules —, the
//! same address guard, dial, SNI check (where the CONNECT path does it), splice and final line.
//! Every line carries `"capture": "transparent"`; `method` is `CONNECT` so the line is shaped
//! like a tunnel's.
//!
//! There is no HTTP to answer a refusal with: the audit line is written first, then the
//! connection is reset (`SO_LINGER` 0, socket(7)), so the client fails at once instead of
//! waiting for a response. A connection made straight to the listener (no redirect, so no
//! original destination) is refused the same way, reason `malformed`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::audit::{AuditLine, Capture};
use crate::policy::{Host, LayerKind, Reason};

use super::connect::{finish, ms_since, read_client_hello, relay};
use super::{SessionProxy, guard, respond};

/// Maps an address a connection was made to back to the name the sandbox's resolver handed out
/// for it (a synthetic address), or `None` for a real address.
pub trait SyntheticNames: Send + Sync {
    fn name_for(&self, ip: IpAddr) -> Option<String>;
}

/// No synthetic addresses: every destination is an IP literal.
#[derive(Debug, Default)]
pub struct NoSynthetic;

impl SyntheticNames for NoSynthetic {
    fn name_for(&self, _ip: IpAddr) -> Option<String> {
        None
    }
}

/// Serves the capture listener until `shutdown` (the same drain as [`super::serve_session`]).
pub async fn serve_capture(
    listener: TcpListener,
    session: Arc<SessionProxy>,
    names: Arc<dyn SyntheticNames>,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    super::serve_with(
        listener,
        Arc::clone(&session),
        shutdown,
        move |s, sock| {
            let names = Arc::clone(&names);
            async move { handle(&s, sock, names.as_ref()).await }
        },
        super::OverCap::Reset,
    )
    .await
}

/// Serves a session's handed-over capture listener (if its sandbox sent one) in the background
/// until `shutdown`; the daemon's session start calls this. `None` in, `None` out.
pub fn serve_in_background(
    listener: Option<std::net::TcpListener>,
    session: &Arc<SessionProxy>,
    shutdown: &watch::Receiver<bool>,
) -> Option<tokio::task::JoinHandle<()>> {
    let listener = listener?;
    let listener =
        match listener.set_nonblocking(true).and_then(|()| TcpListener::from_std(listener)) {
            Ok(l) => l,
            Err(e) => {
                // The sandbox's redirected connections then fail (nothing accepts them): refused,
                // never unchecked.
                tracing::error!("cannot serve the capture listener: {e}");
                return None;
            }
        };
    let (s, rx) = (Arc::clone(session), shutdown.clone());
    let names = synthetic_names();
    Some(tokio::spawn(async move {
        if let Err(e) = serve_capture(listener, s, names, rx).await {
            tracing::error!("capture listener failed: {e}");
        }
    }))
}

/// Extra synthetic-address names, consulted before the session's own table (the sandbox
/// resolver's, `SessionProxy::synthetic`). None in production. With `test-hooks`,
/// `AIRLOCK_TEST_SYNTHETIC` names a file of `ADDRESS NAME` lines (announced loudly).
fn synthetic_names() -> Arc<dyn SyntheticNames> {
    #[cfg(feature = "test-hooks")]
    if let Some(file) = std::env::var_os("AIRLOCK_TEST_SYNTHETIC") {
        tracing::warn!("TEST HOOK: synthetic addresses from {}", file.to_string_lossy());
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let map: std::collections::HashMap<IpAddr, String> = text
            .lines()
            .filter_map(|l| {
                let (ip, name) = l.trim().split_once(char::is_whitespace)?;
                Some((ip.parse().ok()?, name.trim().to_owned()))
            })
            .collect();
        return Arc::new(TestSynthetic(map));
    }
    Arc::new(NoSynthetic)
}

#[cfg(feature = "test-hooks")]
struct TestSynthetic(std::collections::HashMap<IpAddr, String>);

#[cfg(feature = "test-hooks")]
impl SyntheticNames for TestSynthetic {
    fn name_for(&self, ip: IpAddr) -> Option<String> {
        self.0.get(&ip).cloned()
    }
}

/// Where a captured connection was going, as the policy sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// The original destination: a synthetic address's name, or the IP literal.
    Target(Host, u16),
    /// Made straight to the listener: nothing was redirected.
    Direct(SocketAddr),
}

/// The policy's view of a captured connection's original destination (`None`: made straight
/// to the listener at `local`).
pub fn destination(
    orig: Option<SocketAddr>,
    local: SocketAddr,
    names: &dyn SyntheticNames,
) -> Destination {
    match orig {
        None => Destination::Direct(local),
        Some(sa) => {
            // An IPv4-mapped IPv6 destination is the IPv4 address (the guard's rules are per
            // address, not per socket family).
            let ip = match sa.ip() {
                IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
                v4 => v4,
            };
            let host = match names.name_for(ip) {
                Some(name) => Host::Name(name),
                None => Host::Ip(ip),
            };
            Destination::Target(host, sa.port())
        }
    }
}

/// One captured connection, from accept to its final line (its connection slot is claimed by
/// [`super::serve_with`], as for the explicit proxy).
pub async fn handle(session: &Arc<SessionProxy>, sock: TcpStream, names: &dyn SyntheticNames) {
    let started = Instant::now();
    let _ = sock.set_nodelay(true);
    let Ok(local) = sock.local_addr() else { return };
    let orig = match crate::sys::netfilter::original_dst(&sock, local.is_ipv6()) {
        Ok(o) => o,
        Err(e) => {
            tracing::warn!("captured connection without an original destination: {e}");
            None
        }
    };
    let (host, port) = match destination(orig, local, names) {
        // A synthetic address of this session stands for its name; another session's is
        // refused like in a CONNECT target (`super::synthetic`).
        Destination::Target(h, p) => match session.synthetic.target(h) {
            Ok(h) => (h, p),
            Err(addr) => {
                let mut line = new_line(session, &addr.to_string(), p);
                line.reason = Some(Reason::IpNotAllowed);
                line.layer = Some(LayerKind::None);
                line.duration_ms = Some(ms_since(started));
                refuse(session, sock, &line, false);
                return;
            }
        },
        Destination::Direct(at) => {
            let mut line = new_line(session, &at.ip().to_string(), at.port());
            line.reason = Some(Reason::Malformed);
            line.layer = Some(LayerKind::None);
            line.duration_ms = Some(ms_since(started));
            refuse(session, sock, &line, false);
            return;
        }
    };
    let (mut line, policy) = respond::begin(session, &host.to_string(), Some(port), "CONNECT");
    line.capture = Some(Capture::Transparent);

    let decision = policy.decide(&host, port, &session.local());
    if !decision.is_allowed() {
        respond::set_refusal(&mut line, &decision);
        line.duration_ms = Some(ms_since(started));
        refuse(session, sock, &line, false);
        return;
    }
    let Some(_slot) = session.claim_tunnel() else {
        line.reason = Some(Reason::TunnelLimit);
        line.layer = Some(LayerKind::None);
        line.duration_ms = Some(ms_since(started));
        refuse(session, sock, &line, false);
        return;
    };

    respond::set_allowed(&mut line, &decision);
    if let Err(e) = session.audit.journal_open(&line) {
        tracing::error!("cannot journal captured connection {}: {e}", line.id);
        reset(sock);
        return;
    }
    let reached =
        super::gatehold::reach(session, &policy, &mut line, &host, port, None, Some(&sock)).await;
    let (upstream, addr) = match reached {
        Ok(r) => r,
        Err(why) => {
            let _ = respond::set_unreachable(&mut line, &why);
            line.duration_ms = Some(ms_since(started));
            refuse(session, sock, &line, true);
            return;
        }
    };
    line.addr = Some(addr.to_string());

    let mut sock = sock;
    let mut first = Vec::new();
    if !policy.skip_sni_peek(&host, port) {
        let seen = read_client_hello(session, &mut sock, &mut first).await;
        if let Err(reason) = guard::judge_sni(&host, seen.as_ref()) {
            respond::set_failure(&mut line, reason);
            line.sni = guard::seen_sni(seen.as_ref());
            finish(session, line, started, 0, 0, None);
            reset(sock);
            return;
        }
    }

    relay(session, line, started, &sock, &upstream, first).await;
}

fn new_line(session: &SessionProxy, host: &str, port: u16) -> AuditLine {
    let mut line = respond::new_line(session, host, Some(port), "CONNECT");
    line.capture = Some(Capture::Transparent);
    line
}

/// Writes the refusal's line (appended, or closing the journal record when one was opened),
/// then resets the connection.
fn refuse(session: &SessionProxy, sock: TcpStream, line: &AuditLine, journaled: bool) {
    let written =
        if journaled { session.audit.journal_close(line) } else { session.audit.append(line) };
    if let Err(e) = written {
        tracing::error!("cannot write the audit line of captured connection {}: {e}", line.id);
    }
    reset(sock);
}

/// Closes with RST (SO_LINGER 0): the client's connect-or-read fails at once.
pub(crate) fn reset(sock: TcpStream) {
    let zero = libc::linger { l_onoff: 1, l_linger: 0 };
    if let Err(e) = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::Linger, &zero) {
        tracing::debug!("SO_LINGER 0 on a refused captured connection: {e}");
    }
    drop(sock);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    struct One(IpAddr, &'static str);
    impl SyntheticNames for One {
        fn name_for(&self, ip: IpAddr) -> Option<String> {
            (ip == self.0).then(|| self.1.to_owned())
        }
    }

    #[test]
    fn destinations_map_synthetic_addresses_to_names_and_keep_literals() {
        let names = One("198.18.0.7".parse().unwrap(), "allowed.test");
        let local: SocketAddr = "127.0.0.1:8889".parse().unwrap();
        let d = |s: &str| destination(Some(s.parse().unwrap()), local, &names);
        assert_eq!(
            d("198.18.0.7:443"),
            Destination::Target(Host::Name("allowed.test".into()), 443)
        );
        assert_eq!(
            d("10.1.2.3:443"),
            Destination::Target(Host::Ip("10.1.2.3".parse().unwrap()), 443)
        );
        assert_eq!(
            d("[::ffff:198.18.0.7]:22"),
            Destination::Target(Host::Name("allowed.test".into()), 22)
        );
        assert_eq!(destination(None, local, &names), Destination::Direct(local));
        // An IPv6 destination (IP6T_SO_ORIGINAL_DST) is an IPv6 literal, like an IPv4 one.
        let local6: SocketAddr = "[::1]:8889".parse().unwrap();
        assert_eq!(
            destination(Some("[2001:db8::1]:443".parse().unwrap()), local6, &names),
            Destination::Target(Host::Ip("2001:db8::1".parse().unwrap()), 443)
        );
        assert_eq!(destination(None, local6, &names), Destination::Direct(local6));
    }

    use std::sync::Mutex;
    use std::sync::atomic::{AtomicU64, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use crate::audit::{AuditError, AuditSink, Stamp};
    use crate::policy::{Entry, EntryKind, Policy, PolicyLayer};
    use crate::proxy::resolver::FileResolver;
    use crate::proxy::{Identity, Limits};

    #[derive(Default)]
    struct Sink(Mutex<Vec<(&'static str, AuditLine)>>, AtomicU64);
    impl AuditSink for Sink {
        fn stamp(&self) -> Stamp {
            let seq = self.1.fetch_add(1, Ordering::Relaxed) + 1;
            Stamp { id: format!("t-{seq}"), session: "s".into(), boot: "b".into(), seq }
        }
        fn append(&self, line: &AuditLine) -> Result<(), AuditError> {
            self.0.lock().unwrap().push(("append", line.clone()));
            Ok(())
        }
        fn journal_open(&self, line: &AuditLine) -> Result<(), AuditError> {
            self.0.lock().unwrap().push(("open", line.clone()));
            Ok(())
        }
        fn journal_close(&self, line: &AuditLine) -> Result<(), AuditError> {
            self.0.lock().unwrap().push(("close", line.clone()));
            Ok(())
        }
    }

    /// Waits (bounded) until `sink` has a final line (append or close) for `host`.
    async fn final_line(sink: &Sink, host: &str) -> AuditLine {
        for _ in 0..500 {
            let found = sink
                .0
                .lock()
                .unwrap()
                .iter()
                .rev()
                .find_map(|(k, l)| (*k != "open" && l.host == host).then(|| l.clone()));
            if let Some(l) = found {
                return l;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("no final line for {host}: {:?}", sink.0.lock().unwrap());
    }

    /// Inner half of `captured_connections_are_decided_and_audited_like_connect`.
    #[test]
    #[ignore = "run by captured_connections_are_decided_and_audited_like_connect in unshare -Urn"]
    fn inner_capture_serving() {
        if !crate::sys::netfilter::inner_setup() {
            return;
        }
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let port = 18889;
            crate::sys::netfilter::install_capture(port).unwrap();
            // The upstream is on loopback, which the rule leaves alone.
            let up = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let up_port = up.local_addr().unwrap().port();
            tokio::spawn(async move {
                while let Ok((mut s, _)) = up.accept().await {
                    tokio::spawn(async move {
                        let (mut r, mut w) = s.split();
                        let _ = tokio::io::copy(&mut r, &mut w).await;
                    });
                }
            });
            let mut layer = PolicyLayer::new(LayerKind::Operator, "test.toml");
            layer.allow =
                vec![Entry::parse(&format!("allowed.test:{up_port}"), EntryKind::Allow).unwrap()];
            layer.allow_private = vec!["127.0.0.0/8".parse().unwrap()];
            let (policy, _) = Policy::build(vec![layer], Vec::new()).unwrap();
            let sink = Arc::new(Sink::default());
            let session = Arc::new(SessionProxy::new(
                Arc::new(policy),
                Arc::clone(&sink) as Arc<dyn AuditSink>,
                Arc::new(FileResolver::from_text("allowed.test 127.0.0.1\n").unwrap()),
                // Two connections at a time, so the over-cap answer can be tried below.
                Limits { max_connections: 2, ..Limits::default() },
                crate::proxy::local_addrs(),
                Identity { repo: "r".into(), repo_path: None, repo_key: None, user_id: None },
            ));
            let l = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
            let (_tx, rx) = watch::channel(false);
            let names: Arc<dyn SyntheticNames> =
                Arc::new(One("198.18.0.7".parse().unwrap(), "allowed.test"));
            tokio::spawn(serve_capture(l, Arc::clone(&session), names, rx));

            // Allowed: a synthetic address of an allowed name, spliced to the upstream.
            let mut c = TcpStream::connect(("198.18.0.7", up_port)).await.unwrap();
            c.write_all(b"ping").await.unwrap();
            let mut got = [0u8; 4];
            c.read_exact(&mut got).await.unwrap();
            assert_eq!(&got, b"ping");
            drop(c);
            let line = final_line(&sink, "allowed.test").await;
            assert!(line.allowed, "{line:?}");
            assert_eq!(line.capture, Some(Capture::Transparent));
            assert_eq!(line.method, "CONNECT");
            assert_eq!(line.port, Some(up_port));
            assert_eq!(line.addr, Some(format!("127.0.0.1:{up_port}")));
            assert_eq!(line.bytes_sent, Some(4));

            // Refused: an IP literal follows the IP-literal rules; reset after the line.
            let mut c = TcpStream::connect("10.1.2.3:443").await.unwrap();
            let mut buf = [0u8; 16];
            let n = c.read(&mut buf).await;
            assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
            let line = final_line(&sink, "10.1.2.3").await;
            assert!(!line.allowed);
            assert_eq!(line.reason, Some(Reason::IpNotAllowed));
            assert_eq!(line.capture, Some(Capture::Transparent));
            assert_eq!(line.port, Some(443));

            // Straight to the listener: refused and audited.
            let mut c = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
            let n = c.read(&mut buf).await;
            assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
            let line = final_line(&sink, "127.0.0.1").await;
            assert!(!line.allowed);
            assert_eq!(line.reason, Some(Reason::Malformed));
            assert_eq!(line.port, Some(port));

            // Past the session's connection cap: a line, then a reset, never an HTTP answer
            // (the client may be ssh or a database driver). Earlier connections' slots are
            // released just after their final lines: give them a moment.
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            let mut held = Vec::new();
            for _ in 0..2 {
                let mut c = TcpStream::connect(("198.18.0.7", up_port)).await.unwrap();
                c.write_all(b"hold").await.unwrap();
                c.read_exact(&mut got).await.unwrap();
                held.push(c);
            }
            let mut c = TcpStream::connect(("198.18.0.7", up_port)).await.unwrap();
            let mut answer = Vec::new();
            let _ = c.read_to_end(&mut answer).await;
            assert!(
                answer.is_empty(),
                "over cap must reset, got {:?}",
                String::from_utf8_lossy(&answer)
            );
            let over = final_line(&sink, "").await;
            assert_eq!(over.reason, Some(Reason::ConnectionLimit), "{over:?}");
            assert_eq!(over.capture, Some(Capture::Transparent));
            drop(held);
        });
    }

    #[test]
    fn captured_connections_are_decided_and_audited_like_connect() {
        crate::sys::netfilter::run_in_fresh_netns(
            "proxy::transparent::tests::inner_capture_serving",
        );
    }
}
