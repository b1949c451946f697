//! `--port [HOST_IP:]HOSTPORT:PORT`: a server listening inside the sandbox on `127.0.0.1:PORT`
//! made reachable from the host on `HOST_IP:HOSTPORT` (by default a per-session loopback address
//! `127.0.0.N`, N ≠ 1, so the host browser's cookies for `127.0.0.1` never go to what the agent
//! serves). Owns the option's syntax, the host-side listeners and the choice of the address,
//! PID 1's side of the channel ([`serve_request`]) and the host-side relay ([`Service`]).
//!
//! Why it is built this way:
//! - The sandbox's network namespace has only `lo`, and an unprivileged host process cannot
//!   `setns(2)` into it. A socket belongs to the namespace it was *created* in (socket(7),
//!   network_namespaces(7)), so PID 1 — the one process inside that is ours, not the agent's —
//!   creates each TCP socket that dials `127.0.0.1:PORT` and passes it out over a dedicated
//!   `SOCK_SEQPACKET` socketpair (SCM_RIGHTS, [`crate::sys::fdpass`]).
//! - Init's side is tiny and non-blocking: a request carries a port number and an id; init
//!   answers only for a port declared on the command line (it got the list at the fork), and
//!   only ever dials `127.0.0.1:PORT` with a non-blocking `connect`. The host side waits for
//!   the connection, checks its peer is `127.0.0.1:PORT`, and relays.
//! - The agent cannot use the channel: init's end is `CLOEXEC` and closed in the command before
//!   `execve` (`cloexec_fds_from(3)`); init is not dumpable, so `/proc/1/fd` is closed to the
//!   agent, and seccomp denies `pidfd_getfd` and `ptrace`. What the host connects to is decided
//!   by the host: only the declared `(HOSTPORT, PORT)` pairs, on listeners bound before the
//!   sandbox exists. The agent can only answer the connections that arrive.
//! - Landlock has no TCP rules here (dev servers on loopback keep working) and seccomp allows
//!   `AF_INET` stream sockets, so init can make these sockets after both are in force.
//! - The default address is claimed machine-wide with an abstract unix socket named after it
//!   (unix(7): released by the kernel when the session's process dies, invisible inside the
//!   sandbox's own network namespace), so two concurrent sessions never share an address even
//!   when they publish different host ports.
//! - Each connection ends as one `inbound` audit line; the daemon writes it (it owns audit
//!   writing), from the record the supervisor sends at close (capability `session_inbound`).

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Shutdown, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::protocol::InboundRecord;
use crate::sys::fdpass;

/// Sandbox ports Airlock itself listens on inside (`127.0.0.1`): never published.
pub const RESERVED_SANDBOX_PORTS: [(u16, &str); 2] = [
    (crate::sys::fdpass::PROXY_PORT, "Airlock's proxy listener"),
    (crate::sys::fdpass::CAPTURE_PORT, "Airlock's transparent-capture listener"),
];
/// How many inbound connections one session relays at once; more are refused (and audited).
pub const MAX_CONCURRENT: usize = 128;
/// How long a connection to the server inside may take before it counts as failed.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the host side waits for init's answer to one request.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(2);

/// One `--port` as written on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortSpec {
    /// `None`: the session's own loopback address (`127.0.0.N`).
    pub host_ip: Option<IpAddr>,
    pub host_port: u16,
    /// The port inside the sandbox (on `127.0.0.1`).
    pub port: u16,
}

/// A `--port` value that could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--port {value:?}: {why}; expected [HOST_IP:]HOSTPORT:PORT, e.g. --port 3000:3000")]
pub struct PortSpecError {
    pub value: String,
    pub why: String,
}

fn parse_port(s: &str, what: &str) -> Result<u16, String> {
    match s.parse::<u16>() {
        Ok(0) => Err(format!("{what} must be from 1 to 65535, found 0")),
        Ok(p) if s.starts_with('+') => Err(format!("{what} must be a plain number, found {p:?}")),
        Ok(p) => Ok(p),
        Err(_) if s.is_empty() => Err(format!("{what} is missing")),
        Err(_) => Err(format!("{what} must be a number from 1 to 65535, found {s:?}")),
    }
}

