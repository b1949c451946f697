//! One container session from start to end: the walls on the host side that do not depend on
//! the backend (protected paths scanned and their placeholders made, SECURITY §4/§7), the
//! repo's network, the session's proxy container and its readiness, the sandbox container
//! attached to the caller's terminal, then the proxy stopped (it drains its tunnels) and the
//! end-of-session sweep of the same host repo.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::engine::{EngineCli, EngineError};
use super::names;
use super::plan::{self, Bind, Home, ProxySpec, RunAs, SandboxSpec, UnmountablePath};
use crate::config::layers_file::LayersFile;
use crate::protocol::ContainerSpec;
use crate::sandbox::bridge::{ProxyBridge, SessionEnd};
use crate::sandbox::mounts::HomeMount;
use crate::sandbox::protect::{self, Protection, State};
use crate::sandbox::supervisor::{self, Request};
use crate::sandbox::{quarantine, sweep};
use crate::sys::signals::Hold;

/// The part of the run directory bound into the proxy container (its layers file and ready
/// file). The sandbox's environment file stays beside it, outside: it may hold `[env] pass`
/// and MCP credentials, which the proxy has no business reading.
const PROXY_DIR: &str = "proxy";

/// How long the proxy container may take to listen.
const PROXY_READY_WAIT: Duration = Duration::from_secs(20);
/// `stop -t`: the proxy's SIGTERM drain (`airlockd proxy --drain-grace`, 5 s) plus margin.
const PROXY_STOP_GRACE: u32 = 7;

#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Unmountable(#[from] UnmountablePath),
    #[error("{0}")]
    Setup(String),
    #[error(
        "the {engine} image {image} is missing; build it from contrib/docker/ (see \
         docs/backends.md, \"Images\"), or run with --backend native"
    )]
    MissingImage { engine: super::Engine, image: String },
    #[error("the proxy container {name} did not start listening within {secs} s: {logs}")]
    ProxyNotReady { name: String, secs: u64, logs: String },
}

/// What the session needs beyond its [`Request`].
#[derive(Debug)]
pub struct Plan<'a> {
    pub engine: &'a dyn EngineCli,
    /// `~/.airlock/run/<session>`: the layers and environment files (0600 in a 0700
    /// directory), outside the repo and the agent home; removed at the end.
    pub run_dir: PathBuf,
    /// The repo's audit log directory ([`crate::audit::logdir::claim`]).
    pub log_dir: PathBuf,
    pub layers: &'a LayersFile,
    pub phase: Option<String>,
    pub base_image: String,
    pub proxy_image: String,
    /// The caller's ids and whether podman runs rootless.
    pub run_as: RunAs,
    /// Extra environment and binds for the proxy container (test builds: the test resolver).
    pub proxy_env: Vec<(String, String)>,
    pub proxy_binds: Vec<Bind>,
}

/// How the session ended.
#[derive(Debug)]
pub struct Outcome {
    pub exit_code: i32,
    pub sweep: sweep::Report,
}

/// Removes this session's placeholders and run directory however the session ends, and the
/// proxy container if it is still there.
struct Cleanup<'a> {
    engine: &'a dyn EngineCli,
    prot: &'a Protection,
    repo: &'a Path,
    run_dir: &'a Path,
    /// The sandbox container, while it may still be there.
    sandbox: Option<String>,
    /// The proxy container, while it may still be there.
    proxy: Option<String>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        remove_now(self.engine, &mut self.sandbox);
        remove_now(self.engine, &mut self.proxy);
        protect::remove_placeholders(self.prot, self.repo);
        let _ = std::fs::remove_dir_all(self.run_dir);
    }
}

