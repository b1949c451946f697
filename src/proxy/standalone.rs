//! The standalone proxy behind `airlockd proxy`: one session, one listener, a policy the
//! caller built, the audit trail in one log directory, and an `ALLOW`/`DENY` line per attempt
//! on stdout. The future Docker backend runs exactly this. Argument parsing and policy loading
//! live in the `airlockd` front ([`crate::daemon::cli`]); `docs/proxy.md` documents the flags.
//!
//! Stdout is written by a dedicated thread through a bounded queue ([`ConsoleWriter`]), never
//! from the proxy's tasks: a reader that stops reading (a full pipe) must not stall the proxy.
//! When the queue is full, console lines are dropped — never audit lines, which are on disk
//! before they are queued — and the drops are counted and reported through `tracing`.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::time::Duration;

use tokio::sync::watch;

use crate::audit::{AuditError, AuditLine, AuditSink, FileAuditSink, SessionInfo, Stamp};
use crate::policy::Policy;

use super::{Identity, Limits, Resolver, SessionProxy};

/// Console lines that may wait for a slow stdout reader before new ones are dropped (at about
/// 150 bytes a line, a few hundred KiB).
pub const CONSOLE_QUEUE: usize = 2048;

/// How long shutdown waits for queued console lines to reach stdout before exiting anyway
/// (a reader that never reads must not keep the process alive).
const CONSOLE_FLUSH_WAIT: Duration = Duration::from_secs(2);