impl PortSpec {
    /// Parses `[HOST_IP:]HOSTPORT:PORT`; an IPv6 `HOST_IP` is bracketed (`[::1]:8080:80`).
    pub fn parse(value: &str) -> Result<Self, PortSpecError> {
        let err = |why: String| PortSpecError { value: value.to_string(), why };
        let (ip, rest) = if let Some(after) = value.strip_prefix('[') {
            let (ip, rest) =
                after.split_once("]:").ok_or_else(|| err("an unclosed `[` in HOST_IP".into()))?;
            let ip: std::net::Ipv6Addr =
                ip.parse().map_err(|_| err(format!("{ip:?} is not an IPv6 address")))?;
            (Some(IpAddr::V6(ip)), rest)
        } else {
            match value.matches(':').count() {
                1 => (None, value),
                2 => {
                    let (ip, rest) = value.split_once(':').unwrap_or_default();
                    let ip: Ipv4Addr = ip.parse().map_err(|_| {
                        err(format!(
                            "{ip:?} is not an IPv4 address (write an IPv6 one in brackets)"
                        ))
                    })?;
                    (Some(IpAddr::V4(ip)), rest)
                }
                0 => return Err(err("both HOSTPORT and PORT are needed".into())),
                _ => return Err(err("too many `:` (write an IPv6 HOST_IP in brackets)".into())),
            }
        };
        let (host, inside) =
            rest.split_once(':').ok_or_else(|| err("both HOSTPORT and PORT are needed".into()))?;
        let host_port = parse_port(host, "HOSTPORT").map_err(err)?;
        let port = parse_port(inside, "PORT").map_err(err)?;
        if let Some((_, what)) = RESERVED_SANDBOX_PORTS.iter().find(|(p, _)| *p == port) {
            return Err(err(format!(
                "127.0.0.1:{port} inside the sandbox is {what}, not a server of yours; publish \
                 another port"
            )));
        }
        Ok(Self { host_ip: ip, host_port, port })
    }

    /// Parses every `--port`, refusing two that would listen on the same host address.
    pub fn parse_all(values: &[String]) -> Result<Vec<Self>, PortSpecError> {
        let mut out: Vec<Self> = Vec::new();
        for v in values {
            let spec = Self::parse(v)?;
            if out.iter().any(|o| o.host_ip == spec.host_ip && o.host_port == spec.host_port) {
                return Err(PortSpecError {
                    value: v.clone(),
                    why: format!("host port {} is published twice", spec.host_port),
                });
            }
            out.push(spec);
        }
        Ok(out)
    }
}

/// Why the host side could not be set up (the session does not start: exit 125).
#[derive(Debug, thiserror::Error)]
pub enum PortsError {
    #[error(
        "cannot listen on {addr} for --port {spec}: {source}; choose another HOSTPORT (or \
         HOST_IP)"
    )]
    Bind {
        addr: SocketAddr,
        spec: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "no free per-session loopback address 127.0.0.2–127.0.0.254 for --port {0}: each is \
         taken by another session or its host port is in use; end a session or name HOST_IP"
    )]
    NoAddress(String),
    #[error("claiming a per-session loopback address: {0}")]
    Claim(#[source] io::Error),
}

fn shown(spec: &PortSpec) -> String {
    match spec.host_ip {
        Some(IpAddr::V6(ip)) => format!("[{ip}]:{}:{}", spec.host_port, spec.port),
        Some(ip) => format!("{ip}:{}:{}", spec.host_port, spec.port),
        None => format!("{}:{}", spec.host_port, spec.port),
    }
}

/// One host listener and the sandbox port it leads to.
#[derive(Debug)]
pub struct Listener {
    pub listen: SocketAddr,
    pub port: u16,
    pub socket: TcpListener,
}

/// The session's host listeners, bound before the sandbox exists, and the claim on the
/// per-session address (held as long as this lives).
#[derive(Debug)]
pub struct Published {
    pub listeners: Vec<Listener>,
    /// The per-session loopback address, when some `--port` has no HOST_IP.
    pub session_addr: Option<Ipv4Addr>,
    /// The abstract socket claiming `session_addr` (dropped with the last accept thread).
    claim: Option<std::os::unix::net::UnixListener>,
}