/// Runs the session to its end, registered with `airlockd` through `bridge` (start and end
/// records, as for a native session).
pub fn run(
    req: &Request,
    p: &Plan<'_>,
    bridge: &mut dyn ProxyBridge,
) -> Result<Outcome, ContainerError> {
    // Before any thread starts (the daemon bridge starts one): from here to the end of the
    // cleanup, a Ctrl-C or SIGTERM cannot end this process between the sandbox and the sweep.
    let hold = Hold::new();
    let engine = p.engine;
    for image in [&p.base_image, &p.proxy_image] {
        plan::check_image_name(image).map_err(ContainerError::Setup)?;
    }
    // One call for both; only when one is missing, one call each to say which.
    if !engine.output(&plan::images_exist(&[&p.base_image, &p.proxy_image]))?.success {
        for image in [&p.base_image, &p.proxy_image] {
            if !engine.output(&plan::images_exist(&[image]))?.success {
                return Err(ContainerError::MissingImage {
                    engine: engine.engine(),
                    image: image.clone(),
                });
            }
        }
    }
    let setup = |what: &str, e: std::io::Error| ContainerError::Setup(format!("{what}: {e}"));
    let mut protection = protect::scan(&req.repo.path, &req.git, &req.host_git_configs)
        .map_err(|e| ContainerError::Setup(e.to_string()))?;
    refuse_overlaps(req, &protection)?;
    for w in protect::make_placeholders(&mut protection, &req.repo.path) {
        eprintln!("airlock: warning: {w}");
    }
    let home_dir = match &req.home {
        HomeMount::Bind { parent, name } => Some(parent.join(name)),
        HomeMount::Tmpfs => None,
    };
    let mut roots: Vec<&Path> = vec![&req.repo.path];
    roots.extend(protection.external.iter().map(PathBuf::as_path));
    roots.extend(home_dir.as_deref());
    let threshold = sweep::threshold(&roots);
    let mut cleanup = Cleanup {
        engine,
        prot: &protection,
        repo: &req.repo.path,
        run_dir: &p.run_dir,
        sandbox: None,
        proxy: None,
    };

    let proxy_dir = p.run_dir.join(PROXY_DIR);
    crate::config::fsutil::private_dir(&proxy_dir).map_err(|e| setup("the run directory", e))?;
    p.layers.write(&proxy_dir.join("layers.json")).map_err(|e| setup("the layers file", e))?;
    crate::config::fsutil::write_private(&p.run_dir.join("env"), &env_file_text(&req.env)?)
        .map_err(|e| setup("the environment file", e))?;
    let network = names::network(&req.repo);
    let inspected = ensure_network(engine, &network, &req.repo.key())?;
    let subnet = plan::first_v4_subnet(&inspected).ok_or_else(|| {
        ContainerError::Setup(format!("the network {network} has no IPv4 subnet ({inspected:?})"))
    })?;

    // Registered before the proxy writes its first line: the daemon checks the same layers and
    // writes the start record; at the end, the end record with the lines' audit root.
    let proxy_name = names::proxy(&req.repo, &req.session);
    let info = req.session_info(vec![format!("container:{}", engine.engine())], Vec::new());
    let container =
        ContainerSpec { engine: engine.engine().to_string(), proxy: proxy_name.clone() };
    bridge.start_container(&info, container).map_err(|e| ContainerError::Setup(e.0))?;
    let started = Started { network, subnet, proxy_name, home_dir, threshold };
    match serve(req, p, &protection, &mut cleanup, started, &hold) {
        Ok(Served { exit_code, report, stopped }) => {
            bridge.end(&SessionEnd {
                exit_code,
                quarantined: report.items.iter().map(supervisor::to_protocol).collect(),
                leftovers: supervisor::leftovers(&report),
                transcripts: Vec::new(),
                stopped,
            });
            drop(cleanup);
            Ok(Outcome { exit_code, sweep: report })
        }
        Err(e) => {
            // The proxy goes before the end record roots the session's lines.
            drop(cleanup);
            bridge.end(&SessionEnd { exit_code: 125, ..SessionEnd::default() });
            Err(e)
        }
    }
}