/// Everything one standalone proxy run needs, already validated by the caller.
#[derive(Debug)]
pub struct Standalone {
    /// The repo name the audit lines carry.
    pub repo_name: String,
    pub listen: SocketAddr,
    /// The audit log directory (`~/.airlock/logs/<repo>` by default).
    pub log_dir: PathBuf,
    /// `user_id` on every line; `None` writes unattributed lines.
    pub user_id: Option<String>,
    pub limits: Limits,
    pub policy: Policy,
    pub resolver: Arc<dyn Resolver>,
    /// The repo's host path the lines carry, with its repo key (`None`: neither). The
    /// container backend passes the host path its container cannot see.
    pub repo_path: Option<String>,
    /// The session id the lines carry (`None`: a new one). The container backend passes the
    /// CLI's, so its session records, refusal report and quarantine agree with the lines.
    pub session: Option<String>,
    /// The only peers served (empty: any). The container backend names its session's sandbox:
    /// another session's sandbox on the same repo network must not use this session's proxy
    /// (its phase, its attribution).
    pub allowed_peers: Vec<std::net::IpAddr>,
    /// Created (empty) once the listener is bound: how an orchestrator that cannot reach the
    /// listener (the container backend's CLI) knows the proxy is ready.
    pub ready_file: Option<PathBuf>,
    /// The session's `[audit]` bounds (burst, budget, free space).
    pub volume: crate::audit::volume::Volume,
    /// Written once the bounds stop the session (JSON `{"reason", "message"}`): how the
    /// container backend's CLI learns it must end the sandbox. The proxy itself keeps running,
    /// refusing every attempt and counting them, until it is stopped.
    pub stop_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum StandaloneError {
    #[error("cannot open the audit log in {}", dir.display())]
    AuditLog {
        dir: PathBuf,
        #[source]
        source: AuditError,
    },
    #[error("cannot listen on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create the ready file {}", path.display())]
    Ready {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("listener address")]
    LocalAddr(#[source] std::io::Error),
    #[error("proxy failed")]
    Serve(#[source] std::io::Error),
    /// A blocking helper task panicked or was cancelled (a bug; the message says where).
    #[error("internal error in a blocking task")]
    Task(#[source] tokio::task::JoinError),
}

/// Serves `proxy.listen` until `shutdown` completes, then drains open tunnels (up to
/// `limits.drain_grace`; the rest are logged `interrupted`) and flushes the console.
pub async fn serve(
    proxy: Standalone,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StandaloneError> {
    let boot = crate::audit::new_boot_id();
    let repo_key = proxy
        .repo_path
        .as_deref()
        .map(|p| crate::audit::logdir::repo_key(&proxy.repo_name, std::path::Path::new(p)));
    let info = SessionInfo {
        session: proxy.session.clone().unwrap_or_else(crate::audit::new_id),
        repo: proxy.repo_name.clone(),
        repo_path: proxy.repo_path.clone(),
        repo_key: repo_key.clone(),
        user_id: proxy.user_id.clone(),
    };
    // Opening the log settles journals left by writers that died (their tunnels become
    // `"interrupted": true` lines) and locks this run's journal; both are file I/O.
    let dir = proxy.log_dir.clone();
    let volume = proxy.volume;
    let sink = tokio::task::spawn_blocking(move || {
        crate::audit::RepoLog::open(&dir, &boot)
            .and_then(|log| FileAuditSink::starting(log, info, volume))
    })
    .await
    .map_err(StandaloneError::Task)?
    .map_err(|source| StandaloneError::AuditLog { dir: proxy.log_dir.clone(), source })?;
    watch_stop(&sink, proxy.stop_file.clone());
    let settled = sink.log().settled().lines_written;
    if settled > 0 {
        eprintln!("airlockd proxy: settled {settled} interrupted tunnel(s) of an earlier run");
    }
    let console = ConsoleWriter::start(std::io::stdout(), CONSOLE_QUEUE);
    let audit = Arc::new(ConsoleSink { sink, console: console.handle() });
    let listener = tokio::net::TcpListener::bind(proxy.listen)
        .await
        .map_err(|source| StandaloneError::Listen { addr: proxy.listen, source })?;
    let bound = listener.local_addr().map_err(StandaloneError::LocalAddr)?;
    if let Some(ready) = &proxy.ready_file {
        std::fs::write(ready, b"")
            .map_err(|source| StandaloneError::Ready { path: ready.clone(), source })?;
    }
    let proxy_peers = proxy.allowed_peers.clone();
    let identity = Identity {
        repo: proxy.repo_name.clone(),
        repo_path: proxy.repo_path.clone(),
        repo_key,
        user_id: proxy.user_id,
    };
    // Kept current by the rtnetlink watcher for as long as the proxy runs.
    let local = tokio::task::spawn_blocking(super::hostaddrs::watched)
        .await
        .unwrap_or_else(|_| super::hostaddrs::HostAddrs::fixed(Default::default()));
    let session = Arc::new(
        SessionProxy::new(
            Arc::new(proxy.policy),
            Arc::clone(&audit) as Arc<dyn AuditSink>,
            proxy.resolver,
            proxy.limits,
            Default::default(),
            identity,
        )
        .with_host_addrs(local),
    );
    eprintln!(
        "airlockd proxy: listening on {bound} (repo {}, audit log {})",
        proxy.repo_name,
        proxy.log_dir.display()
    );
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        eprintln!("airlockd proxy: shutting down (draining open tunnels)");
        let _ = tx.send(true);
    });
    let served = if proxy_peers.is_empty() {
        super::serve_session(listener, session, rx).await
    } else {
        let peers = Arc::new(PeerFilter::new(proxy_peers));
        let handler = move |session, stream: tokio::net::TcpStream| {
            let admitted = peers.admit(stream.peer_addr().ok());
            async move {
                if admitted {
                    super::handle_connection(session, stream).await;
                }
            }
        };
        super::serve_with(listener, session, rx, handler, super::OverCap::Http).await
    }
    .map_err(StandaloneError::Serve);
    drop(audit);
    // Blocking wait for the writer thread (bounded), off the async workers.
    let _ = tokio::task::spawn_blocking(move || console.finish(CONSOLE_FLUSH_WAIT)).await;
    served
}

/// Once the `[audit]` bounds stop the session: says why on stderr and writes `stop_file`
/// (atomically: a reader never sees half of it).
fn watch_stop(sink: &FileAuditSink, stop_file: Option<PathBuf>) {
    let mut stop = sink.on_stop();
    tokio::spawn(async move {
        // Cloned out at once: the file I/O below must not hold the channel's read lock.
        let Some(notice) = stop.wait_for(Option::is_some).await.ok().and_then(|n| n.clone()) else {
            return;
        };
        eprintln!("airlockd proxy: session stopped: {}", notice.message);
        let Some(path) = stop_file else { return };
        let body =
            serde_json::json!({ "reason": notice.reason.as_str(), "message": notice.message });
        // The project's atomic replace (a temp file beside it, synced, renamed over the name).
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        let (dir, name) = (dir.unwrap_or(std::path::Path::new(".")), path.file_name());
        let written = match name {
            Some(name) => crate::fsat::open_root(dir).and_then(|dir| {
                crate::fsat::write_replace(
                    std::os::fd::AsFd::as_fd(&dir),
                    name,
                    format!("{body}\n").as_bytes(),
                    0o644,
                )
            }),
            None => Err(std::io::Error::other("the path names no file")),
        };
        if let Err(e) = written {
            eprintln!("airlockd proxy: cannot write the stop file {}: {e}", path.display());
        }
    });
}

/// `--allow-peer`: whom the proxy serves. A refused peer's connection is closed unanswered and
/// reported once per address on stderr (it is not this session's attempt, so it has no audit
/// line here; a flood from one address writes one line).
#[derive(Debug)]
struct PeerFilter {
    allowed: Vec<std::net::IpAddr>,
    reported: std::sync::Mutex<std::collections::HashSet<std::net::IpAddr>>,
}

impl PeerFilter {
    fn new(allowed: Vec<std::net::IpAddr>) -> Self {
        Self { allowed, reported: Default::default() }
    }

    fn admit(&self, peer: Option<SocketAddr>) -> bool {
        let Some(peer) = peer else { return false };
        let ip = peer.ip().to_canonical();
        if self.allowed.contains(&ip) {
            return true;
        }
        let first =
            self.reported.lock().map(|mut r| r.len() < 1024 && r.insert(ip)).unwrap_or(false);
        if first {
            eprintln!(
                "airlockd proxy: refused a connection from {ip}: not an --allow-peer address"
            );
        }
        false
    }
}

/// The stdout writer: one thread that owns the writer, fed through a bounded queue.
#[derive(Debug)]
pub struct ConsoleWriter {
    handle: ConsoleHandle,
    /// Signalled by the thread once the queue is closed and drained.
    done: Receiver<()>,
}

/// The sending side, cheap to clone; never blocks.
#[derive(Debug, Clone)]
pub struct ConsoleHandle {
    tx: SyncSender<String>,
    dropped: Arc<AtomicU64>,
}

impl ConsoleWriter {
    /// Starts the writer thread on `out` with room for `capacity` waiting lines.
    pub fn start(out: impl Write + Send + 'static, capacity: usize) -> Self {
        let (tx, rx) = mpsc::sync_channel::<String>(capacity);
        let (done_tx, done) = mpsc::channel();
        let dropped = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&dropped);
        let spawned =
            std::thread::Builder::new().name("airlockd-console".into()).spawn(move || {
                let mut out = out;
                for line in rx {
                    // A closed stdout (EPIPE) is the reader's choice; the audit log has the line.
                    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
                    report_drops(&counter, "while stdout was not being read");
                }
                let _ = done_tx.send(());
            });
        if let Err(e) = spawned {
            // Without the thread every send finds the queue closed and counts a drop.
            tracing::error!(error = %e, "cannot start the console writer; ALLOW/DENY lines are off");
        }
        Self { handle: ConsoleHandle { tx, dropped }, done }
    }

    pub fn handle(&self) -> ConsoleHandle {
        self.handle.clone()
    }

    /// Closes the queue (once every handle is gone) and waits up to `wait` for the thread to
    /// write what is queued. Drops not yet reported are reported here.
    pub fn finish(self, wait: Duration) {
        let Self { handle, done } = self;
        let dropped = Arc::clone(&handle.dropped);
        drop(handle);
        match done.recv_timeout(wait) {
            // Drained, or the thread never ran (its start failure was reported then).
            Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {}
            // A stalled reader, or a tunnel task still holding a handle past the drain grace.
            Err(mpsc::RecvTimeoutError::Timeout) => tracing::warn!(
                "the ALLOW/DENY lines did not finish within {} ms (stdout not being read, or \
                 tunnels still open); exiting without the rest (the audit log has every line)",
                wait.as_millis()
            ),
        }
        report_drops(&dropped, "before exit");
    }
}

impl ConsoleHandle {
    /// Queues `line` for stdout; drops (and counts) it when the queue is full.
    pub fn show(&self, line: String) {
        match self.tx.try_send(line) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        "stdout is not keeping up: dropping ALLOW/DENY lines until it does (the \
                         audit log has every line)"
                    );
                }
            }
        }
    }

    /// Console lines dropped and not yet reported.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Reports (and resets) the count of dropped console lines, if any.
