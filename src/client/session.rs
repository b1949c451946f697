//! A session registered with the daemon: the supervisor's [`SessionHandle`], its watcher
//! thread, and re-registration with the next daemon instance (SECURITY §4).

use std::io::{self, Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::{CONNECT_TIMEOUT, Client, ClientError, Endpoint, REQUEST_TIMEOUT};
use crate::protocol::{
    self, ErrorCode, FrameBuf, FrameError, Request, Response, SessionEnd, SessionSpec,
};
use crate::sys::fdpass::{Handover, SocketKind};
use nix::fcntl::OFlag;

/// How a session ended, for `session_end`.
#[derive(Debug, Clone, Default)]
pub struct SessionOutcome {
    pub exit_status: Option<i32>,
    pub transcripts: Vec<protocol::TranscriptHash>,
    pub quarantined: Vec<protocol::Quarantined>,
    pub leftovers: protocol::Leftovers,
    /// A container session stopped by its proxy's `[audit]` bounds: the reason code.
    pub stopped: Option<String>,
}

struct Shared {
    client: Client,
    /// The encoded `session_end`, once the supervisor asked to end.
    pending_end: Option<Vec<u8>>,
    /// The handle was dropped without `end`: let the daemon see the supervisor go.
    abandoned: bool,
    /// The daemon's `session_stopped` (capability `session_stop`), once it came.
    stopped: Option<SessionStop>,
    /// Encoded `session_inbound` requests whose write failed (the daemon was gone): sent to
    /// the next instance right after re-registering, before a pending `session_end`.
    pending_inbound: Vec<Vec<u8>>,
}

/// The daemon stopped the session (`[audit] session_budget` or `min_free`): its audit reason
/// code and the message for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionStop {
    pub reason: String,
    pub message: String,
}

/// A session registered with the daemon (the supervisor's handle, SECURITY §4).
///
/// A watcher thread holds the control connection; if the daemon dies, it re-registers the
/// session (same id, a dup of the listener) with the next instance. Dropping the handle without
/// [`SessionHandle::end`] closes the connection, which the daemon records as
/// `end_reason: "supervisor_lost"`.
pub struct SessionHandle {
    id: String,
    shared: Arc<Mutex<Shared>>,
    replies: mpsc::Receiver<Result<Response, FrameError>>,
    boots: Arc<Mutex<Vec<String>>>,
    /// Read end of a pipe the watcher writes one byte to when the daemon stops the session.
    stop_r: OwnedFd,
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle").field("id", &self.id).finish_non_exhaustive()
    }
}

/// The user and repo layers as parsed documents, from a session spec that names them by
/// content ([`protocol::PolicyLayers::sources`]): what a daemon without the `layer_digests`
/// capability needs instead. Supplied by the caller (the CLI parses; this module does not).
pub type Documents =
    Arc<dyn Fn(&protocol::PolicyLayers) -> Result<protocol::PolicyLayers, String> + Send + Sync>;