impl Published {
    /// The sandbox ports that init may dial.
    pub fn sandbox_ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self.listeners.iter().map(|l| l.port).collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }

    /// What the user is told before the session starts.
    pub fn announcement(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .listeners
            .iter()
            .map(|l| format!("port {} → sandbox 127.0.0.1:{}", l.listen, l.port))
            .collect();
        lines.push(
            "warning: a page opened from these ports runs in your browser with your host's own \
             network and its logins for that address; what the agent serves there is not \
             sandboxed"
                .into(),
        );
        for l in &self.listeners {
            if !l.listen.ip().is_loopback() {
                lines.push(format!(
                    "warning: {} is not a loopback address: other machines may reach the \
                     sandbox's server through it",
                    l.listen
                ));
            }
        }
        lines
    }
}

/// The abstract unix socket name that claims `ip` for one session (unix(7)).
fn claim_name(ip: Ipv4Addr) -> String {
    format!("airlock/loopback/{ip}")
}

fn claim(ip: Ipv4Addr) -> io::Result<Option<std::os::unix::net::UnixListener>> {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(claim_name(ip))?;
    match std::os::unix::net::UnixListener::bind_addr(&addr) {
        Ok(l) => Ok(Some(l)),
        Err(e) if e.kind() == io::ErrorKind::AddrInUse => Ok(None),
        Err(e) => Err(e),
    }
}

/// Binds every `--port`'s host listener. Those without HOST_IP share one per-session address
/// `127.0.0.N` (N from 2 to 254, the search starting at a place chosen by `session`), claimed
/// so that no concurrent session gets it too.
pub fn publish(specs: &[PortSpec], session: &str) -> Result<Published, PortsError> {
    let bind = |addr: SocketAddr, spec: &PortSpec| {
        TcpListener::bind(addr).map_err(|source| PortsError::Bind {
            addr,
            spec: shown(spec),
            source,
        })
    };
    let mut listeners = Vec::new();
    for spec in specs.iter().filter(|s| s.host_ip.is_some()) {
        let addr = SocketAddr::new(
            spec.host_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            spec.host_port,
        );
        listeners.push(Listener { listen: addr, port: spec.port, socket: bind(addr, spec)? });
    }
    let defaults: Vec<&PortSpec> = specs.iter().filter(|s| s.host_ip.is_none()).collect();
    if defaults.is_empty() {
        return Ok(Published { listeners, session_addr: None, claim: None });
    }
    let start = session.bytes().fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    for i in 0..253u32 {
        let n = 2 + (start.wrapping_add(i) % 253) as u8;
        let ip = Ipv4Addr::new(127, 0, 0, n);
        let Some(held) = claim(ip).map_err(PortsError::Claim)? else { continue };
        let mut bound = Vec::new();
        let mut in_use = false;
        for spec in &defaults {
            let addr = SocketAddr::V4(SocketAddrV4::new(ip, spec.host_port));
            match TcpListener::bind(addr) {
                Ok(socket) => bound.push(Listener { listen: addr, port: spec.port, socket }),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => {
                    in_use = true;
                    break;
                }
                Err(source) => {
                    return Err(PortsError::Bind { addr, spec: shown(spec), source });
                }
            }
        }
        if in_use {
            continue;
        }
        listeners.extend(bound);
        return Ok(Published { listeners, session_addr: Some(ip), claim: Some(held) });
    }
    Err(PortsError::NoAddress(defaults.iter().map(|s| shown(s)).collect::<Vec<_>>().join(", ")))
}

// ---- The channel between the supervisor and init ----
//
// Request (supervisor → init): 6 bytes, the port (u16) and an id (u32), big-endian.
// Answer (init → supervisor): the id (4 bytes), then `0` with the socket attached, or `1`
// followed by a short UTF-8 reason and no fd.

const REQUEST_LEN: usize = 6;

/// PID 1's side: answers one request waiting on `channel` (non-blocking) for one of the
/// `declared` sandbox ports. Init never blocks here: the `connect` is non-blocking and the
/// answer is dropped if the supervisor's end is full. Returns false when the supervisor is
/// gone (the channel is then useless).
pub fn serve_request(channel: BorrowedFd<'_>, declared: &[u16]) -> bool {
    let mut buf = [0u8; 64];
    // Plain recv: fds anyone attached are discarded by the kernel, never installed here.
    let n = match nix::sys::socket::recv(
        channel.as_raw_fd(),
        &mut buf,
        nix::sys::socket::MsgFlags::MSG_DONTWAIT,
    ) {
        Ok(0) => return false,
        Ok(n) => n,
        Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR) => return true,
        Err(_) => return false,
    };
    if n != REQUEST_LEN {
        return true; // not a request of ours: nothing to answer
    }
    let port = u16::from_be_bytes([buf[0], buf[1]]);
    let id = [buf[2], buf[3], buf[4], buf[5]];
    let mut answer = id.to_vec();
    let socket = if declared.contains(&port) {
        dial_inside(port)
    } else {
        Err(format!("port {port} was not published with --port"))
    };
    let _ = match socket {
        Ok(fd) => {
            answer.push(0);
            fdpass::send_with_fds(channel, &answer, &[fd.as_fd()])
        }
        Err(why) => {
            answer.push(1);
            answer.extend(why.as_bytes().iter().take(200));
            fdpass::send_with_fds(channel, &answer, &[])
        }
    };
    true
}