/// What [`run`] settled before the session was registered.
struct Started {
    network: String,
    subnet: ipnet::Ipv4Net,
    proxy_name: String,
    home_dir: Option<PathBuf>,
    threshold: sweep::Threshold,
}

/// The registered part of a session: the proxy container and its readiness, the sandbox
/// container attached, the proxy stopped, the sweep. Returns the command's exit code and the
/// sweep's report.
fn serve(
    req: &Request,
    p: &Plan<'_>,
    protection: &Protection,
    cleanup: &mut Cleanup<'_>,
    started: Started,
    hold: &Hold,
) -> Result<Served, ContainerError> {
    let engine = p.engine;
    let Started { network, subnet, proxy_name, home_dir, threshold } = started;
    // Removed however the start goes: a `run -d` that fails may leave a created container.
    cleanup.proxy = Some(proxy_name.clone());
    let mut proxy = ProxySpec {
        name: proxy_name.clone(),
        image: p.proxy_image.clone(),
        network: network.clone(),
        ip: std::net::Ipv4Addr::UNSPECIFIED,
        sandbox_ip: std::net::Ipv4Addr::UNSPECIFIED,
        uplink: engine.engine().uplink_network().into(),
        run_as: p.run_as,
        repo_name: req.repo.name.clone(),
        repo_path: req.repo.path.clone(),
        session: req.session.clone(),
        user_id: req.user_id.clone(),
        phase: p.phase.clone(),
        run_dir: p.run_dir.join(PROXY_DIR),
        log_dir: p.log_dir.clone(),
        env: p.proxy_env.clone(),
        binds: p.proxy_binds.clone(),
    };
    // Docker: the host-side drop rule for the repo's bridge, by a helper container, while the
    // proxy starts; the sandbox starts only once it is in place.
    let (started_proxy, guarded) = std::thread::scope(|scope| {
        let guard = (engine.engine() == super::Engine::Docker).then(|| {
            let bridge = names::bridge(&req.repo);
            scope.spawn(move || guard_bridge(engine, &p.proxy_image, &bridge))
        });
        let started = start_proxy(engine, p, &mut proxy, subnet, &network);
        let guarded = guard.map(|handle| {
            handle.join().unwrap_or_else(|_| {
                Err(ContainerError::Setup("the bridge guard's thread panicked".into()))
            })
        });
        (started, guarded)
    });
    started_proxy?;
    guarded.transpose()?;
    let sandbox = SandboxSpec {
        name: names::sandbox(&req.repo, &req.session),
        image: p.base_image.clone(),
        network,
        proxy_ip: proxy.ip.to_string(),
        ip: proxy.sandbox_ip,
        run_as: p.run_as,
        hostname: req.repo.hostname().to_owned(),
        workdir: req.workdir.clone().unwrap_or_else(|| req.repo.sandbox_path()),
        binds: binds(req, protection),
        home: match &home_dir {
            Some(h) => Home::Bind(Bind {
                host: h.clone(),
                inside: crate::sandbox::env::SANDBOX_HOME.into(),
                read_only: false,
            }),
            None => Home::Tmpfs { path: crate::sandbox::env::SANDBOX_HOME.into() },
        },
        env_file: p.run_dir.join("env"),
        tty: {
            use std::io::IsTerminal;
            std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
        },
        argv: req.argv.clone(),
    };
    let args = plan::sandbox_run(engine.engine(), &sandbox)?;
    // The engine resolves each source by its path when it mounts it: refuse one that is, or
    // passes through, a symlink now (the scan judged them; this narrows the time since).
    for b in &sandbox.binds {
        refuse_symlinks(&b.host)?;
    }
    sweep::wait_past(threshold.not_before);
    // The bounds may have stopped the session already (the free space fell while the proxy
    // started): then no sandbox starts.
    let stop_file = p.run_dir.join(PROXY_DIR).join(plan::STOP_FILE);
    if let Some((_, message)) = read_stop_file(&stop_file) {
        return Err(ContainerError::Setup(format!(
            "the session was stopped before it ran: {message}"
        )));
    }
    cleanup.sandbox = Some(sandbox.name.clone());
    // While the sandbox runs, the proxy may stop the session (`[audit]` bounds): it writes its
    // stop file, and the sandbox is killed, as a native session's is.
    let (ended, until) = std::sync::mpsc::channel::<()>();
    let (attached, stopped) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| watch_stop_file(engine, &stop_file, &sandbox.name, until));
        let attached = engine.attached(&args, hold);
        // Wakes the watcher at once (its wait ends when the sender goes).
        drop(ended);
        (attached, watcher.join().unwrap_or(None))
    });
    let exit_code = match attached {
        Ok(_) if stopped.is_some() => {
            remove_now(engine, &mut cleanup.sandbox);
            supervisor::STOPPED_EXIT
        }
        // A normal exit: the engine has removed the container (`--rm`).
        Ok(code) if code < 125 => {
            cleanup.sandbox = None;
            code
        }
        // The engine's own failure, a signal, or a lost engine CLI: the container may still
        // be there, with the repo mounted; it goes before the sweep.
        Ok(code) => {
            remove_now(engine, &mut cleanup.sandbox);
            code
        }
        Err(e) => {
            eprintln!("airlock: {e}");
            remove_now(engine, &mut cleanup.sandbox);
            125
        }
    };

    // The proxy drains its open tunnels on SIGTERM, then goes. Whatever this says, the sweep
    // runs: an engine error here must not leave what the sandbox planted in the repo.
    let mut removed = true;
    for step in plan::stop_and_remove(engine.engine(), &proxy_name, PROXY_STOP_GRACE) {
        removed &= engine.output(&step).is_ok_and(|o| o.success);
    }
    if removed {
        cleanup.proxy = None;
    }
    let mut store =
        quarantine::Store::new(req.quarantine_dir.clone(), &req.session, &req.repo.path);
    let report = sweep::run(
        &sweep::Sweep {
            repo: &req.repo.path,
            prot: protection,
            home: home_dir,
            since: threshold.since,
        },
        &mut store,
    );
    if let Err(e) = store.save() {
        eprintln!("airlock: warning: writing the quarantine manifest: {e}");
    }
    Ok(Served { exit_code, report, stopped })
}

