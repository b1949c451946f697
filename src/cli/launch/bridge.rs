//! The production [`ProxyBridge`]: registers the session with `airlockd` through
//! [`crate::client`] (a test-hooks build may substitute the test bridge).

use super::Prepared;
use super::gaterelay::RelayKey;
use crate::cli::Context;
use std::sync::Arc;

use crate::client::{Documents, Endpoint, SessionHandle, SessionOutcome};
use crate::env::Env;
use crate::protocol::{IdentityInfo, SessionSpec};
use crate::sandbox::bridge::{BridgeError, ProxyBridge, SessionEnd, SessionInfo, Stopped};
use crate::sys::fdpass::Handover;

/// The production bridge: registers the session with `airlockd` (activating it where DESIGN §6
/// allows), which validates the listener, applies the managed layer, writes the session
/// records and serves the proxy.
#[derive(Debug)]
pub struct DaemonBridge {
    endpoint: Option<Endpoint>,
    prepared: Prepared,
    handle: Option<SessionHandle>,
    /// `notify-send`, when a desktop session is there.
    notifier: Option<std::path::PathBuf>,
    /// Stops the gate watcher at the session's end.
    gate_watch: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// The gate relay, when the session's gates are decided on a review server.
    gate_relay: Option<super::gaterelay::RelayHandle>,
    /// Where the review-server login is read (for relaying gates).
    paths: Option<crate::paths::Paths>,
}

impl DaemonBridge {
    pub fn new(env: &dyn Env, prepared: Prepared) -> Self {
        Self {
            endpoint: Some(Endpoint::resolve(env)),
            notifier: super::gatenotice::desktop_notifier(env),
            prepared,
            handle: None,
            gate_watch: None,
            gate_relay: None,
            paths: crate::paths::Paths::from_env(env).ok(),
        }
    }

    /// The review-server client and relay key when this session's gates are decided there:
    /// the policy has gates and the user is logged in to a server. A login that cannot be
    /// used refuses the session (deciding locally instead would skip the server's rules).
    fn relay(&self) -> Result<Option<(crate::remote::Client, RelayKey)>, BridgeError> {
        let (true, Some(server)) = (self.prepared.gated, self.prepared.server.as_deref()) else {
            return Ok(None);
        };
        let paths = self.paths.as_ref().ok_or_else(|| {
            BridgeError("cannot find the home directory to read the review-server login".into())
        })?;
        let client = crate::remote::Client::from_login(paths).map_err(|e| {
            BridgeError(format!(
                "this session's policy has [gate] entries and you are logged in to the review \
                 server {server}, which decides them, but the login cannot be used: {e}; run \
                 `airlock login --server {server}` again, or `airlock logout` to decide gates on \
                 this machine"
            ))
        })?;
        let key = RelayKey::new().map_err(BridgeError)?;
        Ok(Some((client, key)))
    }

