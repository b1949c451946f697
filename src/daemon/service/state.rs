//! The daemon's shared state: the session table, what counts as activity (idle accounting),
//! the managed layer as last read, the audit registry, and `status`. Methods that touch files
//! are blocking and say so; async callers go through [`blocking`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

use super::Options;
use crate::audit::{self, LogRegistry, rfc3339_ms};
use crate::config::LayerDoc;
use crate::daemon::notify;
use crate::env::{Env, ProcessEnv};
use crate::paths::Paths;
use crate::protocol::{self, SessionSpec, SessionStatus, StatusReply, VersionRange};
use crate::proxy::{Resolver, SessionProxy, SystemResolver};
use crate::sys::activation::Source;

/// One registered session and the proxy serving its listener.
#[derive(Debug)]
pub struct Session {
    pub spec: SessionSpec,
    pub id: String,
    pub started_at: String,
    pub listen: String,
    pub proxy: Arc<SessionProxy>,
    /// Turning it true drains the session's proxy (tunnels get the grace period).
    pub(super) shutdown: watch::Sender<bool>,
    /// Turns `Some` when the session's audit sink stopped it (`[audit]` bounds); the
    /// connection that owns the session tells its supervisor.
    pub(super) stopped: watch::Receiver<Option<audit::StopNotice>>,
    /// The task reading the sandbox's refused-UDP reports, if it sent the log socket: the
    /// session's end waits (bounded) for it to report what the kernel still holds.
    pub(super) udp_log: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The checkout's log directory ([`crate::audit::logdir::claim`]): its session records go
    /// there, beside its audit lines.
    pub log_dir: std::path::PathBuf,
    /// The checkout's repo key (`repo_key` of its lines and records).
    pub repo_key: String,
    /// Turns true once the session's proxy, capture and resolver tasks are done after
    /// [`Session::stop_proxy`]: every line of theirs is written. The end record's
    /// `audit_root` waits for it (bounded).
    pub(super) drained: watch::Receiver<bool>,
    /// The layers it started with and its phase switches ([`super::phase`]).
    pub(crate) phases: super::phase::SessionPhases,
}

impl Session {
    pub(super) fn stop_proxy(&self) {
        self.shutdown.send_replace(true);
    }

    fn status(&self) -> SessionStatus {
        let stats = self.proxy.stats();
        SessionStatus {
            session: self.id.clone(),
            repo: self.spec.repo.clone(),
            repo_path: self.spec.repo_path.clone(),
            user_id: self.spec.identity.user_id.clone(),
            email: self.spec.identity.email.clone(),
            agent: self.spec.agent.clone(),
            started_at: self.started_at.clone(),
            listen: self.listen.clone(),
            tunnels: stats.active_tunnels as u64,
            bytes_sent: stats.bytes_sent,
            bytes_recv: stats.bytes_recv,
            serving: !*self.shutdown.borrow(),
            phase: self.proxy.policy().phase().map(str::to_owned),
            phases: self.phases.source.defined(),
        }
    }
}

/// The registered sessions by id.
#[derive(Debug, Default)]
pub(super) struct SessionTable {
    by_id: HashMap<String, Arc<Session>>,
}

impl SessionTable {
    /// Registers `session`; an id already registered is refused (the caller answers with it).
    pub(super) fn insert(&mut self, session: Arc<Session>) -> Result<(), String> {
        if self.by_id.contains_key(&session.id) {
            return Err(format!("session {} is already registered", session.id));
        }
        self.by_id.insert(session.id.clone(), session);
        Ok(())
    }

    pub(super) fn get(&self, id: &str) -> Option<Arc<Session>> {
        self.by_id.get(id).cloned()
    }

    pub(super) fn remove(&mut self, id: &str) -> Option<Arc<Session>> {
        self.by_id.remove(id)
    }

    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Open tunnels over every session.
    pub(super) fn tunnels(&self) -> u64 {
        self.by_id.values().map(|s| s.proxy.stats().active_tunnels as u64).sum()
    }

