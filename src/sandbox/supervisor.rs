//! The host-side supervisor of one `exec` session: prepares the plan, forks into the new
//! namespaces, receives the handed-over sockets (proxy listener, resolver and capture sockets)
//! and the pty master over the socketpair made before the fork, hands the sockets to the
//! [`ProxyBridge`], relays stdio and signals, and at the
//! end quarantines planted protected paths and reports the exit status.

use std::ffi::{CString, OsString};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
use nix::sys::termios::{self, SetArg, Termios};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{Pid, isatty};

use super::bridge::{ProxyBridge, SessionEnd, SessionInfo};
use super::cgroup::{self, Leaf};
use super::gitconfig;
use super::gitptr;
use super::inside::{self, Slot, Spec};
use super::mounts::{self, HostView, PlanInput};
use super::probe::{Kernel, MANDATORY_LAYERS};
use super::protect::{self, Protection};
use super::quarantine;
use super::relay::{self, Endpoint, Events, Pump};
use super::sweep::{self, Report};
use super::termfilter::{TermFilter, TerminalPolicy};
use crate::repo::Repo;
use crate::sys::exec::{self as sysx, StdFd};
use crate::sys::fdpass::{self, Handover, SocketKind};
use crate::sys::namespaces::{self, Forked, SANDBOX_NAMESPACES};

/// Why a session could not run (exit 125).
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("the sandbox cannot be set up on this machine: {0}")]
    Unavailable(String),
    #[error("{0}")]
    Protect(#[from] protect::ProtectError),
    #[error("sandbox setup failed: {0}")]
    Setup(String),
    #[error("the proxy could not take the session: {0}")]
    Bridge(String),
    #[error("{0}")]
    Ports(#[from] super::ports::PortsError),
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

fn io_ctx(what: &'static str) -> impl FnOnce(io::Error) -> SandboxError {
    move |source| SandboxError::Io { what, source }
}

/// One `exec` request, fully resolved by the CLI.
#[derive(Debug, Clone)]
pub struct Request {
    pub session: String,
    pub repo: Repo,
    pub argv: Vec<OsString>,
    /// The complete environment inside (from [`super::env::build`]).
    pub env: Vec<(OsString, OsString)>,
    pub user_id: Option<String>,
    /// `~/.airlock/quarantine/<session>/`.
    pub quarantine_dir: PathBuf,
    /// The repo's git pointers, already judged against `airlock policy trust`'s record
    /// ([`gitptr::verify`]): the git dirs to protect and the external ones to bind.
    pub git: gitptr::Found,
    /// The developer's system and global git config files (`/etc/gitconfig`, `~/.gitconfig`,
    /// `$XDG_CONFIG_HOME/git/config`): what they make a host `git` read from the worktree is
    /// protected too.
    pub host_git_configs: Vec<PathBuf>,
    /// Limits for the session's cgroup (where a delegated cgroup v2 subtree exists).
    pub limits: cgroup::Limits,
    /// `/home/agent`: a tmpfs for `exec`, the per-repo agent home for `run`.
    pub home: mounts::HomeMount,
    /// Read-only `(host, sandbox)` binds and `(link, target)` symlinks for an agent's files.
    pub ro_binds: Vec<(PathBuf, PathBuf)>,
    pub symlinks: Vec<(PathBuf, PathBuf)>,
    /// The agent's name and version, for the session record (`run` only).
    pub agent: Option<String>,
    pub agent_version: Option<String>,
    /// What the pty relay lets reach the caller's terminal.
    pub terminal: TerminalPolicy,
    /// Judged `[sandbox] mounts`/`--mount` trees and the per-repo caches
    /// ([`super::usermount`]), parents first.
    pub mounts: Vec<super::usermount::UserMount>,
    /// The working directory inside (`None`: the repo root).
    pub workdir: Option<PathBuf>,
    /// `--port` (command line only): servers inside made reachable from the host.
    pub ports: Vec<super::ports::PortSpec>,
    /// Files Airlock writes into the synthesized, read-only `/etc` (the Claude Code managed
    /// settings and hook of `[gate] commands`: docs/gates.md).
    pub etc_files: Vec<mounts::EtcFile>,
}

/// The result of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub exit_code: i32,
    /// What the end-of-session sweep did (quarantined items, stripped bits, …).
    pub sweep: Report,
    /// What Landlock ended up enforcing, as reported from inside.
    pub landlock: String,
    /// The proxy's side stopped the session (`[audit]` bounds) and the sandbox was killed;
    /// `exit_code` is then [`STOPPED_EXIT`].
    pub stopped: Option<super::bridge::Stopped>,
}

/// Exit status of a session Airlock stopped while it ran (`[audit] session_budget`,
/// `[audit] min_free`): distinct from 125 (Airlock could not run it) and from a signal's
/// 128+N.
pub const STOPPED_EXIT: i32 = 124;

fn cstring(s: impl AsRef<[u8]>) -> Result<CString, SandboxError> {
    CString::new(s.as_ref()).map_err(|_| SandboxError::Setup("argument contains a NUL byte".into()))
}

fn pipe() -> Result<(OwnedFd, OwnedFd), SandboxError> {
    nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| io_ctx("pipe")(e.into()))
}

/// Restores the caller's terminal on drop; while raw, the CLI's log events go to a file
/// (`logging::divert_while_raw`; the guard drops after the terminal is restored).
struct RawMode(Option<Termios>, Option<crate::logging::Diverted>);