/// A TCP socket made in this (the sandbox's) network namespace, dialling `127.0.0.1:port`
/// without waiting.
fn dial_inside(port: u16) -> Result<OwnedFd, String> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, connect, socket};
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
        None,
    )
    .map_err(|e| format!("socket: {e}"))?;
    let to = SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
    match connect(fd.as_raw_fd(), &to) {
        Ok(()) | Err(nix::errno::Errno::EINPROGRESS) => Ok(fd),
        Err(e) => Err(format!("connecting to 127.0.0.1:{port}: {e}")),
    }
}

/// The supervisor's end of the channel: one request/answer at a time.
#[derive(Debug)]
pub struct Channel {
    fd: Mutex<(OwnedFd, u32)>,
}

impl Channel {
    pub fn new(fd: OwnedFd) -> io::Result<Self> {
        // A bounded wait per answer (socket(7) SO_RCVTIMEO).
        let tv = nix::sys::time::TimeVal::new(ANSWER_TIMEOUT.as_secs() as _, 0);
        nix::sys::socket::setsockopt(&fd, nix::sys::socket::sockopt::ReceiveTimeout, &tv)?;
        Ok(Self { fd: Mutex::new((fd, 0)) })
    }

    /// Asks init for a socket connected (or connecting) to `127.0.0.1:port` inside.
    pub fn request(&self, port: u16) -> Result<TcpStream, String> {
        let mut guard = self.fd.lock().map_err(|_| "the port channel is poisoned".to_string())?;
        guard.1 = guard.1.wrapping_add(1);
        let id = guard.1.to_be_bytes();
        let fd = guard.0.as_fd();
        let mut req = port.to_be_bytes().to_vec();
        req.extend_from_slice(&id);
        fdpass::send_with_fds(fd, &req, &[]).map_err(|e| format!("asking the sandbox: {e}"))?;
        let deadline = Instant::now() + ANSWER_TIMEOUT;
        loop {
            let mut buf = [0u8; 256];
            let mut fds = Vec::new();
            let n = fdpass::recv_with_fds(fd, &mut buf, &mut fds)
                .map_err(|e| format!("the sandbox did not answer: {e}"))?;
            if n == 0 {
                return Err("the sandbox has ended".into());
            }
            // An answer to an earlier request that timed out: dropped with its fd.
            if n < 5 || buf[..4] != id {
                if Instant::now() > deadline {
                    return Err("the sandbox did not answer in time".into());
                }
                continue;
            }
            if buf[4] != 0 {
                return Err(String::from_utf8_lossy(&buf[5..n]).into_owned());
            }
            let fd = fds.pop().ok_or("the sandbox answered without a socket")?;
            if !fds.is_empty() {
                return Err("the sandbox answered with more than one socket".into());
            }
            return Ok(TcpStream::from(fd));
        }
    }
}

/// Waits until `stream` (connecting without blocking) is connected to `127.0.0.1:port`.
fn finish_connect(stream: &TcpStream, port: u16) -> Result<(), String> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(format!("127.0.0.1:{port} inside did not accept in time"));
        }
        let ms = u16::try_from(left.as_millis()).unwrap_or(u16::MAX);
        let mut pfd = [PollFd::new(stream.as_fd(), PollFlags::POLLOUT)];
        match poll(&mut pfd, PollTimeout::from(ms)) {
            Ok(0) => continue,
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(format!("waiting for the connection: {e}")),
        }
    }
    if let Some(e) = stream.take_error().map_err(|e| e.to_string())? {
        return Err(format!("nothing accepted on 127.0.0.1:{port} inside the sandbox: {e}"));
    }
    let expected = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
    match stream.peer_addr() {
        Ok(a) if a == expected => {}
        Ok(a) => return Err(format!("the sandbox's socket is connected to {a}, not {expected}")),
        Err(e) => return Err(format!("nothing accepted on {expected} inside the sandbox: {e}")),
    }
    stream.set_nonblocking(false).map_err(|e| e.to_string())
}

