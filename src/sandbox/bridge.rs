//! The seam between the host-side supervisor and whoever serves the proxy: hand over the
//! in-namespace listener with the session's facts, and say when the session ended. The real
//! implementation registers the session with `airlockd` (which validates the fd, serves the
//! proxy on it and writes the audit and session records); tests use the bridges below.

use std::path::PathBuf;

use crate::sys::fdpass::Handover;

/// What the daemon needs to know about a session.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SessionInfo {
    /// Globally unique session id.
    pub session: String,
    pub repo_name: String,
    pub repo_path: PathBuf,
    pub command: Vec<String>,
    pub user_id: Option<String>,
    /// The agent `airlock run` started, and its version (None for `exec`).
    pub agent: Option<String>,
    pub agent_version: Option<String>,
    /// Layers in force (mandatory, then optional).
    pub layers: Vec<String>,
    /// Optional layers that were not available.
    pub missing_layers: Vec<String>,
}

/// How a session ended.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct SessionEnd {
    pub exit_code: i32,
    /// What the end-of-session sweep took out of the way, and what else it found.
    pub quarantined: Vec<crate::protocol::Quarantined>,
    pub leftovers: crate::protocol::Leftovers,
    /// Transcript files the session created or changed, hashed after it ended (`run`).
    pub transcripts: Vec<crate::protocol::TranscriptHash>,
    /// A container session its proxy container stopped (`[audit]` bounds): the reason code,
    /// for the end record (a native session's daemon knows it itself).
    pub stopped: Option<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BridgeError(pub String);

/// Hands the sandbox's sockets to whoever serves them.
pub trait ProxyBridge {
    /// Takes ownership of the sockets made inside the sandbox's netns: the proxy listener
    /// (127.0.0.1:8888), the resolver's (127.0.0.53:53 UDP and TCP) and the capture listener
    /// (127.0.0.1:8889).
    fn start(&mut self, sockets: Handover, info: &SessionInfo) -> Result<(), BridgeError>;
    /// Registers a container session (`--backend docker|podman`): no socket, the proxy is
    /// the container `container` names. Bridges that serve a proxy themselves cannot.
    fn start_container(
        &mut self,
        info: &SessionInfo,
        container: crate::protocol::ContainerSpec,
    ) -> Result<(), BridgeError> {
        let _ = (info, container);
        Err(BridgeError("this bridge cannot register a container session".into()))
    }
    /// The session is over.
    fn end(&mut self, end: &SessionEnd);
    /// A descriptor that becomes readable when whoever serves the proxy stops the session
    /// (`[audit] session_budget`, `min_free`): the supervisor then kills the sandbox. `None`:
    /// this bridge never stops a session.
    fn stop_fd(&self) -> Option<std::os::fd::OwnedFd> {
        None
    }
    /// Why the session was stopped, once [`ProxyBridge::stop_fd`] became readable.
    fn stopped(&self) -> Option<Stopped> {
        None
    }
    /// Where `--port` connections are reported for their `inbound` audit lines, once the
    /// session started. `None`: this bridge cannot audit them, so `--port` is refused.
    fn inbound(&self) -> Option<std::sync::Arc<dyn super::ports::InboundReport>> {
        None
    }
}

/// The proxy's side stopped the session: its audit reason code and the message for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stopped {
    /// `audit_budget` or `low_space`.
    pub reason: String,
    pub message: String,
}

/// Test-only bridges, chosen with `AIRLOCK_TEST_PROXY_BRIDGE`.
#[cfg(feature = "test-hooks")]
pub mod test {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;

    pub const VAR: &str = "AIRLOCK_TEST_PROXY_BRIDGE";

    /// `hold`: keeps the listener open and never serves it (network-escape tests: nothing but
    /// the listener exists). `respond`: answers every connection with a fixed HTTP response
    /// naming itself, proving the listener reached the host side. `record:PATH`: like `hold`,
    /// and appends what `session_end` would carry to PATH as one JSON line.
    #[derive(Debug)]
    pub struct TestBridge {
        respond: bool,
        held: Option<Handover>,
        record: Option<PathBuf>,
        session: String,
    }

    impl TestBridge {
        pub fn new(mode: &str) -> Option<Self> {
            let with =
                |respond, record| Self { respond, held: None, record, session: String::new() };
            match mode {
                "hold" => Some(with(false, None)),
                "respond" => Some(with(true, None)),
                _ => mode.strip_prefix("record:").map(|p| with(false, Some(PathBuf::from(p)))),
            }
        }
    }

    impl ProxyBridge for TestBridge {
        fn start(&mut self, sockets: Handover, info: &SessionInfo) -> Result<(), BridgeError> {
            self.session = info.session.clone();
            if !self.respond {
                self.held = Some(sockets);
                return Ok(());
            }
            let listener = TcpListener::from(sockets.proxy);
            let session = info.session.clone();
            std::thread::spawn(move || {
                for mut conn in listener.incoming().flatten() {
                    let mut buf = [0u8; 4096];
                    let _ = conn.read(&mut buf);
                    let body = format!("airlock-test-bridge session={session}\n");
                    let _ = write!(
                        conn,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                }
            });
            Ok(())
        }
        fn end(&mut self, end: &SessionEnd) {
            self.held = None;
            if let Some(path) = &self.record {
                let line = serde_json::json!({ "session": self.session, "end": end });
                if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path)
                {
                    let _ = writeln!(f, "{line}");
                }
            }
        }
    }
}