impl RawMode {
    fn enter(on: bool) -> Self {
        if !on {
            return Self(None, None);
        }
        let fd = StdFd::IN.borrow();
        match termios::tcgetattr(fd) {
            Ok(saved) => {
                let mut raw = saved.clone();
                termios::cfmakeraw(&mut raw);
                let _ = termios::tcsetattr(fd, SetArg::TCSANOW, &raw);
                Self(Some(saved), Some(crate::logging::divert_while_raw()))
            }
            Err(_) => Self(None, None),
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(saved) = &self.0 {
            let _ = termios::tcsetattr(StdFd::IN.borrow(), SetArg::TCSAFLUSH, saved);
        }
        // Only now, with the terminal cooked again, may the diversion's summary be printed.
        drop(self.1.take());
    }
}

/// How long a terminal's answer to a relayed query (DA, DSR, a colour query) may still be on
/// its way when the session ends.
const LATE_ANSWER: Duration = Duration::from_millis(50);

/// Discards input waiting on the caller's terminals once the session is over: with stdin a
/// pipe and stdout a tty, nothing reads a terminal's answer to what the agent sent, and it
/// would otherwise be typed into the caller's shell. After a relayed query the answer may
/// still be in flight, so it is given a moment to arrive first.
fn flush_host_input(tty: &[bool; 3], query_relayed: bool) {
    if !tty.contains(&true) {
        return;
    }
    if query_relayed {
        std::thread::sleep(LATE_ANSWER);
    }
    // SIGTTOU blocked: a session run in the background must not be stopped by the flush.
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut old = SigSet::empty();
    let blocked = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut old)).is_ok();
    for fd in StdFd::ALL.into_iter().filter(|fd| tty[fd.index()]) {
        let _ = termios::tcflush(fd.borrow(), termios::FlushArg::TCIFLUSH);
    }
    if blocked {
        let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
    }
}

struct Watch {
    child: Pid,
    status: Option<WaitStatus>,
    master: Option<OwnedFd>,
    winsize_from: Option<StdFd>,
    /// Readable once the proxy's side stopped the session ([`ProxyBridge::stop_fd`]); taken
    /// when acted on.
    stop: Option<OwnedFd>,
    /// The sandbox was killed because the session was stopped.
    killed_for_stop: bool,
    /// Our end of the control socket, on which init reports the command's end once nothing
    /// else of the session is left (`inside::finish`); dropped once read.
    control: Option<OwnedFd>,
    /// The command's exit code as init reported it; init itself may still be exiting.
    reported: Option<i32>,
}

impl Events for Watch {
    fn signal(&mut self, sig: Signal) {
        match sig {
            Signal::SIGCHLD => {
                if let Ok(st @ (WaitStatus::Exited(..) | WaitStatus::Signaled(..))) =
                    waitpid(self.child, Some(WaitPidFlag::WNOHANG))
                {
                    self.status = Some(st);
                }
            }
            Signal::SIGWINCH => {
                if let (Some(master), Some(from)) = (&self.master, self.winsize_from)
                    && let Some(ws) = sysx::window_size(from.borrow())
                {
                    let _ = sysx::set_window_size(master.as_fd(), &ws);
                }
            }
            other => {
                let _ = kill(self.child, other);
            }
        }
    }
    fn finished(&self) -> bool {
        self.status.is_some() || self.reported.is_some()
    }
    fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.stop.as_ref().map(AsFd::as_fd)
    }
    fn woken(&mut self) {
        self.stop = None;
        if self.finished() {
            return; // it ended on its own first
        }
        // SIGKILL to init: when a PID namespace's init dies the kernel kills every other
        // process in it (pid_namespaces(7)), so nothing of the session keeps running.
        self.killed_for_stop = kill(self.child, Signal::SIGKILL).is_ok();
    }
    fn report_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.control.as_ref().map(AsFd::as_fd)
    }
    fn reported(&mut self) {
        let mut buf = [0u8; 64];
        let read = self.control.as_ref().map(|c| {
            nix::sys::socket::recv(
                c.as_raw_fd(),
                &mut buf,
                nix::sys::socket::MsgFlags::MSG_DONTWAIT,
            )
        });
        match read {
            Some(Err(nix::errno::Errno::EAGAIN | nix::errno::Errno::EINTR)) => {}
            Some(Ok(n)) if n > 0 => {
                // Anything but the report is ignored; init's own exit tells the end then.
                self.reported = buf.get(..n).and_then(inside::parse_exit);
                self.control = None;
                if self.reported.is_some() && self.status.is_none() {
                    // Init exits right after its report; this makes sure of it (a report that
                    // did not come from there cannot keep the session alive past the sweep).
                    // Not once reaped: the pid could be another process's by now.
                    let _ = kill(self.child, Signal::SIGKILL);
                }
            }
            // Closed without a report (init was killed) or unreadable: SIGCHLD tells.
            _ => self.control = None,
        }
    }
}

impl Request {
    /// What the daemon is told about this session, with the sandbox layers in force and those
    /// that were not available.
    pub fn session_info(&self, layers: Vec<String>, missing: Vec<String>) -> SessionInfo {
        SessionInfo {
            session: self.session.clone(),
            repo_name: self.repo.name.clone(),
            repo_path: self.repo.path.clone(),
            command: self.argv.iter().map(|a| a.to_string_lossy().into_owned()).collect(),
            user_id: self.user_id.clone(),
            agent: self.agent.clone(),
            agent_version: self.agent_version.clone(),
            layers,
            missing_layers: missing,
        }
    }
}