/// Where the relay reports each connection once it is over (the daemon writes the line).
pub trait InboundReport: Send + Sync {
    fn report(&self, record: InboundRecord);
}

/// The host side's relay: accepts on every listener, gets a socket from init, copies bytes
/// both ways, reports each connection at close.
pub struct Service {
    stopping: Arc<AtomicBool>,
    /// Dups of the listeners, shut down to wake the accept threads.
    wake: Vec<OwnedFd>,
    accepters: Vec<std::thread::JoinHandle<()>>,
    open: Arc<AtomicUsize>,
    live: Live,
}

/// Dups of every relayed connection's sockets, by connection: shut down at the session's end
/// so a host client that keeps its connection open (a browser's keep-alive) cannot hold back
/// the connection's line past the end record.
type Live = Arc<Mutex<std::collections::HashMap<u64, Vec<OwnedFd>>>>;

impl std::fmt::Debug for Service {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Service").field("open", &self.open.load(Ordering::SeqCst)).finish()
    }
}

impl Service {
    /// Starts serving `published`'s listeners through `channel` for `session`.
    pub fn start(
        published: Published,
        channel: Channel,
        session: String,
        report: Arc<dyn InboundReport>,
    ) -> io::Result<Self> {
        let channel = Arc::new(channel);
        let stopping = Arc::new(AtomicBool::new(false));
        let open = Arc::new(AtomicUsize::new(0));
        let live: Live = Arc::default();
        let mut wake = Vec::new();
        let mut accepters = Vec::new();
        let Published { listeners, claim, .. } = published;
        let claim = Arc::new(claim);
        for l in listeners {
            wake.push(OwnedFd::from(l.socket.try_clone()?));
            let ctx = Conn {
                channel: Arc::clone(&channel),
                session: session.clone(),
                report: Arc::clone(&report),
                listen: l.listen,
                port: l.port,
                open: Arc::clone(&open),
                live: Arc::clone(&live),
            };
            let (stopping, claim) = (Arc::clone(&stopping), Arc::clone(&claim));
            accepters.push(
                std::thread::Builder::new().name(format!("airlock-port-{}", l.listen)).spawn(
                    move || {
                        let _claim = claim;
                        accept_loop(l.socket, ctx, &stopping);
                    },
                )?,
            );
        }
        Ok(Self { stopping, wake, accepters, open, live })
    }

