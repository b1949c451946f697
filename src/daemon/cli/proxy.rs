//! `airlockd proxy`: its flags (each with an environment fallback), the operator policy file
//! and the resolver choice, then [`crate::proxy::standalone::serve`] on a runtime of its own
//! until SIGTERM/SIGINT. `docs/proxy.md` documents every flag.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::audit::volume::Volume;
use crate::env::Env;
use crate::policy::Policy;
use crate::proxy::standalone::{self, Standalone};
use crate::proxy::{Limits, Resolver, SystemResolver};

/// `airlockd proxy` flags; each has an environment fallback.
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// The repo name the audit lines carry (and the log directory's name).
    #[arg(long, env = "AIRLOCK_REPO_NAME", value_name = "NAME")]
    pub repo_name: String,
    /// The repo's path on the host, written on every line with its repo key (as a native
    /// session's lines carry them). An absolute path.
    #[arg(long, env = "AIRLOCK_REPO_PATH", value_name = "PATH", value_parser = parse_repo_path)]
    pub repo_path: Option<String>,
    /// Address to listen on, e.g. 127.0.0.1:3128 (port 0 picks a free port; the chosen address
    /// is printed on stderr).
    #[arg(long, env = "AIRLOCK_LISTEN", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Policy file in `.airlock.toml` format, trusted as the `operator` layer.
    #[arg(long, env = "AIRLOCK_CONFIG", value_name = "FILE", conflicts_with = "layers")]
    pub config: Option<PathBuf>,
    /// A layers file (JSON) with the managed, user and repo layers' policy parts, as `airlock
    /// exec|run --backend docker|podman` writes it for a session's proxy container: evaluation
    /// and `layer` attribution are then the daemon's for that session. See docs/backends.md.
    #[arg(long, env = "AIRLOCK_LAYERS", value_name = "FILE")]
    pub layers: Option<PathBuf>,
    /// Evaluate with phase NAME in force: each layer's [phase.NAME.network] lists in place of
    /// its [network] lists (every audit line then carries `phase`).
    #[arg(long, env = "AIRLOCK_PHASE", value_name = "NAME")]
    pub phase: Option<String>,
    /// Audit log directory [default: ~/.airlock/logs/<repo-name>].
    #[arg(long, env = "AIRLOCK_LOG_DIR", value_name = "DIR")]
    pub log_dir: Option<PathBuf>,
    /// `user_id` written on every line (omitted when unset: unattributed).
    #[arg(long, env = "AIRLOCK_USER_ID", value_name = "ID")]
    pub user_id: Option<String>,
    /// The session id every line carries (default: a new random one). Letters, digits, `-`
    /// and `_`, at most 64.
    #[arg(long, env = "AIRLOCK_SESSION", value_name = "ID", value_parser = parse_session_id)]
    pub session: Option<String>,
    /// Serve only connections from this address (repeatable; default: any). The container
    /// backend names its session's sandbox container.
    #[arg(
        long = "allow-peer",
        env = "AIRLOCK_ALLOW_PEERS",
        value_delimiter = ',',
        value_name = "IP"
    )]
    pub allow_peers: Vec<std::net::IpAddr>,
    /// Create this (empty) file once the listener is bound: a readiness signal for an
    /// orchestrator that cannot connect to the listener itself.
    #[arg(long, env = "AIRLOCK_READY_FILE", value_name = "FILE")]
    pub ready_file: Option<PathBuf>,
    /// Write FILE (JSON: `reason`, `message`) once the `[audit]` bounds stop the session
    /// (`session_budget` written, or less than `min_free` left); the proxy then refuses every
    /// attempt until it is stopped. With `--layers`, the bounds are the managed and user
    /// layers'; otherwise the defaults.
    #[arg(long, env = "AIRLOCK_STOP_FILE", value_name = "FILE")]
    pub stop_file: Option<PathBuf>,
    /// Time for a request head to arrive.
    #[arg(long, env = "AIRLOCK_HEADER_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub header_timeout: Duration,
    /// Largest request head in bytes (beyond: 431).
    #[arg(long, env = "AIRLOCK_MAX_HEADER_BYTES", default_value_t = 16 * 1024)]
    pub max_header_bytes: usize,
    /// Name resolution timeout.
    #[arg(long, env = "AIRLOCK_DNS_TIMEOUT", default_value = "5s", value_parser = humantime::parse_duration)]
    pub dns_timeout: Duration,
    /// Connect timeout (all of a target's addresses together).
    #[arg(long, env = "AIRLOCK_CONNECT_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub connect_timeout: Duration,
    /// Close a tunnel after this long without a byte either way.
    #[arg(long, env = "AIRLOCK_TUNNEL_IDLE_TIMEOUT", default_value = "15m", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
    /// Open tunnels at once (beyond: 503, audited `tunnel_limit`).
    #[arg(long, env = "AIRLOCK_MAX_TUNNELS", default_value_t = 512)]
    pub max_tunnels: usize,
    /// Time for the ClientHello to arrive after `200`.
    #[arg(long, env = "AIRLOCK_CLIENT_HELLO_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub client_hello_timeout: Duration,
    /// On SIGTERM/SIGINT: how long open tunnels may finish before they are closed and logged
    /// `interrupted`.
    #[arg(long, env = "AIRLOCK_DRAIN_GRACE", default_value = "5s", value_parser = humantime::parse_duration)]
    pub drain_grace: Duration,
}