fn report_drops(counter: &AtomicU64, when: &str) {
    let n = counter.swap(0, Ordering::Relaxed);
    if n > 0 {
        tracing::warn!(
            dropped = n,
            "dropped {n} ALLOW/DENY line(s) {when}; the audit log has them"
        );
    }
}

/// Queues each written line as an `ALLOW`/`DENY` line for stdout (after it is on disk).
#[derive(Debug)]
struct ConsoleSink {
    sink: FileAuditSink,
    console: ConsoleHandle,
}

impl AuditSink for ConsoleSink {
    fn stamp(&self) -> Stamp {
        self.sink.stamp()
    }
    fn append(&self, line: &AuditLine) -> Result<(), AuditError> {
        self.sink.append(line)?;
        self.console.show(crate::audit::console_line(line));
        Ok(())
    }
    fn journal_open(&self, line: &AuditLine) -> Result<(), AuditError> {
        self.sink.journal_open(line)
    }
    fn journal_close(&self, line: &AuditLine) -> Result<(), AuditError> {
        self.sink.journal_close(line)?;
        self.console.show(crate::audit::console_line(line));
        Ok(())
    }
    fn tick(&self) -> Result<(), AuditError> {
        self.sink.tick()
    }
    fn flush(&self) -> Result<(), AuditError> {
        self.sink.flush()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::sync::mpsc::channel;

    #[test]
    fn only_allowed_peers_are_served_whatever_their_address_family() {
        let f = PeerFilter::new(vec!["10.89.0.9".parse().unwrap()]);
        assert!(f.admit(Some("10.89.0.9:40000".parse().unwrap())));
        // The same address as an IPv4-mapped IPv6 peer is the same peer.
        assert!(f.admit(Some("[::ffff:10.89.0.9]:40000".parse().unwrap())));
        assert!(!f.admit(Some("10.89.0.10:40000".parse().unwrap())));
        assert!(!f.admit(None), "a peer whose address is unknown is refused");
    }

    /// A writer that blocks until the test lets it go, recording what got through.
    struct Gate {
        open: Receiver<()>,
        written: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Gate {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            let _ = self.open.recv();
            self.written.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_stuck_stdout_never_blocks_the_sender_and_drops_are_counted() {
        let (open_tx, open) = channel();
        let written = Arc::new(Mutex::new(Vec::new()));
        let writer = ConsoleWriter::start(Gate { open, written: Arc::clone(&written) }, 4);
        let console = writer.handle();
        // The thread takes one line and blocks in write; four more fill the queue; the rest
        // are dropped — and every `show` returns at once (this test would hang otherwise).
        for i in 0..100 {
            console.show(format!("line {i}"));
        }
        let dropped = console.dropped();
        assert!((95..=96).contains(&dropped), "dropped {dropped}");
        drop(open_tx); // unblocks every write from now on
        drop(console);
        writer.finish(Duration::from_secs(30));
        let out = String::from_utf8(written.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len() as u64, 100 - dropped, "{out}");
        assert_eq!(lines[0], "line 0");
    }

    #[test]
    fn every_line_reaches_a_reader_that_keeps_up() {
        let buf = Arc::new(Mutex::new(Vec::new()));
        struct Shared(Arc<Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let writer = ConsoleWriter::start(Shared(Arc::clone(&buf)), 8);
        let console = writer.handle();
        for i in 0..5 {
            console.show(format!("l{i}"));
        }
        drop(console);
        writer.finish(Duration::from_secs(30));
        assert_eq!(String::from_utf8(buf.lock().unwrap().clone()).unwrap(), "l0\nl1\nl2\nl3\nl4\n");
    }
}
