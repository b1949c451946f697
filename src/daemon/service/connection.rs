//! One control connection: the peer checks (uid, namespaces), framing and fd passing, and
//! [`handle_request`], the dispatch of one request against the connection's state — which
//! needs no socket, so it is unit-tested directly.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::{AsyncWriteExt, Interest};
use tokio::net::UnixStream;

use super::session::{end_session, start_session};
use super::state::{Daemon, Session, blocking, may_quit};
use crate::protocol::{self, ErrorCode, FrameBuf, FrameError, Request, Response, SessionEnd};
use crate::sys::fdpass;

/// What a connection has negotiated and owns, apart from its socket.
#[derive(Debug, Default)]
pub(super) struct ConnState {
    /// Fds that arrived with the request being handled.
    pub(super) fds: Vec<OwnedFd>,
    /// The negotiated protocol; `None` before hello, `Some(None)` when none is shared.
    pub(super) version: Option<Option<u32>>,
    /// The capabilities in force on this connection (agreed at hello).
    pub(super) capabilities: protocol::Capabilities,
    pub(super) session: Option<Arc<Session>>,
    /// The session's `session_stopped` was sent (at most once per connection).
    pub(super) stop_sent: bool,
    /// The owned session's phase switches, told to its supervisor under `phases`.
    pub(super) phase_rx: Option<tokio::sync::watch::Receiver<Option<String>>>,
}

/// Waits for the next switch of the session's phase; its `phase_changed` message.
async fn phase_notice(
    rx: &mut Option<tokio::sync::watch::Receiver<Option<String>>>,
    session: &str,
) -> Response {
    let Some(rx) = rx.as_mut() else { return std::future::pending().await };
    if rx.changed().await.is_err() {
        return std::future::pending().await;
    }
    let phase = rx.borrow_and_update().clone();
    Response::PhaseChanged { session: session.to_owned(), phase }
}

/// Waits until the session is stopped; its `session_stopped` message (`None` if the sink went
/// away without a stop, which then never comes).
async fn stop_notice(
    stopped: &mut Option<(String, tokio::sync::watch::Receiver<Option<crate::audit::StopNotice>>)>,
) -> Option<Response> {
    let (session, rx) = stopped.as_mut()?;
    let notice = rx.wait_for(Option::is_some).await.ok().and_then(|n| n.clone());
    let Some(notice) = notice else { return std::future::pending().await };
    Some(Response::SessionStopped {
        session: session.clone(),
        reason: notice.reason.as_str().to_owned(),
        message: notice.message,
    })
}

/// Per-connection I/O.
struct Conn {
    stream: UnixStream,
    frames: FrameBuf,
    state: ConnState,
}

impl Conn {
    async fn send(&mut self, resp: &Response) -> Result<(), FrameError> {
        let bytes = protocol::encode(resp)?;
        self.stream.write_all(&bytes).await?;
        Ok(())
    }