    pub(super) fn sessions(&self) -> impl Iterator<Item = &Arc<Session>> {
        self.by_id.values()
    }

    /// `status` rows, oldest session first.
    pub(super) fn statuses(&self) -> Vec<SessionStatus> {
        let mut list: Vec<SessionStatus> = self.by_id.values().map(|s| s.status()).collect();
        list.sort_by(|a, b| a.started_at.cmp(&b.started_at));
        list
    }
}

/// When the daemon became idle: reset whenever anything is active, so the idle timeout
/// counts from the moment the last connection, session, tunnel or proxy went away.
#[derive(Debug, Clone, Copy)]
pub(super) struct IdleClock {
    since: Instant,
}

impl IdleClock {
    pub(super) fn new(now: Instant) -> Self {
        Self { since: now }
    }

    /// Records what is active at `now`.
    pub(super) fn observe(&mut self, active: u64, now: Instant) {
        if active != 0 {
            self.since = now;
        }
    }

    /// When the daemon may exit if nothing becomes active before then.
    pub(super) fn deadline(&self, timeout: std::time::Duration) -> Instant {
        self.since + timeout
    }
}

/// Whether `quit_if_idle` may stop the daemon: no session, no tunnel, and the asking
/// connection is the only one.
pub(super) fn may_quit(sessions: usize, tunnels: u64, connections: usize) -> bool {
    sessions == 0 && tunnels == 0 && connections <= 1
}

/// The managed layer (or its error) and the file state it was read at.
type ManagedCache = Option<(FileKey, Result<Option<LayerDoc>, String>)>;

/// What `stat(2)` says about a file; any change (or appearance/removal) means re-read it.
type FileKey = Option<(u64, u64, u64, i64, i64, i64, i64)>;

fn file_key(path: &std::path::Path) -> FileKey {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()))
}

pub(super) fn now() -> String {
    rfc3339_ms(SystemTime::now())
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking holder leaves the value consistent (every update is a single insert/remove
    // or assignment).
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs blocking work (file I/O, config parsing, `getifaddrs`) off the async workers. A
/// panic in `f` is reported as an internal error string.
pub(super) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f).await.map_err(|e| format!("internal error: {e}"))
}

/// The environment the daemon reads (the process's; a map in unit tests).
#[derive(Clone)]
pub(super) struct DaemonEnv(Arc<dyn Env>);

impl std::fmt::Debug for DaemonEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DaemonEnv")
    }
}

impl std::ops::Deref for DaemonEnv {
    type Target = dyn Env;
    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}

/// Shared daemon state.
#[derive(Debug)]
pub struct Daemon {
    pub boot: String,
    pub version: String,
    pub protocol: VersionRange,
    started: Instant,
    started_at: String,
    pub(super) options: Options,
    pub(super) env: DaemonEnv,
    pub(super) sessions: Mutex<SessionTable>,
    pub(super) conns: AtomicUsize,
    /// Wakes the accept loop to re-evaluate idleness.
    pub(super) activity: Notify,
    /// Set once when the daemon stops; connection tasks finish their request and close.
    pub(super) stop_tx: watch::Sender<bool>,
    pub(super) quit: Notify,
    /// Serving (or draining) session proxies; they count as activity until they return.
    pub(super) proxies: Mutex<Vec<JoinHandle<()>>>,
    pub(super) running_proxies: AtomicUsize,
    /// The audit writer state of this instance (one journal per repo), opened on first use.
    logs: Mutex<Option<Arc<LogRegistry>>>,
    /// The managed layer as last read, keyed by the file's identity and change time, so every
    /// request sees a fixed file at once without re-parsing an unchanged one.
    managed: Mutex<ManagedCache>,
    /// Parsed user and repo layers and built policies by content digest (`layer_digests`).
    pub(super) layer_cache: Mutex<super::layers::LayerCache>,
    binary: String,
    last_status: Mutex<String>,
    /// Attempts held for a person's decision, across this instance's sessions (docs/gates.md).
    pub(super) gates: Arc<crate::gate::GateBook>,
}