/// How [`serve`] ended: the command's exit code, the sweep's report, and the reason code when
/// the proxy's `[audit]` bounds stopped the session.
struct Served {
    exit_code: i32,
    report: sweep::Report,
    stopped: Option<String>,
}

/// Starts the proxy container on a static address chosen at random (two sessions of one repo
/// share its network, so an address another proxy holds is tried again with another), joins
/// it to its uplink (Docker) and waits until it listens. The caller's cleanup already names
/// it: a `run -d` that fails may leave a created container.
fn start_proxy(
    engine: &dyn EngineCli,
    p: &Plan<'_>,
    proxy: &mut ProxySpec,
    subnet: ipnet::Ipv4Net,
    network: &str,
) -> Result<(), ContainerError> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut random = [0u8; 4];
        getrandom::fill(&mut random)
            .map_err(|e| ContainerError::Setup(format!("no randomness for an address: {e}")))?;
        let small = || {
            ContainerError::Setup(format!("the network {network}'s subnet {subnet} is too small"))
        };
        proxy.ip = plan::proxy_address(subnet, u32::from_le_bytes(random)).ok_or_else(small)?;
        // The sandbox's, another host of the subnet (the next one, wrapping within it).
        proxy.sandbox_ip = plan::proxy_address(subnet, u32::from_le_bytes(random).wrapping_add(1))
            .ok_or_else(small)?;
        let args = plan::proxy_run(engine.engine(), proxy)?;
        let out = engine.output(&args)?;
        if out.success {
            break;
        }
        let taken = ["already", "in use", "allocated"].iter().any(|w| out.stderr.contains(w));
        if !taken || attempt == 4 {
            return Err(EngineError::Failed {
                command: engine.describe(&args),
                status: "non-zero exit".into(),
                stderr: out.stderr.trim().to_owned(),
            }
            .into());
        }
        // A container of that name may exist half-made; the next attempt reuses the name.
        let _ = engine.output(&plan::remove(&proxy.name));
    }
    if engine.engine() == super::Engine::Docker {
        engine.check(&plan::network_connect(&proxy.uplink, &proxy.name))?;
    }
    wait_ready(engine, &proxy.name, &p.run_dir.join(PROXY_DIR).join("ready"))
}