    /// Closes after a final error: half-close, then discard what the peer still sends (briefly),
    /// so unread input does not turn our close into a reset that hides the error (unix(7)).
    async fn close_gracefully(&mut self) {
        let _ = self.stream.shutdown().await;
        let drain = async {
            let mut buf = [0u8; 4096];
            let mut total = 0usize;
            while let Ok(n) = tokio::io::AsyncReadExt::read(&mut self.stream, &mut buf).await {
                total += n;
                if n == 0 || total > 1 << 20 {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_millis(500), drain).await;
    }

    /// Reads one chunk (and any fds sent with it). `Ok(false)` = EOF.
    async fn read_chunk(&mut self) -> Result<bool, FrameError> {
        let mut buf = [0u8; 16 * 1024];
        let fds = &mut self.state.fds;
        let stream = &self.stream;
        let n = stream
            .async_io(Interest::READABLE, || fdpass::recv_with_fds(stream.as_fd(), &mut buf, fds))
            .await?;
        self.frames.extend(&buf[..n]);
        Ok(n > 0)
    }
}

pub(super) fn error(code: ErrorCode, message: impl Into<String>) -> Response {
    Response::Error { code, message: message.into() }
}

pub(super) async fn handle_connection(daemon: &Arc<Daemon>, stream: UnixStream) {
    let mut conn = Conn { stream, frames: FrameBuf::new(), state: ConnState::default() };
    // Peer uid on every accept (SO_PEERCRED, unix(7)).
    let me = nix::unistd::geteuid().as_raw();
    match conn.stream.peer_cred() {
        Ok(cred) if cred.uid() == me => {}
        Ok(cred) => {
            let msg = format!(
                "refused: this airlockd serves uid {me}; the connecting process runs as uid {}",
                cred.uid()
            );
            tracing::warn!("{msg}");
            let _ = conn.send(&error(ErrorCode::PeerUid, msg)).await;
            conn.close_gracefully().await;
            return;
        }
        Err(err) => {
            tracing::warn!("cannot read peer credentials: {err}");
            return;
        }
    }
    // Same user and network namespace as ours, or nothing is served (SECURITY §7): a sandboxed
    // process that reaches the socket (say, through a bad mount) must not speak the protocol.
    // stat(2)s under /proc: off the runtime, on a duplicate of the socket's descriptor.
    let peer_check = match conn.stream.as_fd().try_clone_to_owned() {
        Ok(fd) => blocking(move || {
            crate::sys::peer::check_same_namespaces(fd.as_fd()).map(drop).map_err(|e| e.to_string())
        })
        .await
        .and_then(|r| r),
        Err(e) => Err(format!("cannot inspect the peer: {e}")),
    };
    if let Err(err) = peer_check {
        tracing::warn!("refused a control connection: {err}");
        let msg = format!(
            "refused: airlockd serves only processes in its own user and network namespaces; \
             {err}. Run airlock in the same namespaces as airlockd."
        );
        let _ = conn.send(&error(ErrorCode::PeerNamespace, msg)).await;
        conn.close_gracefully().await;
        return;
    }
    let mut stop = daemon.stop_tx.subscribe();
    loop {
        let req = match conn.frames.next_message::<Request>() {
            Ok(Some(req)) => req,
            Ok(None) => {
                // A stopped session (`[audit]` bounds) is told so once, between replies, when
                // the client agreed to `session_stop`.
                let mut stopped = conn
                    .state
                    .session
                    .as_ref()
                    .filter(|_| {
                        !conn.state.stop_sent
                            && conn.state.capabilities.contains(protocol::SESSION_STOP)
                    })
                    .map(|s| (s.id.clone(), s.stopped.clone()));
                // A phase switch of the owned session is told between replies too (`phases`).
                let session_id = conn.state.session.as_ref().map(|s| s.id.clone());
                let mut phase_rx = conn
                    .state
                    .phase_rx
                    .take()
                    .filter(|_| conn.state.capabilities.contains(protocol::PHASES));
                let watching = phase_rx.is_some() && session_id.is_some();
                // Re-evaluated per chunk: once stopping, a connection closes only between
                // requests, so a request that is partly read still gets its answer.
                let got = tokio::select! {
                    biased;
                    r = conn.read_chunk() => Ok(Some(r)),
                    _ = stop.wait_for(|s| *s), if !conn.frames.is_partial() => Ok(None),
                    notice = stop_notice(&mut stopped), if stopped.is_some() => Err(notice),
                    changed = phase_notice(&mut phase_rx, session_id.as_deref().unwrap_or("")),
                        if watching && !conn.frames.is_partial() => Err(Some(changed)),
                };
                conn.state.phase_rx = phase_rx;
                let got = match got {
                    Ok(got) => got,
                    Err(Some(notice @ Response::PhaseChanged { .. })) => {
                        if conn.send(&notice).await.is_err() {
                            break;
                        }
                        continue;
                    }
                    Err(notice) => {
                        conn.state.stop_sent = true;
                        if let Some(resp) = notice
                            && conn.send(&resp).await.is_err()
                        {
                            break;
                        }
                        continue;
                    }
                };
                let Some(got) = got else {
                    let _ =
                        conn.send(&error(ErrorCode::Stopping, "airlockd is stopping; retry")).await;
                    conn.close_gracefully().await;
                    return;
                };
                match got {
                    Ok(true) => continue,
                    Ok(false) | Err(FrameError::Io(_)) => break,
                    Err(e) => {
                        let _ = conn.send(&error(ErrorCode::Protocol, e.to_string())).await;
                        conn.close_gracefully().await;
                        break;
                    }
                }
            }
            Err(e) => {
                let _ = conn.send(&error(ErrorCode::Protocol, e.to_string())).await;
                break;
            }
        };
        let resp = handle_request(daemon, &mut conn.state, req).await;
        // Fds belong to the request they arrived with; any left over are closed.
        conn.state.fds.clear();
        if conn.send(&resp).await.is_err() {
            break;
        }
    }
    // The connection is gone. A session it still owns lost its supervisor — unless we are the
    // ones stopping, in which case the supervisor re-registers with the next instance.
    let stopping = *daemon.stop_tx.borrow();
    if let Some(session) = conn.state.session.take()
        && !stopping
    {
        end_session(
            daemon,
            &session,
            &SessionEnd { session: session.id.clone(), ..Default::default() },
            Some("supervisor_lost"),
        )
        .await;
    }
}

/// Answers one request: the version handshake first, then status and session requests.
pub(super) async fn handle_request(
    daemon: &Arc<Daemon>,
    conn: &mut ConnState,
    req: Request,
) -> Response {
    match (&conn.version, req) {
        (None, Request::Hello { protocol, capabilities, .. }) => {
            let shared = daemon.protocol.shared(protocol);
            conn.version = Some(shared);
            conn.capabilities = protocol::Capabilities::agreed(
                shared,
                &protocol::Capabilities::current(),
                &capabilities,
            );
            Response::Hello {
                version: shared,
                protocol: daemon.protocol,
                daemon_version: daemon.version.clone(),
                pid: std::process::id(),
                boot: daemon.boot.clone(),
                sessions: daemon.session_count(),
                capabilities: conn.capabilities.clone(),
            }
        }
        (None, _) => error(ErrorCode::Protocol, "the first request must be hello"),
        (Some(_), Request::Hello { .. }) => error(ErrorCode::Protocol, "hello was already sent"),
        (Some(_), Request::QuitIfIdle) => {
            let sessions = daemon.session_count();
            // This connection is the only one, and nothing else runs.
            let quitting =
                may_quit(sessions, daemon.tunnels(), daemon.conns.load(Ordering::SeqCst));
            if quitting {
                daemon.quit.notify_one();
            }
            Response::QuitIfIdle { quitting, sessions }
        }
        (Some(None), _) => error(
            ErrorCode::Protocol,
            format!("no shared protocol version (airlockd speaks {})", daemon.protocol),
        ),
        (Some(Some(_)), Request::Status) => {
            let d = Arc::clone(daemon);
            let config_error = match blocking(move || d.config_check().err()).await {
                Ok(e) => e,
                Err(e) => Some(e),
            };
            Response::Status(Box::new(daemon.status(config_error)))
        }
        (Some(Some(_)), Request::SessionStart(spec)) => {
            start_session(daemon, conn, *spec, false).await
        }
        (Some(Some(_)), Request::SessionReregister(spec)) => {
            start_session(daemon, conn, *spec, true).await
        }
        (Some(Some(_)), Request::SessionInbound(rec)) => record_inbound(conn, rec).await,
        (Some(Some(_)), Request::GateList { .. } | Request::GateDecide(_))
            if !conn.capabilities.contains(protocol::GATES) =>
        {
            error(
                ErrorCode::Protocol,
                "gate requests need the `gates` capability; offer it in hello",
            )
        }
        (Some(Some(_)), Request::GateList { after, wait_ms }) => {
            gate_list(daemon, after, wait_ms).await
        }
        (Some(Some(_)), Request::GateDecide(d)) => gate_decide(daemon, &d),
        (Some(Some(_)), Request::PhaseSet { .. })
            if !conn.capabilities.contains(protocol::PHASES) =>
        {
            error(ErrorCode::Protocol, "phase_set needs the `phases` capability; offer it in hello")
        }
        (Some(Some(_)), Request::PhaseSet { session, phase }) => {
            super::phase::phase_set(daemon, &session, phase).await
        }
        (Some(Some(_)), Request::SessionEnd(end)) => match conn.session.take() {
            Some(s) if s.id == end.session => {
                // A container session's proxy is not the daemon's: its stop is the CLI's word
                // (a native session's is the daemon's own, never taken from the client).
                use crate::policy::Reason;
                let stopped = s
                    .spec
                    .container
                    .as_ref()
                    .and(end.stopped.as_deref())
                    .and_then(|code| {
                        [Reason::AuditBudget, Reason::LowSpace]
                            .into_iter()
                            .find(|r| r.as_str() == code)
                    })
                    .map(Reason::as_str);
                end_session(daemon, &s, &end, stopped).await;
                Response::SessionEnded { session: end.session }
            }
            other => {
                conn.session = other;
                error(
                    ErrorCode::Session,
                    format!("session {:?} is not owned by this connection", end.session),
                )
            }
        },
    }
}

/// The pending gates; with `after`, once the book moved past that version (or the wait, at
/// most [`protocol::MAX_GATE_WAIT_MS`], ran out, or the daemon is stopping).
async fn gate_list(daemon: &Arc<Daemon>, after: Option<u64>, wait_ms: Option<u64>) -> Response {
    let (version, gates) = match after {
        None => daemon.gates.list(),
        Some(after) => {
            let wait = Duration::from_millis(
                wait_ms.unwrap_or(protocol::MAX_GATE_WAIT_MS).min(protocol::MAX_GATE_WAIT_MS),
            );
            let mut stop = daemon.stop_tx.subscribe();
            tokio::select! {
                got = daemon.gates.wait_change(after, wait) => got,
                _ = stop.wait_for(|s| *s) => daemon.gates.list(),
            }
        }
    };
    Response::Gates { version, gates }
}

/// Decides one pending gate. A local decision through the control socket is the local
/// user's own: without a review server the requester is the only person there is, so it is a
/// self-decision and marked so (docs/gates.md). A session relayed to a review server takes
/// only its supervisor's relayed decisions (the book checks the relay key).
fn gate_decide(daemon: &Daemon, d: &protocol::GateDecision) -> Response {
    if d.by.trim().is_empty() {
        return error(ErrorCode::Protocol, "gate_decide needs `by`: who decides");
    }
    match daemon.gates.decide(d, crate::timefmt::rfc3339_ms(std::time::SystemTime::now())) {
        Ok(_) => Response::GateDecided {
            id: d.id.clone(),
            state: if d.approve && !d.relay.as_ref().is_some_and(|r| r.unavailable) {
                protocol::GateState::Approved
            } else {
                protocol::GateState::Denied
            },
            self_decided: d.relay.as_ref().is_none_or(|r| r.self_decided),
        },
        Err(
            e @ (crate::gate::book::DecideError::Relayed { .. }
            | crate::gate::book::DecideError::NotRelayed(_)),
        ) => error(ErrorCode::GateRelayed, e.to_string()),
        Err(e @ crate::gate::book::DecideError::Unknown(_)) => {
            error(ErrorCode::UnknownGate, e.to_string())
        }
        Err(e @ crate::gate::book::DecideError::Digest { .. }) => {
            error(ErrorCode::GateDigest, e.to_string())
        }
    }
}

/// Writes the `inbound` line of one `--port` connection of the session this connection owns.
/// Always answered with `inbound_recorded` (see [`protocol::SESSION_INBOUND`]).
async fn record_inbound(conn: &ConnState, rec: protocol::InboundRecord) -> Response {
    let refused = |why: String| {
        tracing::warn!("session_inbound not recorded: {why}");
        Response::InboundRecorded { session: rec.session.clone(), written: false, error: Some(why) }
    };
    if !conn.capabilities.contains(protocol::SESSION_INBOUND) {
        return refused("session_inbound was not agreed on this connection".into());
    }
    let Some(session) = conn.session.as_ref().filter(|s| s.id == rec.session) else {
        return refused(format!("session {:?} is not owned by this connection", rec.session));
    };
    let line = match super::inbound::line_for(&session.proxy, &rec) {
        Ok(line) => line,
        Err(why) => return refused(why),
    };
    let proxy = Arc::clone(&session.proxy);
    match blocking(move || proxy.audit.append(&line).map_err(|e| e.to_string())).await {
        Ok(Ok(())) => {
            Response::InboundRecorded { session: rec.session, written: true, error: None }
        }
        Ok(Err(e)) | Err(e) => {
            tracing::error!("cannot write the inbound audit line of {}: {e}", rec.listen);
            refused(e)
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::daemon::service::state::tests::{daemon, spec};
    use crate::protocol::{SessionSpec, VersionRange};

    fn hello() -> Request {
        Request::Hello {
            protocol: VersionRange::CURRENT,
            client_version: "test".into(),
            capabilities: Default::default(),
        }
    }

    fn code(r: &Response) -> ErrorCode {
        match r {
            Response::Error { code, .. } => *code,
            other => panic!("expected an error, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_stopped_session_is_announced_with_its_reason_and_message() {
        let (tx, rx) = tokio::sync::watch::channel(None);
        let mut stopped = Some(("s1".to_owned(), rx));
        tx.send_replace(Some(crate::audit::StopNotice {
            reason: crate::policy::Reason::LowSpace,
            message: "the file system … min_free".into(),
        }));
        assert_eq!(
            stop_notice(&mut stopped).await,
            Some(Response::SessionStopped {
                session: "s1".into(),
                reason: "low_space".into(),
                message: "the file system … min_free".into(),
            })
        );
        // Only agreed on request: the daemon offers the capability, a client may not.
        assert!(protocol::Capabilities::current().contains(protocol::SESSION_STOP));
        let mut conn = ConnState::default();
        let home = tempfile::tempdir().unwrap();
        let d = daemon(home.path());
        handle_request(&d, &mut conn, hello()).await;
        assert!(!conn.capabilities.contains(protocol::SESSION_STOP));
    }

    #[tokio::test]
    async fn gates_are_listed_and_decided_once_bound_to_their_digest() {
        let home = tempfile::tempdir().unwrap();
        let d = daemon(home.path());
        // Without the capability agreed, gate requests are refused.
        let mut plain = ConnState::default();
        handle_request(&d, &mut plain, hello()).await;
        let r = handle_request(&d, &mut plain, Request::GateList { after: None, wait_ms: None });
        assert_eq!(code(&r.await), ErrorCode::Protocol);

        let mut conn = ConnState::default();
        let offer = Request::Hello {
            protocol: VersionRange::CURRENT,
            client_version: "test".into(),
            capabilities: protocol::Capabilities::current(),
        };
        handle_request(&d, &mut conn, offer).await;
        assert!(conn.capabilities.contains(protocol::GATES));
        let info = protocol::GateInfo {
            id: String::new(),
            kind: "egress".into(),
            session: "s1".into(),
            repo: "r".into(),
            repo_key: None,
            user_id: None,
            method: "CONNECT".into(),
            host: "pay.test".into(),
            port: 443,
            request: None,
            action: "{}".into(),
            digest: "sha256:aa".into(),
            severity: "medium".into(),
            rule: "pay.test".into(),
            layer: "user".into(),
            policy: "~/.airlock/config.toml".into(),
            requested_at: "2026-12-04T00:00:00.000Z".into(),
            deadline: "2026-12-04T00:01:50.000Z".into(),
            relay: None,
        };
        let mut ticket = d.gates.open(info).unwrap();
        // A waiting list returns at once when the book is already past `after`.
        let listed = handle_request(
            &d,
            &mut conn,
            Request::GateList { after: Some(0), wait_ms: Some(60_000) },
        );
        let Response::Gates { version, gates } = listed.await else { panic!() };
        assert_eq!((version, gates.len()), (1, 1));
        let id = gates[0].id.clone();
        let decide = |digest: &str, by: &str| {
            Request::GateDecide(protocol::GateDecision {
                id: id.clone(),
                digest: digest.into(),
                approve: true,
                note: "ok".into(),
                by: by.into(),
                relay: None,
            })
        };
        assert_eq!(
            code(&handle_request(&d, &mut conn, decide("sha256:bb", "me")).await),
            ErrorCode::GateDigest
        );
        assert_eq!(
            code(&handle_request(&d, &mut conn, decide("sha256:aa", " ")).await),
            ErrorCode::Protocol
        );
        let r = handle_request(&d, &mut conn, decide("sha256:aa", "me")).await;
        assert_eq!(
            r,
            Response::GateDecided {
                id: id.clone(),
                state: protocol::GateState::Approved,
                self_decided: true
            }
        );
        let got = ticket.decided().await.unwrap();
        assert!(got.approve && got.self_decided && got.by == "me" && got.note == "ok");
        assert_eq!(
            code(&handle_request(&d, &mut conn, decide("sha256:aa", "me")).await),
            ErrorCode::UnknownGate
        );
        // A wait with nothing new ends after its (short) wait.
        let listed =
            handle_request(&d, &mut conn, Request::GateList { after: Some(9), wait_ms: Some(10) });
        let Response::Gates { gates, .. } = listed.await else { panic!() };
        assert!(gates.is_empty());
    }

    #[tokio::test]
    async fn session_inbound_is_always_answered_and_written_only_for_the_owned_session() {
        let home = tempfile::tempdir().unwrap();
        let d = daemon(home.path());
        let rec = protocol::InboundRecord {
            session: "s1".into(),
            ts: "2026-07-24T18:03:11.482Z".into(),
            peer: "127.0.0.1:5000".into(),
            listen: "127.0.0.7:3000".into(),
            port: 3000,
            ..Default::default()
        };
        let written = |r: Response| match r {
            Response::InboundRecorded { written, error, .. } => (written, error),
            other => panic!("never an error reply: {other:?}"),
        };
        // Not agreed on this connection.
        let mut conn = ConnState::default();
        handle_request(&d, &mut conn, hello()).await;
        let r = handle_request(&d, &mut conn, Request::SessionInbound(rec.clone())).await;
        assert!(written(r).1.unwrap().contains("not agreed"));
        // Agreed, but the connection owns no session (or another one).
        let offer = Request::Hello {
            protocol: VersionRange::CURRENT,
            client_version: "test".into(),
            capabilities: protocol::Capabilities::current(),
        };
        let mut conn = ConnState::default();
        handle_request(&d, &mut conn, offer).await;
        assert!(conn.capabilities.contains(protocol::SESSION_INBOUND));
        let r = handle_request(&d, &mut conn, Request::SessionInbound(rec.clone())).await;
        assert!(written(r).1.unwrap().contains("not owned"));
        conn.session = Some(crate::daemon::service::state::tests::session("s1", "t"));
        let r = handle_request(&d, &mut conn, Request::SessionInbound(rec.clone())).await;
        assert_eq!(written(r), (true, None));
        let bad = protocol::InboundRecord { listen: "nowhere".into(), ..rec };
        let r = handle_request(&d, &mut conn, Request::SessionInbound(bad)).await;
        assert!(!written(r).0);
    }

    #[tokio::test]
    async fn hello_comes_first_and_only_once() {
        let home = tempfile::tempdir().unwrap();
        let d = daemon(home.path());
        let mut conn = ConnState::default();
        assert_eq!(
            code(&handle_request(&d, &mut conn, Request::Status).await),
            ErrorCode::Protocol
        );
        match handle_request(&d, &mut conn, hello()).await {
            Response::Hello { version, boot, sessions, .. } => {
                assert_eq!(version, Some(VersionRange::CURRENT.max));
                assert_eq!(boot, d.boot);
                assert_eq!(sessions, 0);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(code(&handle_request(&d, &mut conn, hello()).await), ErrorCode::Protocol);
        match handle_request(&d, &mut conn, Request::Status).await {
            Response::Status(s) => assert_eq!((s.boot.as_str(), s.sessions.len()), (&*d.boot, 0)),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn without_a_shared_version_only_quit_if_idle_is_served() {
        let home = tempfile::tempdir().unwrap();
        let d = daemon(home.path());
        let mut conn = ConnState::default();
        let too_new = VersionRange { min: d.protocol.max + 1, max: d.protocol.max + 1 };
        let hello = Request::Hello {
            protocol: too_new,
            client_version: "future".into(),
            capabilities: Default::default(),
        };
        match handle_request(&d, &mut conn, hello).await {
            Response::Hello { version, .. } => assert_eq!(version, None),
            other => panic!("{other:?}"),
        }
        let r = handle_request(&d, &mut conn, Request::Status).await;
        assert_eq!(code(&r), ErrorCode::Protocol);
        d.conns.fetch_add(1, Ordering::SeqCst); // this connection
        match handle_request(&d, &mut conn, Request::QuitIfIdle).await {
            Response::QuitIfIdle { quitting, sessions } => {
                assert_eq!((quitting, sessions), (true, 0))
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn session_requests_are_checked_before_anything_is_served() {
        let home = tempfile::tempdir().unwrap();
        let d = daemon(home.path());
        let mut conn = ConnState::default();
        handle_request(&d, &mut conn, hello()).await;
        // No listener fd with the request.
        let r = handle_request(&d, &mut conn, Request::SessionStart(Box::new(spec()))).await;
        assert_eq!(code(&r), ErrorCode::Listener);
        let bad = SessionSpec { repo: "../x".into(), ..spec() };
        let r = handle_request(&d, &mut conn, Request::SessionStart(Box::new(bad))).await;
        assert_eq!(code(&r), ErrorCode::Session);
        let nameless = SessionSpec { session: None, ..spec() };
        let r = handle_request(&d, &mut conn, Request::SessionReregister(Box::new(nameless))).await;
        assert_eq!(code(&r), ErrorCode::Session);
        let end = SessionEnd { session: "nope".into(), ..Default::default() };
        let r = handle_request(&d, &mut conn, Request::SessionEnd(end)).await;
        assert_eq!(code(&r), ErrorCode::Session);
        assert_eq!(d.session_count(), 0);
    }

    #[tokio::test]
    async fn several_sockets_need_the_capability_and_a_matching_list() {
        let fd = || OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        let named = |names: &[&str]| SessionSpec {
            sockets: names.iter().map(|n| n.to_string()).collect(),
            ..spec()
        };
        let home = tempfile::tempdir().unwrap();
        let d = daemon(home.path());
        // Under version 2 without `session_sockets` offered: a named list is a protocol error.
        let mut old = ConnState::default();
        handle_request(&d, &mut old, hello()).await;
        assert!(!old.capabilities.contains(protocol::SESSION_SOCKETS));
        old.fds = vec![fd(), fd()];
        let r = handle_request(
            &d,
            &mut old,
            Request::SessionStart(Box::new(named(&["proxy", "dns_udp"]))),
        )
        .await;
        assert_eq!(code(&r), ErrorCode::Protocol, "{r:?}");
        // Offered: in force; then the list must match the fds, in the fixed order.
        let mut conn = ConnState::default();
        let offer = Request::Hello {
            protocol: VersionRange::CURRENT,
            client_version: "test".into(),
            capabilities: protocol::Capabilities::current(),
        };
        match handle_request(&d, &mut conn, offer).await {
            Response::Hello { capabilities, .. } => {
                assert!(capabilities.contains(protocol::SESSION_SOCKETS));
                assert!(capabilities.contains(protocol::CAPTURE_TCP6));
                assert!(capabilities.contains(protocol::CAPTURE_UDP_LOG));
            }
            other => panic!("{other:?}"),
        }
        for (names, n) in [
            (&["proxy", "dns_udp"][..], 1),
            (&["dns_udp", "proxy"][..], 2),
            (&["proxy", "proxy"][..], 2),
            (&["proxy", "dns_quic"][..], 2),
            (&["proxy", "capture_tcp6", "capture_tcp"][..], 3),
            (&["proxy", "capture_udp_log", "capture_tcp6"][..], 3),
            (&[][..], 2),
        ] {
            conn.fds = (0..n).map(|_| fd()).collect();
            let r =
                handle_request(&d, &mut conn, Request::SessionStart(Box::new(named(names)))).await;
            assert_eq!(code(&r), ErrorCode::Listener, "{names:?}: {r:?}");
        }
        // A list that fits, with fds that are no sockets: each is validated.
        conn.fds = (0..6).map(|_| fd()).collect();
        let all = named(&[
            "proxy",
            "dns_udp",
            "dns_tcp",
            "capture_tcp",
            "capture_tcp6",
            "capture_udp_log",
        ]);
        match handle_request(&d, &mut conn, Request::SessionStart(Box::new(all))).await {
            Response::Error { code, message } => {
                assert_eq!(code, ErrorCode::Listener);
                assert!(message.contains("proxy socket refused"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(d.session_count(), 0);
    }
}