/// Runs one session to its end.
pub fn run(
    req: &Request,
    kernel: &Kernel,
    bridge: &mut dyn ProxyBridge,
) -> Result<Outcome, SandboxError> {
    let problems = kernel.mandatory_problems();
    if !problems.is_empty() {
        return Err(SandboxError::Unavailable(problems.join("; ")));
    }
    let mut protection = protect::scan(&req.repo.path, &req.git, &req.host_git_configs)?;
    // The placeholders are made after the fork, while the child sets up its namespaces (issue
    // 22): the plan is made for the protection they are expected to give and checked against
    // the real one before the child may mount anything.
    let predicted = protect::with_predicted_placeholders(&protection, &req.repo.path);
    let home_dir = home_path(&req.home);
    // Private writable copies of the git configs (removed when this is dropped). They depend
    // on the git configs listed, never on the placeholders.
    let (mut git_configs, warnings) =
        gitconfig::prepare(&protection, &req.quarantine_dir.join(gitconfig::WORK_DIR));
    for w in warnings {
        eprintln!("airlock: warning: {w}");
    }
    let repo_sandbox = req.repo.sandbox_path();
    // Nothing extra may be mounted over (or under) the repo or an external git dir, which are
    // bound read-write: a mount point made there would land in the host tree.
    let overlaps = |a: &Path, b: &Path| a.starts_with(b) || b.starts_with(a);
    let taken: Vec<&Path> = std::iter::once(repo_sandbox.as_path())
        .chain(protection.external.iter().map(PathBuf::as_path))
        .collect();
    let extra = req
        .ro_binds
        .iter()
        .map(|(_, dst)| dst)
        .chain(req.symlinks.iter().map(|(l, _)| l))
        .chain(req.mounts.iter().map(|m| &m.dst));
    for dst in extra {
        if let Some(t) = taken.iter().find(|t| overlaps(dst, t)) {
            return Err(SandboxError::Setup(format!(
                "{} would be mounted over {} inside the sandbox; install the agent elsewhere",
                dst.display(),
                t.display()
            )));
        }
    }
    let uid = nix::unistd::getuid().as_raw();
    let gid = nix::unistd::getgid().as_raw();
    let host_view = HostView::read();
    let plan = |protection: &Protection| {
        mounts::plan(
            &PlanInput {
                repo_host: &req.repo.path,
                repo_sandbox: &repo_sandbox,
                hostname: req.repo.hostname(),
                uid,
                gid,
                protection,
                home: &req.home,
                ro_binds: &req.ro_binds,
                symlinks: &req.symlinks,
                user_mounts: &req.mounts,
                git_configs: &git_configs.redirects,
                etc_files: &req.etc_files,
            },
            &host_view,
        )
    };
    let ops = plan(&predicted);
    if uid != 0 {
        refuse_group_only_binds(&mounts::host_sources(&ops))?;
    }
    sysx::ensure_stdio_open().map_err(io_ctx("checking stdio"))?;
    sysx::ignore_sigpipe().map_err(io_ctx("SIGPIPE"))?;

    // Per-fd stdio: a pty for terminals, pipes otherwise.
    let tty = StdFd::ALL.map(|fd| isatty(fd.borrow()).unwrap_or(false));
    let mut slots = [Slot::Pty; 3];
    let mut child_ends: [Option<OwnedFd>; 3] = [None, None, None];
    let mut our_ends: [Option<OwnedFd>; 3] = [None, None, None];
    for fd in 0..3 {
        if tty[fd] {
            continue;
        }
        let (r, w) = pipe()?;
        let (theirs, ours) = if fd == 0 { (r, w) } else { (w, r) };
        slots[fd] = Slot::Pipe;
        child_ends[fd] = Some(theirs);
        our_ends[fd] = Some(ours);
    }
    let winsize_from = [StdFd::OUT, StdFd::IN, StdFd::ERR].into_iter().find(|fd| tty[fd.index()]);
    let winsize = winsize_from.and_then(|fd| sysx::window_size(fd.borrow()));

    // The session's cgroup leaf, made before the fork so init is born in it.
    let (mut leaf, mut cgroup_warnings) = session_cgroup(kernel, req);
    let (control, child_control) =
        socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
            .map_err(|e| io_ctx("socketpair")(e.into()))?;
    let (mut err_r, err_w) = pipe()?;
    // `--port`: the host listeners exist before the sandbox does, and init gets its end of a
    // channel of its own (non-blocking there: init never waits on the host).
    let published = if req.ports.is_empty() {
        None
    } else {
        Some(super::ports::publish(&req.ports, &req.session)?)
    };
    let (ports_ours, ports_init) = match &published {
        None => (None, None),
        Some(_) => {
            let (ours, init) =
                socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
                    .map_err(|e| io_ctx("socketpair")(e.into()))?;
            // Each end is its own open file description: only init's becomes non-blocking.
            nix::fcntl::fcntl(&init, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
                .map_err(|e| io_ctx("the port channel")(e.into()))?;
            (Some(ours), Some(init))
        }
    };

    let path_dirs = req
        .env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| std::env::split_paths(v).collect())
        .unwrap_or_default();
    let mut spec = Spec {
        ops,
        hostname: req.repo.hostname().to_string(),
        uid,
        gid,
        argv: req.argv.iter().map(|a| cstring(a.as_encoded_bytes())).collect::<Result<_, _>>()?,
        envp: req
            .env
            .iter()
            .map(|(k, v)| {
                let mut kv = k.as_encoded_bytes().to_vec();
                kv.push(b'=');
                kv.extend_from_slice(v.as_encoded_bytes());
                cstring(kv)
            })
            .collect::<Result<_, _>>()?,
        path_dirs,
        cwd: req.workdir.clone().unwrap_or_else(|| repo_sandbox.clone()),
        stdio: slots,
        winsize,
        writable: mounts::writable_paths(
            &repo_sandbox,
            &protection
                .external
                .iter()
                .cloned()
                .chain(req.mounts.iter().filter(|m| m.rw).map(|m| m.dst.clone()))
                .collect::<Vec<_>>(),
        )
        .into_iter()
        .chain(git_configs.writable())
        .collect(),
        landlock: kernel.landlock_abi.is_some(),
        cgroup_ns_at_leaf: leaf.is_some(),
        seccomp: super::seccomp::build().map_err(|e| SandboxError::Setup(e.to_string()))?,
        ports: published.as_ref().map(super::ports::Published::sandbox_ports).unwrap_or_default(),
    };

    // A root caller's supplementary groups would stay with the sandbox (setgroups is denied
    // inside, user_namespaces(7)): drop them while we still can.
    if uid == 0 {
        nix::unistd::setgroups(&[])
            .map_err(|e| io_ctx("dropping supplementary groups")(e.into()))?;
    }
    // Signals are blocked before the fork: the supervisor reads them from a signalfd, init
    // waits for them with sigwait, and the command unblocks them before exec.
    let mask = inside::forwarded_signals();
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&mask), None)
        .map_err(|e| io_ctx("sigprocmask")(e.into()))?;
    let mut inherited = inside::Inherited {
        control: child_control,
        errpipe: err_w,
        stdio: child_ends,
        ports: ports_init,
    };
    let unblock = || {
        let _ = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&mask), None);
    };
    let unavailable = |e: io::Error| {
        unblock();
        SandboxError::Unavailable(format!(
            "creating the namespaces failed: {e}{}",
            if e.raw_os_error() == Some(libc::EPERM) || e.raw_os_error() == Some(libc::ENOSPC) {
                "; run `airlock doctor` for the kernel settings it needs"
            } else {
                ""
            }
        ))
    };
    let mut child =
        fork_init(&spec, &inherited, &mut leaf, &mut cgroup_warnings).map_err(unavailable)?;
    // While the child sets up its namespaces and network, which mount nothing yet.
    for w in protect::make_placeholders(&mut protection, &req.repo.path) {
        eprintln!("airlock: warning: {w}");
    }
    // Whatever happens from here on, this session's placeholders do not outlive it.
    let mut placeholders =
        PlaceholderGuard { prot: &protection, repo: &req.repo.path, armed: true };
    // T0 for the end sweep, after our own writes to the repo (the placeholders).
    let mut roots: Vec<&Path> = vec![&req.repo.path];
    roots.extend(protection.external.iter().map(PathBuf::as_path));
    roots.extend(home_dir.as_deref());
    let threshold = sweep::threshold(&roots);
    let since = threshold.since;
    let ops = plan(&protection);
    if ops != spec.ops {
        // A placeholder could not be made (a read-only repo, a name taken on the host since the
        // scan), so the child's plan is not this session's: it never mounts. A new child gets
        // the plan the placeholders gave, and a fresh error pipe (the first may have written).
        let _ = kill(child, Signal::SIGKILL);
        let _ = waitpid(child, None);
        if uid != 0 {
            refuse_group_only_binds(&mounts::host_sources(&ops)).inspect_err(|_| unblock())?;
        }
        spec.ops = ops;
        let (r, w) = pipe().inspect_err(|_| unblock())?;
        err_r = r;
        inherited.errpipe = w;
        child =
            fork_init(&spec, &inherited, &mut leaf, &mut cgroup_warnings).map_err(unavailable)?;
    }
    drop(spec);
    drop(inherited);
    // The go-ahead: the placeholders exist and T0 is known. A child already gone is reported
    // by the receive below, from its error pipe.
    let _ = nix::sys::socket::send(
        control.as_raw_fd(),
        &inside::go_message(threshold.not_before),
        nix::sys::socket::MsgFlags::MSG_NOSIGNAL,
    );

    // The listener arrives once init has built the walls up to Landlock; the session is
    // registered while init drops capabilities, installs seccomp and starts the command
    // (connections made meanwhile wait in the listener's backlog).
    let received = receive_fds(&control);
    let read_setup_error = move || {
        let mut setup_error = String::new();
        let _ = std::fs::File::from(err_r).read_to_string(&mut setup_error);
        setup_error
    };
    let (listener, master, Status { landlock, capture6 }) = match received {
        Ok((Some(listener), master, status)) => (listener, master, status),
        res => {
            let setup_error = read_setup_error();
            let _ = kill(child, Signal::SIGKILL);
            let _ = waitpid(child, None);
            let _ = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&mask), None);
            let msg = if !setup_error.is_empty() {
                setup_error
            } else {
                match res {
                    Err(e) => e.to_string(),
                    _ => "the sandbox did not hand over its proxy and resolver sockets".into(),
                }
            };
            return Err(SandboxError::Setup(msg));
        }
    };

    // Optional layers as actually enforced inside (Landlock reports from within).
    let mut layers: Vec<String> = MANDATORY_LAYERS.iter().map(|s| s.to_string()).collect();
    let mut missing = kernel.optional_warnings();
    if matches!(landlock.as_str(), "full" | "partial") {
        layers.extend(kernel.optional_layers());
    } else {
        layers.extend(kernel.optional_layers().into_iter().filter(|l| !l.starts_with("landlock")));
        missing.push(format!("landlock not in force: {landlock}"));
    }
    if let Some(leaf) = &leaf {
        layers.extend(leaf.layers.iter().cloned());
    }
    missing.extend(cgroup_warnings);
    // No IPv6 in the sandbox's namespace: IPv4 is captured, IPv6 connections fail inside
    // (ENETUNREACH or EADDRNOTAVAIL; nothing can leave), so the session runs — with a warning,
    // because those failures leave no audit line (`airlock doctor` says the same).
    if let Some(why) = capture6 {
        let warning = format!(
            "IPv6 capture not in force (IPv6 connections fail inside the sandbox and leave no \
             audit line; see `airlock doctor`): {why}"
        );
        eprintln!("airlock: warning: {warning}");
        missing.push(warning);
    }
    let info = req.session_info(layers, missing);
    let started = bridge.start(listener, &info);
    let setup_error = read_setup_error();
    if started.is_err() || !setup_error.is_empty() {
        let _ = kill(child, Signal::SIGKILL);
        let _ = waitpid(child, None);
        let _ = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&mask), None);
        return Err(match started {
            Err(e) => SandboxError::Bridge(e.to_string()),
            Ok(()) => {
                bridge.end(&SessionEnd { exit_code: 125, ..SessionEnd::default() });
                SandboxError::Setup(setup_error)
            }
        });
    }

    let ports = match (published, ports_ours) {
        (Some(published), Some(channel)) => {
            match start_ports(published, channel, &req.session, &*bridge) {
                Ok(service) => Some(service),
                Err(e) => {
                    let _ = kill(child, Signal::SIGKILL);
                    let _ = waitpid(child, None);
                    let _ = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&mask), None);
                    bridge.end(&SessionEnd { exit_code: 125, ..SessionEnd::default() });
                    return Err(e);
                }
            }
        }
        _ => None,
    };

    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
        .map_err(|e| io_ctx("signalfd")(e.into()))?;
    let mut pumps = build_pumps(&tty, our_ends, master.as_ref(), req.terminal)?;
    let _raw = RawMode::enter(tty[0]);
    let stop = bridge.stop_fd();
    let mut watch = Watch {
        child,
        status: None,
        master,
        winsize_from,
        stop,
        killed_for_stop: false,
        control: Some(control),
        reported: None,
    };
    // The child may have exited before the signalfd existed.
    watch.signal(Signal::SIGCHLD);
    // Setup is over: what remains is the relay loop, so the setup's code pages can go (a
    // moment in, so short commands never pay for it; issue 22).
    crate::sys::memtrim::release_later(Duration::from_millis(500));
    let relayed = relay::run(&mut pumps, &signals, &mut watch);
    // Either init is reaped, or it reported the command's code once it had killed and reaped
    // everything else (`inside::finish`) and is exiting: in both cases no process of the
    // session but init is left, so the sweep may start. Init is reaped at the very end.
    // The report wins over init's own status, which our SIGKILL after the report may set.
    let (code, mut init_reaped) = match (watch.reported, watch.status) {
        (Some(code), status) => (code, status.is_some()),
        (None, Some(st)) => (inside::exit_code(st).unwrap_or(125), true),
        (None, None) => {
            let st = waitpid(child, None).map_err(|e| io_ctx("waitpid")(e.into()))?;
            (inside::exit_code(st).unwrap_or(125), true)
        }
    };
    if !init_reaped && let Some(leaf) = &leaf {
        // The cgroup's backstop, before the sweep as when init was reaped first.
        leaf.kill_all();
    }
    drop(_raw);
    flush_host_input(&tty, pumps.iter().any(Pump::relayed_a_query));
    relayed.map_err(io_ctx("relaying stdio"))?;
    let stopped = if watch.killed_for_stop { bridge.stopped() } else { None };
    let exit_code = if stopped.is_some() { STOPPED_EXIT } else { code };
    // Every inbound connection's line before the end record (the sandbox is gone, so the
    // relays are ending).
    if let Some(service) = ports {
        service.finish(PORTS_GRACE);
    }
    // The placeholders go as soon as the walk that reads the repo's ctimes is over, on a
    // helper thread: during the git-config merge and the daemon's `session_end` round trip
    // (issue 22; each directory's removal is an inode eviction, ~0.1-0.3 ms on ext4). Both
    // are over before `exec` returns (the scope joins the helper).
    let report = std::thread::scope(|scope| {
        let remove = || protect::remove_placeholders(&protection, &req.repo.path);
        let mut helper = false;
        let report = end_of_session(req, &protection, since, &mut git_configs, || {
            helper = std::thread::Builder::new()
                .name("airlock-unplace".into())
                .stack_size(64 * 1024)
                .spawn_scoped(scope, remove)
                .is_ok();
        });
        bridge.end(&SessionEnd {
            exit_code,
            quarantined: report.items.iter().map(to_protocol).collect(),
            leftovers: leftovers(&report),
            ..SessionEnd::default()
        });
        if !helper {
            remove();
        }
        report
    });
    placeholders.disarm();
    if !init_reaped {
        init_reaped = waitpid(child, None).is_ok();
    }
    // Init is reaped, so every process of its PID namespace is gone: the leaf can go. (Were it
    // not, removing would wait out EBUSY; the leaf's drop then tries once.)
    if let Some(leaf) = leaf.take()
        && init_reaped
        && let Err(e) = leaf.remove()
    {
        eprintln!("airlock: warning: {e}");
    }
    let _ = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&mask), None);
    Ok(Outcome { exit_code, sweep: report, landlock, stopped })
}