/// Until `until`'s sender goes (the sandbox ended): polls for the proxy's stop file; once it
/// is there, says why and kills the sandbox container `name`. Returns the stop's reason code
/// when it did.
fn watch_stop_file(
    engine: &dyn EngineCli,
    stop_file: &Path,
    name: &str,
    until: std::sync::mpsc::Receiver<()>,
) -> Option<String> {
    // A stat every 50 ms: the proxy keeps refusing meanwhile, so nothing leaves in between.
    loop {
        if let Some((reason, message)) = read_stop_file(stop_file) {
            eprintln!("airlock: session stopped: {message}");
            // Until the kill lands or the sandbox is gone: the file may appear before the
            // engine has made the container, and a failed kill must not leave it running.
            let mut warned = false;
            loop {
                if engine.output(&plan::kill(name)).is_ok_and(|o| o.success) {
                    return Some(reason);
                }
                if !warned {
                    eprintln!("airlock: the sandbox container {name} is not killed yet; retrying");
                    warned = true;
                }
                match until.recv_timeout(Duration::from_millis(100)) {
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    _ => return Some(reason),
                }
            }
        }
        match until.recv_timeout(Duration::from_millis(50)) {
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            // The sandbox ended (the sender was dropped; nothing is ever sent).
            _ => return None,
        }
    }
}

/// The proxy's stop file, once it is there: its reason code and message.
fn read_stop_file(path: &Path) -> Option<(String, String)> {
    let text = std::fs::read_to_string(path).ok()?;
    let notice: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let reason = notice["reason"].as_str().unwrap_or("audit_budget").to_owned();
    let message = notice["message"].as_str().unwrap_or("the proxy stopped it").to_owned();
    Some((reason, message))
}

/// Docker: puts the drop rule for the repo's bridge in place on the engine host by a helper
/// container running `airlockd bridge-guard` from the proxy image (a docker-group user has no
/// root there; the engine does). Run every session: the rule does not outlive a reboot or a
/// firewall reload, while the network does. Replacing it is atomic and idempotent.
fn guard_bridge(engine: &dyn EngineCli, image: &str, bridge: &str) -> Result<(), ContainerError> {
    let args = plan::bridge_guard_run(image, &[bridge.to_owned()], false);
    let out = engine.output(&args)?;
    if out.success {
        return Ok(());
    }
    Err(ContainerError::Setup(format!(
        "could not put the host-side drop rule for the bridge {bridge} in place (`{}`: {}); \
         the session was not started. The engine must let a container use the host network \
         with NET_ADMIN (rootful Docker does); see docs/backends.md, \"Docker's bridge guard\"",
        engine.describe(&args),
        (out.stderr.trim().to_owned() + out.stdout.trim()).trim()
    )))
}

/// `rm -f` of the container `name` holds, if any (a missing one is no error).
fn remove_now(engine: &dyn EngineCli, name: &mut Option<String>) {
    if let Some(name) = name.take() {
        let _ = engine.output(&plan::remove(&name));
    }
}