impl ProxyArgs {
    pub fn limits(&self) -> Limits {
        Limits {
            header_timeout: self.header_timeout,
            max_header_bytes: self.max_header_bytes,
            dns_timeout: self.dns_timeout,
            connect_timeout: self.connect_timeout,
            idle_timeout: self.idle_timeout,
            max_tunnels: self.max_tunnels,
            client_hello_timeout: self.client_hello_timeout,
            max_client_hello: Limits::default().max_client_hello,
            drain_grace: self.drain_grace,
            ..Limits::default()
        }
    }
}

/// Runs the standalone proxy until SIGTERM/SIGINT; returns the exit code.
pub fn main(args: ProxyArgs, env: &dyn Env) -> i32 {
    match run(args, env) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("airlockd proxy: {e:#}");
            1
        }
    }
}

fn run(args: ProxyArgs, env: &dyn Env) -> anyhow::Result<()> {
    crate::repo::validate_repo_name(&args.repo_name)
        .with_context(|| format!("--repo-name {:?}", args.repo_name))?;
    raise_nofile();
    let (policy, volume) = load_policy(&args, env)?;
    let log_dir = match &args.log_dir {
        Some(d) => d.clone(),
        None => crate::paths::Paths::from_env(env)
            .context("cannot find the home directory for the default --log-dir")?
            .logs_dir(&args.repo_name),
    };
    let resolver = make_resolver(env)?;
    let proxy = Standalone {
        limits: args.limits(),
        repo_name: args.repo_name,
        listen: args.listen,
        log_dir,
        user_id: args.user_id,
        policy,
        resolver,
        repo_path: args.repo_path,
        allowed_peers: args.allow_peers,
        session: args.session,
        ready_file: args.ready_file,
        volume,
        stop_file: args.stop_file,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(standalone::serve(proxy, wait_for_signal()))?;
    Ok(())
}

/// `--repo-path`: absolute, one line.
fn parse_repo_path(s: &str) -> Result<String, String> {
    if s.starts_with('/') && !s.contains(['\n', '\r', '\0']) {
        Ok(s.to_owned())
    } else {
        Err("an absolute path on one line".into())
    }
}

/// `--session`: an id that is safe in file names and log lines.
fn parse_session_id(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(s.to_owned())
    } else {
        Err("a session id is 1 to 64 letters, digits, `-` or `_`".into())
    }
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// The policy and the `[audit]` bounds. With `--layers`, both from that file; otherwise the
/// operator file, plus the fleet's managed layer (and its review-plane servers) when the
/// machine has one — a fleet policy binds the standalone proxy too — and the default bounds.
fn load_policy(args: &ProxyArgs, env: &dyn Env) -> anyhow::Result<(Policy, Volume)> {
    if let Some(path) = &args.layers {
        // The file carries the managed layer the session's CLI read on the host; this process
        // (a container) reads none of its own.
        let file = crate::config::layers_file::LayersFile::read(path)
            .map_err(|e| anyhow::anyhow!("--layers: {e}"))?;
        let built = file.build_policy(args.phase.as_deref()).map_err(|e| anyhow::anyhow!("{e}"))?;
        for w in &built.warnings {
            eprintln!("airlockd proxy: warning: {w}");
        }
        let volume = file.audit_volume().map_err(|e| anyhow::anyhow!("--layers: {e}"))?;
        return Ok((built.policy, volume));
    }
    let Some(path) = &args.config else {
        bail!(
            "no policy: pass --config FILE (or AIRLOCK_CONFIG) with an allow list in \
             .airlock.toml format, e.g. [network] allow = [\"example.com\"], or --layers FILE \
             (or AIRLOCK_LAYERS) as `airlock exec --backend podman` writes it"
        );
    };
    let operator = crate::config::load_operator(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    for w in &operator.warnings {
        eprintln!("airlockd proxy: warning: {w}");
    }
    let managed = match crate::paths::Paths::from_env(env) {
        Ok(paths) => crate::config::load_managed(&paths).map_err(|e| anyhow::anyhow!("{e}"))?,
        Err(_) => None,
    };
    let mut docs = Vec::new();
    let mut review = Vec::new();
    if let Some(m) = &managed {
        docs.push(m);
        review = crate::config::review_servers_of(m);
    }
    docs.push(&operator.doc);
    let built = crate::config::build_policy_in_phase(&docs, &review, args.phase.as_deref())
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for w in &built.warnings {
        eprintln!("airlockd proxy: warning: {w}");
    }
    Ok((built.policy, Volume::default()))
}

/// The system resolver, or — only in `test-hooks` builds — the file named by
/// `AIRLOCK_TEST_RESOLVER`, announced loudly.
fn make_resolver(env: &dyn Env) -> anyhow::Result<Arc<dyn Resolver>> {
    #[cfg(feature = "test-hooks")]
    if let Some(file) = env.var("AIRLOCK_TEST_RESOLVER") {
        let path = PathBuf::from(&file);
        let log = env
            .var("AIRLOCK_TEST_RESOLVER_LOG")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(format!("{file}.queries")));
        eprintln!(
            "airlockd proxy: WARNING: TEST RESOLVER IN FORCE ({}): names resolve only from \
             that file (test-hooks build; never use in production)",
            path.display()
        );
        let r = crate::proxy::resolver::FileResolver::load(&path, Some(log))
            .with_context(|| format!("AIRLOCK_TEST_RESOLVER={}", path.display()))?;
        return Ok(Arc::new(r));
    }
    let _ = env;
    Ok(Arc::new(SystemResolver))
}

/// Raises the soft open-files limit to the hard limit: every tunnel holds two sockets and up
/// to four pipe ends.
fn raise_nofile() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE)
        && soft < hard
        && let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
    {
        eprintln!("airlockd proxy: warning: cannot raise the open-files limit to {hard}: {e}");
    }
}