/// How long the end of a session waits for `--port` relays to report.
const PORTS_GRACE: Duration = Duration::from_secs(2);

/// The `--port` relay, once the bridge said it can audit it; tells the user where to connect.
fn start_ports(
    published: super::ports::Published,
    channel: OwnedFd,
    session: &str,
    bridge: &dyn ProxyBridge,
) -> Result<super::ports::Service, SandboxError> {
    let Some(report) = bridge.inbound() else {
        return Err(SandboxError::Bridge(
            "--port needs an airlockd that audits inbound connections (capability \
             `session_inbound`), and the running one does not; restart it with this version \
             (`airlock service install`, or stop the old airlockd) or run without --port"
                .into(),
        ));
    };
    for line in published.announcement() {
        eprintln!("airlock: {line}");
    }
    let channel = super::ports::Channel::new(channel).map_err(io_ctx("the port channel"))?;
    super::ports::Service::start(published, channel, session.to_string(), report)
        .map_err(io_ctx("starting the port relay"))
}

/// Removes the session's placeholders on every way out of [`run`] but the normal end, which
/// removes them itself after the sweep and disarms it.
struct PlaceholderGuard<'a> {
    prot: &'a Protection,
    repo: &'a Path,
    armed: bool,
}

impl PlaceholderGuard<'_> {
    /// The normal end removed them: a second pass would only look for them again.
    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for PlaceholderGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            protect::remove_placeholders(self.prot, self.repo);
        }
    }
}