/// Refuses a bind source that is, or passes through, a symlink: the engine would follow it to
/// wherever it points now.
fn refuse_symlinks(path: &Path) -> Result<(), ContainerError> {
    let mut at = PathBuf::new();
    for part in path.components() {
        at.push(part);
        let meta = std::fs::symlink_metadata(&at)
            .map_err(|e| ContainerError::Setup(format!("{}: {e}", at.display())))?;
        if meta.file_type().is_symlink() {
            return Err(ContainerError::Setup(format!(
                "{} became a symlink since the session's start (mounting {}); nothing was run",
                at.display(),
                path.display()
            )));
        }
    }
    Ok(())
}

/// The repo's network, made if missing, and judged sealed; returns its
/// [`plan::network_inspect`] output (seal and subnets). Two sessions may race to make it: a
/// failed create is fine when the network is there afterwards.
fn ensure_network(engine: &dyn EngineCli, name: &str, key: &str) -> Result<String, ContainerError> {
    let inspect = plan::network_inspect(engine.engine(), name);
    let found = engine.output(&inspect)?;
    if found.success {
        return check_sealed(engine, name, found.stdout);
    }
    let mut attempt = 0;
    loop {
        // Podman picks a free subnet itself; Docker needs one given to place the proxy.
        let subnet =
            (engine.engine() == super::Engine::Docker).then(|| plan::docker_subnet(key, attempt));
        let args = plan::network_create(engine.engine(), name, key, subnet);
        let out = engine.output(&args)?;
        // Made, or made by another session meanwhile (judged like any network found).
        let found = engine.output(&inspect)?;
        if found.success {
            return check_sealed(engine, name, found.stdout);
        }
        attempt += 1;
        if subnet.is_none() || !out.stderr.contains("overlap") || attempt == 8 {
            return Err(EngineError::Failed {
                command: engine.describe(&args),
                status: "non-zero exit".into(),
                stderr: out.stderr.trim().to_owned(),
            }
            .into());
        }
    }
}

/// Refuses a network of the repo's name that is not sealed: anyone who can use the engine can
/// make one (the name is derived from the repo's path), and a session on it would have a way
/// out. Returns `inspected` when it is sealed.
fn check_sealed(
    engine: &dyn EngineCli,
    name: &str,
    inspected: String,
) -> Result<String, ContainerError> {
    match plan::judge_seal(engine.engine(), name, &inspected) {
        Ok(()) => Ok(inspected),
        Err(why) => Err(ContainerError::Setup(format!(
            "the network {name} exists but is not sealed ({why}); Airlock did not make it this \
             way. Remove it (`{} network rm {name}`) and Airlock makes it again",
            engine.engine()
        ))),
    }
}