impl Daemon {
    pub(super) fn new(options: Options) -> Arc<Self> {
        Self::with_env(options, Arc::new(ProcessEnv))
    }

    pub(super) fn with_env(options: Options, env: Arc<dyn Env>) -> Arc<Self> {
        let version = test_override(&*env, protocol::TEST_DAEMON_VERSION_VAR)
            .unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_owned());
        let protocol =
            VersionRange::from_test_override(env.var(protocol::TEST_DAEMON_PROTOCOL_VAR));
        Arc::new(Self {
            boot: audit::new_boot_id(),
            version,
            protocol,
            started: Instant::now(),
            started_at: now(),
            options,
            env: DaemonEnv(env),
            sessions: Mutex::new(SessionTable::default()),
            conns: AtomicUsize::new(0),
            activity: Notify::new(),
            stop_tx: watch::channel(false).0,
            quit: Notify::new(),
            proxies: Mutex::new(Vec::new()),
            running_proxies: AtomicUsize::new(0),
            logs: Mutex::new(None),
            managed: Mutex::new(None),
            layer_cache: Mutex::default(),
            binary: std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default(),
            last_status: Mutex::new(notify::describe(0, 0)),
            gates: crate::gate::GateBook::new(crate::gate::MAX_HELD_PER_SESSION),
        })
    }

    pub(super) fn session_count(&self) -> usize {
        lock(&self.sessions).len()
    }

    pub(super) fn tunnels(&self) -> u64 {
        lock(&self.sessions).tunnels()
    }

    /// Connections + sessions + tunnels (and proxies still draining): anything non-zero keeps
    /// the daemon up.
    pub(super) fn active(&self) -> u64 {
        self.conns.load(Ordering::SeqCst) as u64
            + self.session_count() as u64
            + self.tunnels()
            + self.running_proxies.load(Ordering::SeqCst) as u64
    }

    /// The audit registry of this instance (journals under `~/.airlock/logs/<repo>/`).
    pub(super) fn logs(&self, paths: &Paths) -> Arc<LogRegistry> {
        let mut guard = lock(&self.logs);
        Arc::clone(
            guard.get_or_insert_with(|| Arc::new(LogRegistry::new(paths.logs_root(), &self.boot))),
        )
    }

    /// The resolver sessions use: the system's, or (test-hooks builds only) a file of test
    /// answers named by `AIRLOCK_TEST_RESOLVER`. Blocking (reads that file).
    pub(super) fn resolver(&self) -> Result<Arc<dyn Resolver>, String> {
        #[cfg(feature = "test-hooks")]
        if let Some(file) = self.env.var("AIRLOCK_TEST_RESOLVER") {
            use std::path::PathBuf;
            let path = PathBuf::from(&file);
            let log = self
                .env
                .var("AIRLOCK_TEST_RESOLVER_LOG")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from(format!("{file}.queries")));
            // Straight to stderr, not through the log filter: no AIRLOCK_LOG may hide it.
            eprintln!("airlockd: WARNING: TEST RESOLVER IN FORCE ({file}); test-hooks build");
            let r = crate::proxy::resolver::FileResolver::load(&path, Some(log))
                .map_err(|e| format!("AIRLOCK_TEST_RESOLVER={file}: {e}"))?;
            return Ok(Arc::new(r));
        }
        Ok(Arc::new(SystemResolver))
    }

    /// Sends `STATUS=` when the sessions/tunnels line changed since the last one.
    pub(super) fn notify_status(&self) {
        let line = notify::describe(self.session_count(), self.tunnels());
        let mut last = lock(&self.last_status);
        if *last != line {
            notify::status(&line);
            *last = line;
        }
    }

    pub(super) fn paths(&self) -> Result<Paths, String> {
        Paths::from_env(&*self.env).map_err(|e| e.to_string())
    }

    /// Re-reads the daemon's own configuration (the managed layer). An error never stops the
    /// daemon; it is reported by `status` and refuses sessions until fixed. Blocking (stat,
    /// and a parse when the file changed).
    pub(super) fn config_check(&self) -> Result<Option<LayerDoc>, String> {
        let paths = self.paths()?;
        let key = file_key(paths.managed_policy());
        let mut cache = lock(&self.managed);
        if let Some((k, result)) = cache.as_ref()
            && *k == key
        {
            return result.clone();
        }
        let result = crate::config::load_managed(&paths).map_err(|e| {
            format!(
                "managed policy: {e}; sessions are refused until it is fixed (ask your fleet \
                 admin, or run `airlock doctor`)"
            )
        });
        *cache = Some((key, result.clone()));
        result
    }

    /// The `status` reply; `config_error` is the result of a [`Daemon::config_check`] the
    /// caller ran off the runtime.
    pub(super) fn status(&self, config_error: Option<String>) -> StatusReply {
        let list = lock(&self.sessions).statuses();
        StatusReply {
            daemon_version: self.version.clone(),
            protocol: self.protocol.max,
            binary: self.binary.clone(),
            pid: std::process::id(),
            boot: self.boot.clone(),
            started_at: self.started_at.clone(),
            uptime_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            idle_timeout_ms: u64::try_from(self.options.idle_timeout.as_millis())
                .unwrap_or(u64::MAX),
            activation: match self.options.activation {
                Source::Systemd => "systemd".into(),
                Source::Launchd => "launchd".into(),
                Source::OneShot => "airlock (one-shot)".into(),
            },
            tunnels: list.iter().map(|s| s.tunnels).sum(),
            sessions: list,
            config_error,
        }
    }
}