/// Forks init into the sandbox's namespaces, in the session's cgroup leaf when there is one
/// (without it on a kernel before 5.7, with a warning). The child runs [`inside::run`] with its
/// own copies of `inherited` (fork(2)) and never returns.
fn fork_init(
    spec: &Spec,
    inherited: &inside::Inherited,
    leaf: &mut Option<Leaf>,
    cgroup_warnings: &mut Vec<String>,
) -> io::Result<Pid> {
    let copies = inherited.try_clone()?;
    let mut forked = match leaf.as_ref().and_then(Leaf::dir_fd) {
        Some(dir) => namespaces::fork_into_namespaces_in_cgroup(SANDBOX_NAMESPACES, dir),
        None => namespaces::fork_into_namespaces(SANDBOX_NAMESPACES),
    };
    if leaf.is_some()
        && let Err(e) = &forked
        && matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::E2BIG))
    {
        // Kernel before 5.7 (no clone3 / CLONE_INTO_CGROUP): no cgroup rather than no session.
        let warning = format!("cgroup limits not applied: clone3 CLONE_INTO_CGROUP: {e}");
        eprintln!("airlock: warning: {warning}");
        cgroup_warnings.push(warning);
        *leaf = None;
        forked = namespaces::fork_into_namespaces(SANDBOX_NAMESPACES);
    }
    match forked? {
        Forked::Child => inside::run(spec, copies),
        // The parent's copies close here; the caller keeps the originals.
        Forked::Parent(pid) => Ok(pid),
    }
}