/// Waits for the proxy's ready file; a proxy that exits or never listens is reported with its
/// own words (`logs`).
fn wait_ready(engine: &dyn EngineCli, name: &str, ready: &Path) -> Result<(), ContainerError> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(2);
    while start.elapsed() < PROXY_READY_WAIT {
        if ready.exists() {
            return Ok(());
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
    let logs = engine.output(&plan::logs(name)).map(|o| o.stderr + &o.stdout).unwrap_or_default();
    Err(ContainerError::ProxyNotReady {
        name: name.to_owned(),
        secs: PROXY_READY_WAIT.as_secs(),
        logs: logs.trim().to_owned(),
    })
}

/// The sandbox's mounts: the repo read-write at its sandbox path, external git dirs at their
/// host paths, pinned directories onto themselves (a mount point cannot be renamed away), and
/// every protected path present at the start read-only — the native plan's walls
/// ([`crate::sandbox::mounts::plan`]) in an engine's terms.
fn binds(req: &Request, prot: &Protection) -> Vec<Bind> {
    let repo_inside = req.repo.sandbox_path();
    let inside = |host: &Path| match host.strip_prefix(&req.repo.path) {
        Ok(rel) => repo_inside.join(rel),
        Err(_) => host.to_path_buf(),
    };
    let mut out =
        vec![Bind { host: req.repo.path.clone(), inside: repo_inside.clone(), read_only: false }];
    for ext in prot.external.iter().filter(|e| !e.starts_with(&req.repo.path)) {
        out.push(Bind { host: ext.clone(), inside: ext.clone(), read_only: false });
    }
    for pinned in &prot.pinned {
        out.push(Bind { host: pinned.clone(), inside: inside(pinned), read_only: false });
    }
    for item in &prot.listed {
        if matches!(item.state, State::Dir | State::File) {
            let host = item.host_path();
            out.push(Bind { inside: inside(&host), host, read_only: true });
        }
    }
    // `--mount` and `[sandbox] mounts`, as judged at launch.
    for m in &req.mounts {
        out.push(Bind { host: m.src.clone(), inside: m.dst.clone(), read_only: !m.rw });
    }
    out
}

/// Nothing may be mounted over (or under) the repo or an external git dir: the engine would
/// make the mount point in the host tree. The native supervisor refuses the same.
fn refuse_overlaps(req: &Request, prot: &Protection) -> Result<(), ContainerError> {
    let overlaps = |a: &Path, b: &Path| a.starts_with(b) || b.starts_with(a);
    let repo_inside = req.repo.sandbox_path();
    let taken: Vec<&Path> = std::iter::once(repo_inside.as_path())
        .chain(prot.external.iter().map(PathBuf::as_path))
        .chain(std::iter::once(Path::new(crate::sandbox::env::SANDBOX_HOME)))
        .collect();
    for m in &req.mounts {
        if let Some(t) = taken.iter().find(|t| overlaps(&m.dst, t)) {
            return Err(ContainerError::Setup(format!(
                "{} would be mounted over {} inside the sandbox; choose another place",
                m.dst.display(),
                t.display()
            )));
        }
    }
    Ok(())
}

/// `--env-file` text: `NAME=VALUE` lines. The sandbox's proxy is the proxy container; `PATH`
/// is the native session's (toolchain mounts first, then `/usr/local/bin:/usr/bin:/bin`). A
/// value with a newline cannot be carried and is refused.
fn env_file_text(env: &[(OsString, OsString)]) -> Result<Vec<u8>, ContainerError> {
    let proxy_url = format!("http://{}:{}", names::PROXY_HOST, names::PROXY_PORT);
    let mut out = Vec::new();
    for (k, v) in env {
        let name = k.to_string_lossy();
        let value: std::borrow::Cow<'_, [u8]> = match name.as_ref() {
            "HTTP_PROXY" | "HTTPS_PROXY" | "http_proxy" | "https_proxy" => {
                proxy_url.as_bytes().into()
            }
            _ => v.as_encoded_bytes().into(),
        };
        if value.iter().any(|b| matches!(b, b'\n' | b'\r' | 0)) || name.contains('=') {
            return Err(ContainerError::Setup(format!(
                "the environment variable {name} has a newline in its value, which a container \
                 engine's --env-file cannot carry; unset it or use --backend native"
            )));
        }
        out.extend_from_slice(k.as_encoded_bytes());
        out.push(b'=');
        out.extend_from_slice(&value);
        out.push(b'\n');
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_env_file_points_at_the_proxy_container_and_refuses_what_it_cannot_carry() {
        let env: Vec<(OsString, OsString)> = vec![
            ("HTTPS_PROXY".into(), "http://127.0.0.1:8888".into()),
            ("NO_PROXY".into(), "localhost,127.0.0.1".into()),
            ("AIRLOCK_REPO".into(), "/app".into()),
            ("TOKEN".into(), "a b=c".into()),
        ];
        let text = String::from_utf8(env_file_text(&env).unwrap()).unwrap();
        assert_eq!(
            text,
            "HTTPS_PROXY=http://airlock-proxy:8888\nNO_PROXY=localhost,127.0.0.1\n\
             AIRLOCK_REPO=/app\nTOKEN=a b=c\n"
        );
        let bad = vec![("KEY".into(), "line1\nline2".into())];
        let e = env_file_text(&bad).unwrap_err().to_string();
        assert!(e.contains("KEY") && e.contains("--backend native"), "{e}");
    }
}