fn test_override(env: &dyn Env, var: &str) -> Option<String> {
    #[cfg(feature = "test-hooks")]
    if let Some(v) = env.var(var) {
        return Some(v);
    }
    let _ = (env, var);
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(super) mod tests {
    use super::*;
    use crate::audit::{AuditError, AuditLine, AuditSink, Stamp};
    use crate::env::MapEnv;
    use crate::proxy;
    use std::time::Duration;

    /// An audit sink that keeps nothing (these tests never proxy a request).
    #[derive(Debug)]
    struct NullSink;

    impl AuditSink for NullSink {
        fn stamp(&self) -> Stamp {
            Stamp { id: "x".into(), session: "s".into(), boot: "b".into(), seq: 1 }
        }
        fn append(&self, _: &AuditLine) -> Result<(), AuditError> {
            Ok(())
        }
        fn journal_open(&self, _: &AuditLine) -> Result<(), AuditError> {
            Ok(())
        }
        fn journal_close(&self, _: &AuditLine) -> Result<(), AuditError> {
            Ok(())
        }
    }

    pub(crate) fn session(id: &str, started_at: &str) -> Arc<Session> {
        let (policy, _) = super::super::session::tests::policy_for(&spec()).unwrap();
        let proxy = Arc::new(SessionProxy::new(
            policy,
            Arc::new(NullSink),
            Arc::new(SystemResolver),
            proxy::Limits::default(),
            Default::default(),
            proxy::Identity { repo: "r".into(), repo_path: None, repo_key: None, user_id: None },
        ));
        Arc::new(Session {
            spec: spec(),
            id: id.into(),
            started_at: started_at.into(),
            listen: "127.0.0.1:8888".into(),
            proxy,
            shutdown: watch::channel(false).0,
            stopped: watch::channel(None).1,
            udp_log: std::sync::Mutex::new(None),
            log_dir: std::path::PathBuf::from("/nonexistent/logs/r"),
            repo_key: "r-00000000".into(),
            drained: watch::channel(true).1,
            phases: Default::default(),
        })
    }

    /// A session request for repo `r` whose user layer allows `a.test`.
    pub(crate) fn spec() -> SessionSpec {
        let user = crate::config::parse_layer(
            crate::policy::LayerKind::User,
            "~/.airlock/config.toml",
            b"[network]\nallow = [\"a.test\"]\n",
        )
        .unwrap()
        .doc;
        SessionSpec {
            repo: "r".into(),
            config: (&crate::config::ClientLayers { user: Some(user), ..Default::default() })
                .into(),
            ..Default::default()
        }
    }

    pub(crate) fn options() -> Options {
        Options {
            idle_timeout: Duration::from_secs(60),
            shutdown_grace: Duration::from_secs(5),
            activation: Source::OneShot,
            nofile: None,
        }
    }

    /// A daemon whose home (and managed policy path) is `home`.
    pub(crate) fn daemon(home: &std::path::Path) -> Arc<Daemon> {
        let env = MapEnv::new()
            .with("HOME", home)
            .with(crate::paths::TEST_MANAGED_POLICY_VAR, home.join("managed.toml"));
        Daemon::with_env(options(), Arc::new(env))
    }

    #[test]
    fn the_session_table_refuses_a_second_registration_of_an_id() {
        let mut table = SessionTable::default();
        table.insert(session("a", "2026-01-01T00:00:02.000Z")).unwrap();
        let err = table.insert(session("a", "2026-01-01T00:00:03.000Z")).unwrap_err();
        assert_eq!(err, "session a is already registered");
        table.insert(session("b", "2026-01-01T00:00:01.000Z")).unwrap();
        assert_eq!(table.len(), 2);
        assert_eq!(table.tunnels(), 0);
        // Oldest first, whatever the map's order.
        let ids: Vec<String> = table.statuses().into_iter().map(|s| s.session).collect();
        assert_eq!(ids, ["b", "a"]);
        assert!(table.statuses().iter().all(|s| s.serving));
        assert_eq!(table.remove("a").map(|s| s.id.clone()).as_deref(), Some("a"));
        assert!(table.remove("a").is_none());
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn the_idle_deadline_counts_from_the_last_activity() {
        let t0 = Instant::now();
        let timeout = Duration::from_secs(60);
        let mut idle = IdleClock::new(t0);
        assert_eq!(idle.deadline(timeout), t0 + timeout);
        // Idle observations do not move it; activity does.
        idle.observe(0, t0 + Duration::from_secs(30));
        assert_eq!(idle.deadline(timeout), t0 + timeout);
        idle.observe(2, t0 + Duration::from_secs(45));
        assert_eq!(idle.deadline(timeout), t0 + Duration::from_secs(105));
    }

    #[test]
    fn activity_is_connections_sessions_and_running_proxies() {
        let home = tempfile::tempdir().unwrap();
        let d = daemon(home.path());
        assert_eq!(d.active(), 0);
        d.conns.fetch_add(1, Ordering::SeqCst);
        assert_eq!(d.active(), 1);
        lock(&d.sessions).insert(session("s", "t")).unwrap();
        d.running_proxies.fetch_add(1, Ordering::SeqCst);
        assert_eq!(d.active(), 3);
        lock(&d.sessions).remove("s");
        d.running_proxies.fetch_sub(1, Ordering::SeqCst);
        d.conns.fetch_sub(1, Ordering::SeqCst);
        assert_eq!(d.active(), 0);
    }

    #[test]
    fn quit_if_idle_needs_no_session_no_tunnel_and_no_other_connection() {
        assert!(may_quit(0, 0, 1));
        assert!(!may_quit(1, 0, 1));
        assert!(!may_quit(0, 1, 1));
        assert!(!may_quit(0, 0, 2));
    }

    /// Needs the managed-path override, which only test-hooks builds honour.
    #[cfg(feature = "test-hooks")]
    #[test]
    fn a_fixed_managed_policy_applies_without_a_restart() {
        let home = tempfile::tempdir().unwrap();
        let d = daemon(home.path());
        assert_eq!(d.config_check(), Ok(None));
        let managed = home.path().join("managed.toml");
        std::fs::write(&managed, "[network]\nallow = 3\n").unwrap();
        let err = d.config_check().unwrap_err();
        assert!(err.starts_with("managed policy: "), "{err}");
        assert!(err.contains("sessions are refused until it is fixed"), "{err}");
        std::fs::write(&managed, "[network]\nallow = [\"fleet.test\"]\n").unwrap();
        assert!(d.config_check().unwrap().is_some());
        assert_eq!(d.status(None).config_error, None);
    }
}