/// The agent home's host path (`run`); `exec`'s home is a tmpfs.
fn home_path(home: &mounts::HomeMount) -> Option<PathBuf> {
    match home {
        mounts::HomeMount::Bind { parent, name } => Some(parent.join(name)),
        mounts::HomeMount::Tmpfs => None,
    }
}

/// The sweep of SECURITY §7, before control returns to the host; its problems are warnings,
/// never the session's exit status.
/// `after_walk` runs once the walk is over (the caller starts removing the placeholders).
fn end_of_session(
    req: &Request,
    protection: &Protection,
    since: sweep::Stamp,
    git_configs: &mut gitconfig::Session,
    after_walk: impl FnOnce(),
) -> Report {
    let home = home_path(&req.home);
    let mut store =
        quarantine::Store::new(req.quarantine_dir.clone(), &req.session, &req.repo.path);
    let mut report = sweep::inspect(
        &sweep::Sweep { repo: &req.repo.path, prot: protection, home, since },
        &mut store,
    );
    after_walk();
    // After the sweep, which would otherwise judge the merged file as the agent's change.
    let merged = git_configs.finish(&mut store, &req.session, &mut gitconfig::ask_on_terminal);
    report.items.extend(merged.items);
    report.git_config_merged = merged.merged;
    report.warnings.extend(merged.warnings);
    if let Err(e) = store.save() {
        eprintln!("airlock: warning: writing the quarantine manifest: {e}");
    }
    report
}