    /// Stops accepting, gives open connections a moment to end by themselves, closes those
    /// that did not, and waits (at most `grace` in all) until each is reported.
    pub fn finish(self, grace: Duration) {
        self.stopping.store(true, Ordering::SeqCst);
        for fd in &self.wake {
            // Linux wakes a thread blocked in accept(2) on a listener that is shut down.
            let _ = nix::sys::socket::shutdown(fd.as_raw_fd(), nix::sys::socket::Shutdown::Both);
        }
        for t in self.accepters {
            let _ = t.join();
        }
        let deadline = Instant::now() + grace;
        let settle = Instant::now() + grace / 4;
        while self.open.load(Ordering::SeqCst) > 0 && Instant::now() < settle {
            std::thread::sleep(Duration::from_millis(10));
        }
        if let Ok(live) = self.live.lock() {
            for fd in live.values().flatten() {
                let _ =
                    nix::sys::socket::shutdown(fd.as_raw_fd(), nix::sys::socket::Shutdown::Both);
            }
        }
        while self.open.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

#[derive(Clone)]
struct Conn {
    channel: Arc<Channel>,
    session: String,
    report: Arc<dyn InboundReport>,
    listen: SocketAddr,
    port: u16,
    open: Arc<AtomicUsize>,
    live: Live,
}

fn accept_loop(listener: TcpListener, ctx: Conn, stopping: &AtomicBool) {
    let mut next_id = 0u64;
    loop {
        let accepted = listener.accept();
        if stopping.load(Ordering::SeqCst) {
            return;
        }
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if e.raw_os_error() == Some(libc::EMFILE)
                    || e.raw_os_error() == Some(libc::ENFILE) =>
            {
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
            Err(_) => return,
        };
        let started = (SystemTime::now(), Instant::now());
        if ctx.open.fetch_add(1, Ordering::SeqCst) >= MAX_CONCURRENT {
            ctx.open.fetch_sub(1, Ordering::SeqCst);
            drop(stream);
            ctx.report.report(ctx.record(
                peer,
                started,
                (0, 0),
                Some((
                    "connection_limit",
                    format!("more than {MAX_CONCURRENT} inbound connections at once"),
                )),
            ));
            continue;
        }
        let c = ctx.clone();
        let id = next_id;
        next_id += 1;
        let spawned =
            std::thread::Builder::new().name("airlock-port-conn".into()).spawn(move || {
                let record = c.relay(id, stream, peer, started);
                if let Ok(mut live) = c.live.lock() {
                    live.remove(&id);
                }
                c.report.report(record);
                c.open.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            ctx.open.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Conn {
    fn record(
        &self,
        peer: SocketAddr,
        (wall, t0): (SystemTime, Instant),
        (to_sandbox, from_sandbox): (u64, u64),
        failed: Option<(&str, String)>,
    ) -> InboundRecord {
        let (reason, error) = match failed {
            Some((r, e)) => (Some(r.to_string()), Some(e)),
            None => (None, None),
        };
        InboundRecord {
            session: self.session.clone(),
            ts: crate::timefmt::rfc3339_ms(wall),
            peer: peer.to_string(),
            listen: self.listen.to_string(),
            port: self.port,
            bytes_to_sandbox: to_sandbox,
            bytes_from_sandbox: from_sandbox,
            duration_ms: u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX),
            refused: reason,
            error,
        }
    }

    /// Keeps a dup of `stream` for [`Service::finish`].
    fn track(&self, id: u64, stream: &TcpStream) {
        if let (Ok(fd), Ok(mut live)) = (stream.try_clone(), self.live.lock()) {
            live.entry(id).or_default().push(OwnedFd::from(fd));
        }
    }

    fn relay(
        &self,
        id: u64,
        outside: TcpStream,
        peer: SocketAddr,
        started: (SystemTime, Instant),
    ) -> InboundRecord {
        self.track(id, &outside);
        let inside = match self.channel.request(self.port) {
            Ok(s) => s,
            Err(e) => return self.record(peer, started, (0, 0), Some(("connect_failed", e))),
        };
        if let Err(e) = finish_connect(&inside, self.port) {
            return self.record(peer, started, (0, 0), Some(("connect_failed", e)));
        }
        self.track(id, &inside);
        let (Ok(outside2), Ok(inside2)) = (outside.try_clone(), inside.try_clone()) else {
            return self.record(
                peer,
                started,
                (0, 0),
                Some(("connect_failed", "dup failed".into())),
            );
        };
        let up = std::thread::Builder::new()
            .name("airlock-port-in".into())
            .spawn(move || copy_half(outside2, inside2));
        let from_sandbox = copy_half(inside, outside);
        let to_sandbox = match up {
            Ok(t) => t.join().unwrap_or(0),
            Err(_) => 0,
        };
        self.record(peer, started, (to_sandbox, from_sandbox), None)
    }
}

/// Copies `from` to `to` until EOF or an error, then half-closes `to`; returns the bytes.
fn copy_half(mut from: TcpStream, mut to: TcpStream) -> u64 {
    let mut total = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        };
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
        total += n as u64;
    }
    let _ = to.shutdown(Shutdown::Write);
    // Our read side is done too: the other direction sees EOF once its peer stops.
    let _ = from.shutdown(Shutdown::Read);
    total
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    use proptest::prelude::*;

    fn spec(ip: Option<&str>, h: u16, p: u16) -> PortSpec {
        PortSpec { host_ip: ip.map(|i| i.parse().unwrap()), host_port: h, port: p }
    }

    #[test]
    fn the_three_forms_parse() {
        assert_eq!(PortSpec::parse("3000:3000").unwrap(), spec(None, 3000, 3000));
        assert_eq!(
            PortSpec::parse("127.0.0.9:8080:80").unwrap(),
            spec(Some("127.0.0.9"), 8080, 80)
        );
        assert_eq!(PortSpec::parse("[::1]:8080:80").unwrap(), spec(Some("::1"), 8080, 80));
    }

    #[test]
    fn bad_values_say_what_is_wrong() {
        let why = |v: &str| PortSpec::parse(v).unwrap_err().to_string();
        assert!(why("3000").contains("both HOSTPORT and PORT are needed"), "{}", why("3000"));
        assert!(why("0:80").contains("HOSTPORT must be from 1 to 65535, found 0"));
        assert!(why("80:70000").contains("PORT must be a number from 1 to 65535"));
        assert!(why("abc:80:80").contains("\"abc\" is not an IPv4 address"));
        assert!(why("::1:80:80").contains("too many `:`"));
        assert!(why("[::1:80:80").contains("unclosed"));
        assert!(why("3000:8888").contains("Airlock's proxy listener"));
        assert!(why("3000:8889").contains("transparent-capture"));
        assert!(why(":80").contains("HOSTPORT is missing"));
        assert!(why("+80:80").contains("plain number"));
        assert!(why("x:y").contains("expected [HOST_IP:]HOSTPORT:PORT"));
        let dup = PortSpec::parse_all(&["3000:1".into(), "3000:2".into()]).unwrap_err();
        assert!(dup.to_string().contains("host port 3000 is published twice"), "{dup}");
        assert!(PortSpec::parse_all(&["3000:1".into(), "127.0.0.5:3000:2".into()]).is_ok());
    }

    proptest! {
        #[test]
        fn parsing_never_panics_and_round_trips(s in "\\PC{0,40}") {
            if let Ok(p) = PortSpec::parse(&s) {
                prop_assert_eq!(PortSpec::parse(&shown(&p)).unwrap(), p);
            }
        }

        #[test]
        fn every_valid_triple_parses(a in 1u16.., b in 1u16.., ip in any::<[u8; 4]>()) {
            prop_assume!(!RESERVED_SANDBOX_PORTS.iter().any(|(p, _)| *p == b));
            let ip = Ipv4Addr::from(ip);
            prop_assert_eq!(PortSpec::parse(&format!("{a}:{b}")).unwrap(), spec(None, a, b));
            let with = PortSpec::parse(&format!("{ip}:{a}:{b}")).unwrap();
            prop_assert_eq!(with, PortSpec { host_ip: Some(IpAddr::V4(ip)), host_port: a, port: b });
        }
    }

    fn pair() -> (OwnedFd, OwnedFd) {
        socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).unwrap()
    }

    /// Runs init's side for one request on its own thread (init's end is non-blocking there).
    fn serve_once(init: OwnedFd, declared: Vec<u16>) -> std::thread::JoinHandle<OwnedFd> {
        std::thread::spawn(move || {
            let mut pfd = [nix::poll::PollFd::new(init.as_fd(), nix::poll::PollFlags::POLLIN)];
            nix::poll::poll(&mut pfd, nix::poll::PollTimeout::from(5000u16)).unwrap();
            assert!(serve_request(init.as_fd(), &declared));
            init
        })
    }

    #[test]
    fn init_dials_a_declared_port_and_refuses_any_other() {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = server.local_addr().unwrap().port();
        let other = TcpListener::bind("127.0.0.1:0").unwrap();
        let other_port = other.local_addr().unwrap().port();
        let (ours, init) = pair();
        let channel = Channel::new(ours).unwrap();
        // A declared port: a socket connected to it.
        let t = serve_once(init, vec![port]);
        let s = channel.request(port).unwrap();
        let init = t.join().unwrap();
        finish_connect(&s, port).unwrap();
        let (mut accepted, _) = server.accept().unwrap();
        (&s).write_all(b"hi").unwrap();
        let mut got = [0u8; 2];
        accepted.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hi");
        // A port that was not declared (a real server listens there): no socket, a reason.
        let t = serve_once(init, vec![port]);
        let err = channel.request(other_port).unwrap_err();
        let _init = t.join().unwrap();
        assert!(err.contains(&format!("port {other_port} was not published")), "{err}");
        other.set_nonblocking(true).unwrap();
        assert!(other.accept().is_err(), "init must not have dialled the undeclared port");
    }

    #[test]
    fn init_ignores_what_is_not_a_request_and_drops_attached_fds() {
        let (ours, init) = pair();
        let devnull = std::fs::File::open("/dev/null").unwrap();
        fdpass::send_with_fds(ours.as_fd(), b"garbage!", &[devnull.as_fd()]).unwrap();
        assert!(serve_request(init.as_fd(), &[80]));
        // Nothing was answered.
        let mut buf = [0u8; 16];
        let r = nix::sys::socket::recv(
            ours.as_raw_fd(),
            &mut buf,
            nix::sys::socket::MsgFlags::MSG_DONTWAIT,
        );
        assert_eq!(r, Err(nix::errno::Errno::EAGAIN));
        // A closed supervisor end ends the service.
        drop(ours);
        assert!(!serve_request(init.as_fd(), &[80]));
    }

    #[test]
    fn nothing_listening_inside_is_a_connect_failure() {
        let free = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let (ours, init) = pair();
        let channel = Channel::new(ours).unwrap();
        let t = serve_once(init, vec![port]);
        let res = channel.request(port).and_then(|s| finish_connect(&s, port));
        drop(t.join());
        let err = res.unwrap_err();
        assert!(err.contains("127.0.0.1"), "{err}");
    }

    #[test]
    fn two_publications_get_different_session_addresses() {
        let a = publish(&[spec(None, 0, 80)], "session-a");
        // Host port 0 is refused by the parser; here it lets the kernel choose, so the test
        // never collides with a real listener.
        let a = a.unwrap();
        let b = publish(&[spec(None, 0, 80)], "session-a").unwrap();
        let (ia, ib) = (a.session_addr.unwrap(), b.session_addr.unwrap());
        assert_ne!(ia, ib, "the same start, yet the claim moves the second session on");
        assert_ne!(ia, Ipv4Addr::LOCALHOST);
        assert_ne!(ib, Ipv4Addr::LOCALHOST);
        assert!(a.announcement()[0].starts_with(&format!("port {ia}:")));
        drop(a);
        // Released with its holder.
        let c = publish(&[spec(None, 0, 80)], "session-a").unwrap();
        assert_eq!(c.session_addr.unwrap(), ia);
    }

    struct Collect(Mutex<Vec<InboundRecord>>);
    impl InboundReport for Collect {
        fn report(&self, record: InboundRecord) {
            self.0.lock().unwrap().push(record);
        }
    }

    #[test]
    fn the_relay_serves_reports_and_closes_what_is_left_open_at_the_end() {
        // "Inside": an echo-ish server that answers one line and keeps its connection open.
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = server.local_addr().unwrap().port();
        std::thread::spawn(move || {
            for mut c in server.incoming().flatten() {
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    let n = c.read(&mut buf).unwrap_or(0);
                    let _ = c.write_all(&buf[..n]);
                    let _ = c.write_all(b"!");
                    std::thread::sleep(Duration::from_secs(30)); // never closes by itself
                });
            }
        });
        let (ours, init) = pair();
        nix::fcntl::fcntl(&init, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
            .unwrap();
        std::thread::spawn(move || {
            loop {
                let mut pfd = [nix::poll::PollFd::new(init.as_fd(), nix::poll::PollFlags::POLLIN)];
                let _ = nix::poll::poll(&mut pfd, nix::poll::PollTimeout::NONE);
                if !serve_request(init.as_fd(), &[port]) {
                    return;
                }
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let listen = listener.local_addr().unwrap();
        let published = Published {
            listeners: vec![Listener { listen, port, socket: listener }],
            session_addr: None,
            claim: None,
        };
        let collect = Arc::new(Collect(Mutex::new(Vec::new())));
        let service = Service::start(
            published,
            Channel::new(ours).unwrap(),
            "s1".into(),
            Arc::clone(&collect) as Arc<dyn InboundReport>,
        )
        .unwrap();
        let mut client = TcpStream::connect(listen).unwrap();
        client.write_all(b"hello").unwrap();
        let mut got = [0u8; 6];
        client.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello!");
        // The client keeps its connection open, like a browser; the end still reports it.
        let t0 = Instant::now();
        service.finish(Duration::from_secs(2));
        assert!(t0.elapsed() < Duration::from_secs(3));
        let records = collect.0.lock().unwrap().clone();
        assert_eq!(records.len(), 1, "{records:?}");
        let r = &records[0];
        assert_eq!((r.port, r.bytes_to_sandbox, r.bytes_from_sandbox), (port, 5, 6), "{r:?}");
        assert_eq!(r.listen, listen.to_string());
        assert_eq!(r.peer, client.local_addr().unwrap().to_string());
        assert!(r.refused.is_none(), "{r:?}");
        // The listener is closed: nothing is accepted after the end.
        assert!(TcpStream::connect(listen).is_err());
    }
}