    /// Registers the session with `airlockd`: a native session hands over its sandbox's
    /// `sockets`; a container session (`container`) none.
    fn register(
        &mut self,
        sockets: Option<Handover>,
        info: &SessionInfo,
        container: Option<crate::protocol::ContainerSpec>,
    ) -> Result<(), BridgeError> {
        let endpoint =
            self.endpoint.take().ok_or_else(|| BridgeError("session already started".into()))?;
        // The supervisor's id: audit lines, session records and the quarantine directory
        // all carry the same one.
        let spec = SessionSpec {
            session: Some(info.session.clone()),
            repo: info.repo_name.clone(),
            repo_path: info.repo_path.display().to_string(),
            config: if self.prepared.by_content.sources.is_empty() {
                (&self.prepared.layers).into()
            } else {
                self.prepared.by_content.clone()
            },
            identity: IdentityInfo {
                email: self.prepared.identity.email.clone(),
                user_id: self.prepared.identity.user_id.clone(),
                server: self.prepared.server.clone(),
            },
            agent: info.agent.clone(),
            agent_version: info.agent_version.clone(),
            airlock_version: env!("CARGO_PKG_VERSION").into(),
            command: info.command.clone(),
            layers: info.layers.clone(),
            supervisor_pid: std::process::id(),
            // Filled by the client per connection (only under `session_sockets`).
            sockets: Vec::new(),
            gate_relay: None,
            phase: self.prepared.phase.clone(),
            container,
        };
        let relay = self.relay()?;
        let mut spec = spec;
        spec.gate_relay = relay.as_ref().map(|(client, key)| key.spec(client.server()));
        // For a daemon without `layer_digests`: the layers parsed from the same texts.
        let documents: Documents = Arc::new(|layers| {
            crate::config::documents_from_sources(layers).map_err(|e| e.to_string())
        });
        let watcher = self.prepared.gated.then(|| endpoint.clone());
        let handle = match sockets {
            Some(sockets) => {
                SessionHandle::start_with_documents(endpoint, spec, Some(documents), sockets)
            }
            None => SessionHandle::start_container(endpoint, spec, Some(documents)),
        }
        .map_err(|e| BridgeError(e.to_string()))?;
        self.handle = Some(handle);
        if let Some(endpoint) = watcher {
            let notifier = self.notifier.clone();
            match relay {
                Some((client, key)) => {
                    self.gate_relay = Some(super::gaterelay::spawn(super::gaterelay::RelayConfig {
                        endpoint,
                        session: info.session.clone(),
                        client,
                        key,
                        self_approve: self.prepared.gate_self_approve,
                        notifier,
                    }))
                }
                None => {
                    self.gate_watch =
                        Some(super::gatenotice::spawn(endpoint, info.session.clone(), notifier))
                }
            }
        }
        Ok(())
    }
}

impl ProxyBridge for DaemonBridge {
    fn start(&mut self, sockets: Handover, info: &SessionInfo) -> Result<(), BridgeError> {
        self.register(Some(sockets), info, None)
    }

    fn start_container(
        &mut self,
        info: &SessionInfo,
        container: crate::protocol::ContainerSpec,
    ) -> Result<(), BridgeError> {
        self.register(None, info, Some(container))
    }

    fn stop_fd(&self) -> Option<std::os::fd::OwnedFd> {
        let handle = self.handle.as_ref()?;
        match handle.stop_fd() {
            Ok(fd) => Some(fd),
            Err(e) => {
                // The session still runs; a stop then only refuses its traffic (503).
                eprintln!("airlock: warning: cannot watch for airlockd stopping the session: {e}");
                None
            }
        }
    }

    fn stopped(&self) -> Option<Stopped> {
        let s = self.handle.as_ref()?.stopped()?;
        Some(Stopped { reason: s.reason, message: s.message })
    }

    fn inbound(&self) -> Option<std::sync::Arc<dyn crate::sandbox::ports::InboundReport>> {
        let reporter = self.handle.as_ref()?.inbound_reporter()?;
        Some(std::sync::Arc::new(Reporter(reporter)))
    }

    fn end(&mut self, end: &SessionEnd) {
        if let Some(stop) = self.gate_watch.take() {
            stop.store(true, std::sync::atomic::Ordering::Release);
        }
        if let Some(relay) = self.gate_relay.take() {
            relay.finish();
        }
        if let Some(handle) = self.handle.take() {
            let outcome = SessionOutcome {
                exit_status: Some(end.exit_code),
                transcripts: end.transcripts.clone(),
                quarantined: end.quarantined.clone(),
                leftovers: end.leftovers.clone(),
                stopped: end.stopped.clone(),
            };
            if let Err(e) = handle.end(outcome) {
                eprintln!("airlock: warning: recording the session end with airlockd: {e}");
            }
        }
    }
}

struct Reporter(crate::client::InboundReporter);

impl crate::sandbox::ports::InboundReport for Reporter {
    fn report(&self, record: crate::protocol::InboundRecord) {
        self.0.send(record);
    }
}

/// The bridge a launch uses.
pub fn bridge(ctx: &Context<'_>, prepared: &Prepared) -> Box<dyn ProxyBridge> {
    #[cfg(feature = "test-hooks")]
    if let Some(mode) = ctx.env.var(crate::sandbox::bridge::test::VAR)
        && let Some(b) = crate::sandbox::bridge::test::TestBridge::new(&mode)
    {
        return Box::new(b);
    }
    Box::new(DaemonBridge::new(ctx.env, prepared.clone()))
}