pub(crate) fn to_protocol(item: &quarantine::Item) -> crate::protocol::Quarantined {
    crate::protocol::Quarantined {
        path: item.host_path().display().to_string(),
        moved_to: item.stored.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        why: item.why.clone(),
        how: item.how.as_str().to_string(),
        keys: item.keys.iter().map(|k| k.key.clone()).collect(),
    }
}

pub(crate) fn leftovers(report: &Report) -> crate::protocol::Leftovers {
    let show = |p: &Path| p.display().to_string();
    crate::protocol::Leftovers {
        setuid_stripped: report.setuid_stripped.iter().map(|p| show(p)).collect(),
        outside_symlinks: report
            .outside_symlinks
            .iter()
            .map(|(p, t)| crate::protocol::OutsideSymlink { path: show(p), target: show(t) })
            .collect(),
        outside_symlinks_total: report.outside_symlinks_total,
        instructions_changed: report.instructions_changed.iter().map(|p| show(p)).collect(),
        unscanned: report.unreadable.iter().map(|p| show(p)).collect(),
        scanned_entries: report.entries,
        // The transcript walk's fields are filled by `airlock run`'s bridge.
        ..crate::protocol::Leftovers::default()
    }
}

/// For an unprivileged caller: a bound path readable only through a supplementary group is
/// refused, since the sandbox keeps those groups (setgroups is denied inside it).
fn refuse_group_only_binds(sources: &[PathBuf]) -> Result<(), SandboxError> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let primary = nix::unistd::getegid().as_raw();
    let groups: Vec<u32> = nix::unistd::getgroups()
        .map(|g| g.into_iter().map(|g| g.as_raw()).filter(|g| *g != primary).collect())
        .unwrap_or_default();
    if groups.is_empty() {
        return Ok(());
    }
    for src in sources {
        let Ok(meta) = std::fs::metadata(src) else { continue };
        let mode = meta.mode();
        let (read, other_read) = if meta.is_dir() { (0o050, 0o005) } else { (0o040, 0o004) };
        let only_via_group = meta.uid() != me
            && mode & other_read != other_read
            && mode & read == read
            && groups.contains(&meta.gid());
        if only_via_group {
            return Err(SandboxError::Setup(format!(
                "{} is readable to you only through your supplementary group {} (mode {:04o});                  the sandbox would keep that access, so Airlock refuses to bind it. Make it                  readable without the group (or move the project elsewhere)",
                src.display(),
                meta.gid(),
                mode & 0o7777
            )));
        }
    }
    Ok(())
}

/// Makes the session's cgroup leaf where the probe found a delegated cgroup v2 subtree.
/// Failures are warnings (an optional layer), printed now and returned for the session record;
/// the probe's own warning (no delegation, missing controllers) was already shown once.
fn session_cgroup(kernel: &Kernel, req: &Request) -> (Option<Leaf>, Vec<String>) {
    let mut warnings: Vec<String> = Vec::new();
    let Some(dir) = &kernel.cgroup_delegated else {
        return (None, warnings);
    };
    // Controllers that cannot be enabled (our cgroup holds other processes) are planned as
    // absent: a leaf without limits, and no pointless move of the supervisor.
    let controllers: &[String] =
        if kernel.cgroup_blocked() { &[] } else { &kernel.cgroup_controllers };
    let plan = cgroup::plan(
        dir,
        kernel.cgroup_is_root,
        controllers,
        &kernel.cgroup_subtree,
        &req.session,
        &req.limits,
    );
    let leaf = match cgroup::apply(&plan) {
        Ok(leaf) => {
            warnings.extend(leaf.warnings.iter().cloned());
            Some(leaf)
        }
        Err(e) => {
            warnings.push(format!("cgroup limits not applied: {e}"));
            None
        }
    };
    for w in &warnings {
        eprintln!("airlock: warning: {w}");
    }
    (leaf, warnings)
}

type Received = (Option<Handover>, Option<OwnedFd>, Status);

/// What init reported with its fds (`inside::status_message`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Status {
    landlock: String,
    /// `None`: IPv6 capture in force; otherwise why not.
    capture6: Option<String>,
}

/// The sockets (named by the status text's `sockets=` line, [`SocketKind::ALL`] order; all of
/// them without the line) and the pty master from inside, with the status. Through the one
/// `recvmsg` wrapper, so a truncated control message (more fds than expected) is an error, never
/// a silently shortened list; fewer fds than named sockets is `None`.
fn receive_fds(control: &OwnedFd) -> io::Result<Received> {
    let mut buf = [0u8; 1024];
    let mut fds = Vec::new();
    let n = fdpass::recv_with_fds(control.as_fd(), &mut buf, &mut fds)?;
    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
    let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key)).map(str::to_string);
    let landlock = field("landlock=").unwrap_or_else(|| "unknown".into());
    let capture6 = match field("capture6=") {
        Some(s) if s == "ok" => None,
        Some(why) => Some(why),
        None => Some("not reported by the sandbox".into()),
    };
    let status = Status { landlock, capture6 };
    let kinds: Option<Vec<SocketKind>> = match field("sockets=") {
        Some(list) => list.split(',').map(SocketKind::from_name).collect(),
        None => Some(SocketKind::ALL.to_vec()),
    };
    let Some(kinds) = kinds else { return Ok((None, None, status)) };
    if fds.len() < kinds.len() {
        return Ok((None, None, status));
    }
    let master = fds.split_off(kinds.len()).into_iter().next();
    let sockets = Handover::from_named(&kinds, fds).ok();
    Ok((sockets, master, status))
}