fn register(
    endpoint: &Endpoint,
    spec: &SessionSpec,
    documents: Option<&Documents>,
    sockets: Option<&Handover>,
    reregister: bool,
) -> Result<(Client, String, String), ClientError> {
    let mut client = endpoint.connect()?;
    let mut spec = spec.clone();
    // A container session hands over nothing; only a daemon that knows such sessions may get
    // one (an older one would ask for the listener).
    if spec.container.is_some() && !client.capabilities.contains(protocol::CONTAINER_SESSIONS) {
        return Err(ClientError::Unexpected(
            "the running airlockd is too old for --backend docker|podman (no container_sessions \
             capability); restart it (`airlock service restart`, or end its sessions and let it \
             idle out)"
                .into(),
        ));
    }
    // Several sockets only to a daemon that agreed to `session_sockets`: an older one would
    // take the last fd for the proxy listener. Without it the sandbox has no resolver (its
    // sockets are closed with the supervisor's copies) and the explicit proxy works as before.
    let all = sockets.map(|s| offered(&client.capabilities, s)).unwrap_or_default();
    spec.sockets = if client.capabilities.contains(protocol::SESSION_SOCKETS) && sockets.is_some() {
        all.iter().map(|(k, _)| k.name().to_string()).collect()
    } else {
        Vec::new()
    };
    let fds: Vec<_> = all.into_iter().map(|(_, fd)| fd).collect();
    // Layers by content: first by digest alone (the daemon parsed them for an earlier session),
    // with their text only when it does not hold them. A daemon without the capability gets
    // parsed documents, as every daemon before it did.
    let mut texts = None;
    if !spec.config.sources.is_empty() {
        if client.capabilities.contains(protocol::LAYER_DIGESTS) {
            let mut bare = spec.config.sources.clone();
            for source in &mut bare {
                source.text = None;
            }
            texts = Some(std::mem::replace(&mut spec.config.sources, bare));
        } else {
            let documents = documents.ok_or_else(|| {
                ClientError::Unexpected(
                    "airlockd does not take layers by digest and no documents were given".into(),
                )
            })?;
            spec.config = documents(&spec.config).map_err(ClientError::Unexpected)?;
        }
    }
    // A daemon that predates gates would drop `[gate]` from documents and let gated attempts
    // through unheld; one that parses the texts itself refuses the unknown table instead.
    let gated = [&spec.config.user, &spec.config.repo]
        .into_iter()
        .flatten()
        .any(|doc| !doc.gate.is_empty());
    if gated && !client.capabilities.contains(protocol::GATES) {
        return Err(ClientError::Unexpected(
            "the policy has [gate] entries but the running airlockd does not hold gated \
             attempts; restart it from this airlock build (`systemctl --user restart \
             airlockd.socket`) before starting a session"
                .into(),
        ));
    }
    // An older daemon would ignore the phase and apply the plain lists.
    if let Some(phase) = &spec.phase
        && !client.capabilities.contains(protocol::PHASES)
    {
        return Err(ClientError::Unexpected(format!(
            "--phase {phase} needs an airlockd that knows phases; restart it from this airlock \
             build (`systemctl --user restart airlockd.socket`) before starting a session"
        )));
    }
    // An older daemon would let `airlock gate approve` decide a relayed session's gates
    // locally, past the review server's rules.
    if spec.gate_relay.is_some() && !client.capabilities.contains(protocol::GATE_RELAY) {
        return Err(ClientError::Unexpected(
            "this session's gates are decided on your review server, but the running airlockd \
             cannot relay them; restart it from this airlock build (`systemctl --user restart \
             airlockd.socket`) before starting a session"
                .into(),
        ));
    }
    let request = |spec: &SessionSpec| {
        let spec = Box::new(spec.clone());
        if reregister { Request::SessionReregister(spec) } else { Request::SessionStart(spec) }
    };
    let mut reply = client.call(&request(&spec), &fds)?;
    let unknown = matches!(reply, Response::Error { code: ErrorCode::UnknownLayer, .. });
    if unknown && let Some(texts) = texts {
        spec.config.sources = texts;
        reply = client.call(&request(&spec), &fds)?;
    }
    match reply {
        Response::SessionStarted { session, boot, .. } => Ok((client, session, boot)),
        Response::Error { code, message } => Err(ClientError::Refused { code, message }),
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

/// The sockets to hand a daemon whose agreed capabilities are `caps`, in wire order.
///
/// Several sockets only under `session_sockets`: an older daemon would take the last fd for
/// the proxy listener. Without it the sandbox has no resolver (its sockets are closed with the
/// supervisor's copies) and the explicit proxy works as before. The IPv6 capture listener only
/// under `capture_tcp6`: otherwise the sandbox's IPv6 connections wait in its backlog,
/// unserved (they never leave the sandbox). The UDP log socket only under `capture_udp_log`:
/// without it the sandbox still refuses UDP other than DNS (the rule is the sandbox's), but the
/// refusals are not audited. Either kind sent to a daemon that does not know it would refuse
/// the whole session.
fn offered<'a>(
    caps: &protocol::Capabilities,
    sockets: &'a Handover,
) -> Vec<(SocketKind, std::os::fd::BorrowedFd<'a>)> {
    if !caps.contains(protocol::SESSION_SOCKETS) {
        return vec![(SocketKind::Proxy, sockets.proxy.as_fd())];
    }
    let v6 = caps.contains(protocol::CAPTURE_TCP6);
    let udp_log = caps.contains(protocol::CAPTURE_UDP_LOG);
    let mut all = sockets.borrowed();
    all.retain(|(k, _)| match k {
        SocketKind::CaptureTcp6 => v6,
        SocketKind::CaptureUdpLog => udp_log,
        _ => true,
    });
    all
}

impl SessionHandle {
    /// Registers a session: sends `spec` and the sandbox's sockets (created inside the
    /// sandbox's network namespace: the proxy listener, and the resolver and capture sockets
    /// where the daemon takes them) to the daemon, which validates them, applies its own
    /// managed layer, writes the start record and serves the proxy and resolver on them.
    pub fn start(
        endpoint: Endpoint,
        spec: SessionSpec,
        sockets: impl Into<Handover>,
    ) -> Result<Self, ClientError> {
        Self::start_with_documents(endpoint, spec, None, sockets)
    }

    /// [`SessionHandle::start`] for a spec whose layers travel by content
    /// (`spec.config.sources`): `documents` turns them into parsed documents for a daemon
    /// without the `layer_digests` capability (this one or the next instance).
    pub fn start_with_documents(
        endpoint: Endpoint,
        spec: SessionSpec,
        documents: Option<Documents>,
        sockets: impl Into<Handover>,
    ) -> Result<Self, ClientError> {
        Self::register_session(endpoint, spec, documents, Some(sockets.into()))
    }

    /// Registers a container session (`spec.container` set): no socket travels, the proxy is
    /// the session's proxy container. The daemon writes the start and end records as for any
    /// session; re-registration with a new daemon instance works the same way.
    pub fn start_container(
        endpoint: Endpoint,
        spec: SessionSpec,
        documents: Option<Documents>,
    ) -> Result<Self, ClientError> {
        if spec.container.is_none() {
            return Err(ClientError::Unexpected("start_container without a container".into()));
        }
        Self::register_session(endpoint, spec, documents, None)
    }

    fn register_session(
        endpoint: Endpoint,
        mut spec: SessionSpec,
        documents: Option<Documents>,
        listener: Option<Handover>,
    ) -> Result<Self, ClientError> {
        if spec.airlock_version.is_empty() {
            spec.airlock_version = env!("CARGO_PKG_VERSION").into();
        }
        let (client, id, boot) =
            register(&endpoint, &spec, documents.as_ref(), listener.as_ref(), false)?;
        spec.session = Some(id.clone());
        let reader = client.stream.try_clone().map_err(|e| ClientError::Frame(e.into()))?;
        let _ = reader.set_read_timeout(None);
        let shared = Arc::new(Mutex::new(Shared {
            client,
            pending_end: None,
            abandoned: false,
            stopped: None,
            pending_inbound: Vec::new(),
        }));
        let boots = Arc::new(Mutex::new(vec![boot]));
        let (tx, rx) = mpsc::channel();
        let (stop_r, stop_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|e| ClientError::Frame(io::Error::from(e).into()))?;
        let (sh, bt) = (Arc::clone(&shared), Arc::clone(&boots));
        let stop = Stop { shared: Arc::clone(&shared), fd: stop_w };
        std::thread::Builder::new()
            .name(format!("airlock-session-{id}"))
            .spawn(move || watch(endpoint, spec, documents, listener, reader, sh, bt, tx, stop))
            .map_err(|e| ClientError::Frame(e.into()))?;
        Ok(Self { id, shared, replies: rx, boots, stop_r })
    }

    /// A descriptor that becomes readable once the daemon stopped the session (then
    /// [`SessionHandle::stopped`] says why); the supervisor polls it beside the sandbox's stdio.
    pub fn stop_fd(&self) -> io::Result<OwnedFd> {
        self.stop_r.try_clone()
    }

    /// Where the supervisor reports `--port` connections, when the daemon agreed to
    /// `session_inbound`; `None` otherwise (the caller then refuses `--port`).
    pub fn inbound_reporter(&self) -> Option<InboundReporter> {
        let s = self.shared.lock().ok()?;
        s.client
            .capabilities
            .contains(protocol::SESSION_INBOUND)
            .then(|| InboundReporter { shared: Arc::clone(&self.shared) })
    }

    /// The daemon's `session_stopped`, if it came.
    pub fn stopped(&self) -> Option<SessionStop> {
        self.shared.lock().ok().and_then(|s| s.stopped.clone())
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The daemon instances this session has been registered with, oldest first.
    pub fn boots(&self) -> Vec<String> {
        self.boots.lock().map(|b| b.clone()).unwrap_or_default()
    }

    /// Sends `session_end` and waits for the daemon to write the end record.
    pub fn end(self, outcome: SessionOutcome) -> Result<(), ClientError> {
        let req = Request::SessionEnd(SessionEnd {
            session: self.id.clone(),
            exit_status: outcome.exit_status,
            transcripts: outcome.transcripts,
            quarantined: outcome.quarantined,
            leftovers: outcome.leftovers,
            stopped: outcome.stopped,
        });
        let bytes = protocol::encode(&req)?;
        {
            let mut s = self
                .shared
                .lock()
                .map_err(|_| ClientError::Unexpected("session state poisoned".into()))?;
            // If this write is lost with the daemon, the watcher resends it after re-registering.
            let _ = s.client.stream.write_all(&bytes);
            s.pending_end = Some(bytes);
        }
        match self.replies.recv_timeout(CONNECT_TIMEOUT + REQUEST_TIMEOUT) {
            Ok(Ok(Response::SessionEnded { .. })) => Ok(()),
            Ok(Ok(Response::Error { code, message })) => {
                Err(ClientError::Refused { code, message })
            }
            Ok(Ok(other)) => Err(ClientError::Unexpected(format!("{other:?}"))),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => Err(ClientError::Unexpected("airlockd did not confirm session_end".into())),
        }
    }
}

impl Drop for SessionHandle {
    fn drop(&mut self) {
        if let Ok(mut s) = self.shared.lock()
            && s.pending_end.is_none()
        {
            s.abandoned = true;
            // Closing our side is how the daemon learns the supervisor is gone.
            let _ = s.client.stream.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// Sends `session_inbound` records on the session's connection (capability
/// `session_inbound`); the daemon writes the `inbound` lines. A record whose write fails (the
/// daemon is being replaced) is kept and sent after re-registration.
#[derive(Clone)]
pub struct InboundReporter {
    shared: Arc<Mutex<Shared>>,
}

impl std::fmt::Debug for InboundReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InboundReporter")
    }
}

impl InboundReporter {
    pub fn send(&self, record: protocol::InboundRecord) {
        let bytes = match protocol::encode(&Request::SessionInbound(record)) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!("cannot encode an inbound connection's record: {e}");
                return;
            }
        };
        let Ok(mut s) = self.shared.lock() else { return };
        if !s.pending_inbound.is_empty() || s.client.stream.write_all(&bytes).is_err() {
            s.pending_inbound.push(bytes);
        }
    }
}

/// Where the watcher records a `session_stopped` and wakes the supervisor.
struct Stop {
    shared: Arc<Mutex<Shared>>,
    fd: OwnedFd,
}

impl Stop {
    fn record(&self, reason: String, message: String) {
        if let Ok(mut s) = self.shared.lock() {
            s.stopped.get_or_insert(SessionStop { reason, message });
        }
        // One byte is enough (the pipe is never drained); EAGAIN means it is already readable.
        let _ = nix::unistd::write(&self.fd, b"!");
    }
}

/// The watcher: forwards replies and records a `session_stopped`; on a lost daemon,
/// re-registers with the next instance.
#[allow(clippy::too_many_arguments)] // one thread's whole state, moved in once
fn watch(
    endpoint: Endpoint,
    mut spec: SessionSpec,
    documents: Option<Documents>,
    listener: Option<Handover>,
    mut reader: UnixStream,
    shared: Arc<Mutex<Shared>>,
    boots: Arc<Mutex<Vec<String>>>,
    tx: mpsc::Sender<Result<Response, FrameError>>,
    stop: Stop,
) {
    let mut frames = FrameBuf::new();
    loop {
        let mut buf = [0u8; 4096];
        let lost = match reader.read(&mut buf) {
            Ok(0) => true,
            Ok(n) => {
                frames.extend(&buf[..n]);
                while let Ok(Some(resp)) = frames.next_message::<Response>() {
                    // A stopping daemon says so before closing; the EOF that follows triggers
                    // re-registration. Anything else answers our `session_end`.
                    if matches!(resp, Response::Error { code: ErrorCode::Stopping, .. }) {
                        continue;
                    }
                    // Unsolicited (capability `session_stop`), never a reply.
                    if let Response::SessionStopped { reason, message, .. } = resp {
                        stop.record(reason, message);
                        continue;
                    }
                    // Unsolicited (capability `phases`): a re-registration resumes in it.
                    if let Response::PhaseChanged { phase, .. } = resp {
                        spec.phase = phase;
                        continue;
                    }
                    // The answer to a `session_inbound`, never to `session_end`.
                    if let Response::InboundRecorded { written, error, .. } = resp {
                        if !written {
                            tracing::warn!(
                                "airlockd did not write an inbound connection's audit line: {}",
                                error.unwrap_or_default()
                            );
                        }
                        continue;
                    }
                    let ending = shared.lock().map(|s| s.pending_end.is_some()).unwrap_or(true);
                    if !ending {
                        continue;
                    }
                    let done = matches!(resp, Response::SessionEnded { .. });
                    if tx.send(Ok(resp)).is_err() || done {
                        return;
                    }
                }
                false
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => false,
            Err(_) => true,
        };
        if !lost {
            continue;
        }
        if shared.lock().map(|s| s.abandoned).unwrap_or(true) {
            return;
        }
        // The daemon went away (crash, kill -9, SIGTERM): re-register with the next instance.
        let mut backoff = Duration::from_millis(10);
        loop {
            match register(&endpoint, &spec, documents.as_ref(), listener.as_ref(), true) {
                Ok((client, _, boot)) => {
                    let Ok(r) = client.stream.try_clone() else { return };
                    let _ = r.set_read_timeout(None);
                    reader = r;
                    frames = FrameBuf::new();
                    if let Ok(mut b) = boots.lock() {
                        b.push(boot);
                    }
                    let Ok(mut s) = shared.lock() else { return };
                    s.client = client;
                    for bytes in std::mem::take(&mut s.pending_inbound) {
                        let _ = s.client.stream.write_all(&bytes);
                    }
                    if let Some(bytes) = s.pending_end.clone() {
                        let _ = s.client.stream.write_all(&bytes);
                    }
                    break;
                }
                Err(e) => {
                    eprintln!(
                        "airlock: re-registering session {} with airlockd: {e}",
                        spec.session.as_deref().unwrap_or("?")
                    );
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::fd::OwnedFd;

    #[test]
    fn each_optional_socket_goes_only_to_a_daemon_offering_its_capability() {
        let fd = || OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let n = SocketKind::ALL.len();
        let all = Handover::from_named(&SocketKind::ALL, (0..n).map(|_| fd()).collect()).unwrap();
        let kinds = |caps: &[&str]| -> Vec<SocketKind> {
            let caps: protocol::Capabilities = caps.iter().copied().collect();
            offered(&caps, &all).into_iter().map(|(k, _)| k).collect()
        };
        use SocketKind::*;
        assert_eq!(kinds(&[]), [Proxy]);
        assert_eq!(kinds(&[protocol::CAPTURE_UDP_LOG]), [Proxy], "needs session_sockets");
        assert_eq!(kinds(&[protocol::SESSION_SOCKETS]), [Proxy, DnsUdp, DnsTcp, CaptureTcp]);
        assert_eq!(
            kinds(&[protocol::SESSION_SOCKETS, protocol::CAPTURE_TCP6]),
            [Proxy, DnsUdp, DnsTcp, CaptureTcp, CaptureTcp6]
        );
        assert_eq!(
            kinds(&[protocol::SESSION_SOCKETS, protocol::CAPTURE_UDP_LOG]),
            [Proxy, DnsUdp, DnsTcp, CaptureTcp, CaptureUdpLog]
        );
        let current = protocol::Capabilities::current();
        let names: Vec<&str> = SocketKind::ALL.iter().map(|k| k.name()).collect();
        let caps: Vec<&str> = names.iter().copied().filter(|n| current.contains(n)).collect();
        assert_eq!(caps, ["capture_tcp6", "capture_udp_log"], "every optional kind has one");
        assert_eq!(offered(&current, &all).len(), n);
    }
}