fn build_pumps(
    tty: &[bool; 3],
    our_ends: [Option<OwnedFd>; 3],
    master: Option<&OwnedFd>,
    terminal: TerminalPolicy,
) -> Result<Vec<Pump>, SandboxError> {
    let dup = |m: &OwnedFd| m.try_clone().map_err(io_ctx("dup pty master"));
    let mut pumps = Vec::new();
    let [e0, e1, e2] = our_ends;
    let mk = |s, d, input| Pump::new(s, d, input).map_err(io_ctx("relay setup"));
    // stdin
    match (e0, master) {
        (Some(w), _) => pumps.push(mk(Endpoint::Caller(StdFd::IN), Endpoint::Owned(w), true)?),
        (None, Some(m)) => {
            pumps.push(mk(Endpoint::Caller(StdFd::IN), Endpoint::Owned(dup(m)?), true)?)
        }
        (None, None) => {}
    }
    // The pty's output goes to the caller's first terminal among stdout/stderr.
    if let Some(m) = master
        && (tty[1] || tty[2])
    {
        let to = if tty[1] { StdFd::OUT } else { StdFd::ERR };
        let pump = mk(Endpoint::Owned(dup(m)?), Endpoint::Caller(to), false)?;
        pumps.push(pump.filtered(TermFilter::new(terminal)));
    }
    for (fd, end) in [(StdFd::OUT, e1), (StdFd::ERR, e2)] {
        if let Some(r) = end {
            pumps.push(mk(Endpoint::Owned(r), Endpoint::Caller(fd), false)?);
        }
    }
    Ok(pumps)
}

/// A fresh, globally unique session id (128 random bits, hex).
pub fn new_session_id() -> Result<String, SandboxError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| SandboxError::Setup(format!("no randomness for a session id: {e}")))?;
    Ok(hex::encode(bytes))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn control_pair() -> (OwnedFd, OwnedFd) {
        socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).unwrap()
    }

    #[test]
    fn the_sockets_and_master_arrive_with_the_landlock_status() {
        let (ours, inside) = control_pair();
        let n = SocketKind::ALL.len();
        let files: Vec<_> = (0..=n).map(|_| std::fs::File::open("/dev/null").unwrap()).collect();
        let borrowed: Vec<_> = files.iter().map(AsFd::as_fd).collect();
        let all = super::super::inside::status_message("full", &SocketKind::ALL, "ok");
        fdpass::send_with_fds(inside.as_fd(), all.as_bytes(), &borrowed).unwrap();
        let (sockets, master, status) = receive_fds(&ours).unwrap();
        let sockets = sockets.unwrap();
        assert_eq!(sockets.borrowed().len(), n);
        assert!(master.is_some());
        assert_eq!(status, Status { landlock: "full".into(), capture6: None });
        // Without a pty: the sockets alone. Fewer than named: nothing was handed over.
        fdpass::send_with_fds(inside.as_fd(), all.as_bytes(), &borrowed[..n]).unwrap();
        let (sockets, master, _) = receive_fds(&ours).unwrap();
        assert!(sockets.is_some() && master.is_none());
        fdpass::send_with_fds(inside.as_fd(), all.as_bytes(), &borrowed[..n - 1]).unwrap();
        let (sockets, _, _) = receive_fds(&ours).unwrap();
        assert!(sockets.is_none());
        // No IPv6 in the namespace: the IPv6 capture listener is not named and the next fd is
        // the pty master, not taken for it; the reason arrives.
        let v4: Vec<SocketKind> =
            SocketKind::ALL.into_iter().filter(|k| *k != SocketKind::CaptureTcp6).collect();
        let msg = super::super::inside::status_message("full", &v4, "no ::1\nhere");
        fdpass::send_with_fds(inside.as_fd(), msg.as_bytes(), &borrowed[..n]).unwrap();
        let (sockets, master, status) = receive_fds(&ours).unwrap();
        let sockets = sockets.unwrap();
        assert!(sockets.capture_tcp.is_some() && sockets.capture_tcp6.is_none());
        assert!(master.is_some());
        assert_eq!(status.capture6.as_deref(), Some("no ::1 here"));
        // An unknown name is no hand-over.
        fdpass::send_with_fds(inside.as_fd(), b"landlock=full\nsockets=proxy,bogus", &borrowed)
            .unwrap();
        assert!(receive_fds(&ours).unwrap().0.is_none());
    }

    #[test]
    fn a_truncated_control_message_is_an_error() {
        // More fds than the receive buffer has room for: the kernel sets MSG_CTRUNC and drops
        // the rest (unix(7)); that must not pass as a short, valid hand-over.
        let (ours, inside) = control_pair();
        let files: Vec<std::fs::File> = (0..fdpass::MAX_FDS_PER_MESSAGE + 2)
            .map(|_| std::fs::File::open("/dev/null").unwrap())
            .collect();
        let borrowed: Vec<_> = files.iter().map(AsFd::as_fd).collect();
        fdpass::send_with_fds(inside.as_fd(), b"landlock=full", &borrowed).unwrap();
        let err = receive_fds(&ours).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
    }
}
