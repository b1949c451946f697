//! What runs inside the new namespaces: the setup of every wall (as the new user namespace's
//! owner, before anything untrusted runs), then PID 1 — a small init that starts the command,
//! forwards signals to it, reaps orphans and exits with the command's status.
//!
//! Any setup failure is written to the error pipe and ends the process with 125; the host-side
//! supervisor prints it. The command itself never sees the control socket, the error pipe, the
//! `--port` channel or any fd of the host beyond its three relayed stdio descriptors.

use std::ffi::CString;
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::socket::{
    AddressFamily, Backlog, ControlMessage, MsgFlags, SockFlag, SockType, SockaddrIn, SockaddrIn6,
    bind, listen, sendmsg, setsockopt, socket, sockopt,
};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use seccompiler::BpfProgram;

use super::mounts::{self, Op};
use crate::sys::exec as sysx;
use crate::sys::fdpass::SocketKind;
use crate::sys::namespaces::{self, Forked};

/// Port of the proxy listener inside the sandbox.
pub const PROXY_PORT: u16 = crate::sys::fdpass::PROXY_PORT;
/// Port of the transparent-capture listener inside the sandbox (127.0.0.1): every TCP
/// connection to a non-loopback address is redirected there (`sys::netfilter`).
pub const CAPTURE_PORT: u16 = crate::sys::fdpass::CAPTURE_PORT;
/// The command's limit on processes (RLIMIT_NPROC).
pub const NPROC_LIMIT: u64 = 4096;

/// Where one of the command's stdio descriptors comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// The pty slave made inside the sandbox's private devpts.
    Pty,
    /// A pipe end created by the supervisor (in [`Inherited::stdio`]).
    Pipe,
}

/// The supervisor's descriptors the inside takes over at the fork: the child gets duplicates
/// ([`Inherited::try_clone`]), its own from then on, and closes them once the command is
/// started, but for the control socket, which init keeps for its end report; the supervisor
/// keeps the originals until init may mount (it may fork again).
#[derive(Debug)]
pub struct Inherited {
    /// Our end of the control socketpair (listener and pty master go out over it, and at the
    /// end init's report, [`exit_message`]).
    pub control: OwnedFd,
    /// Write end of the error pipe (CLOEXEC; closed once the command is started).
    pub errpipe: OwnedFd,
    /// The pipe end for each [`Slot::Pipe`] of `Spec::stdio`.
    pub stdio: [Option<OwnedFd>; 3],
    /// Init's end of the `--port` channel (`super::ports`), when ports are published: kept
    /// by PID 1 only, never by the command.
    pub ports: Option<OwnedFd>,
}

impl Inherited {
    /// New descriptors for the same open files (dup(2)): what one fork hands its child while
    /// the supervisor keeps the originals, should it have to fork again.
    pub fn try_clone(&self) -> io::Result<Self> {
        let dup = |fd: &Option<OwnedFd>| fd.as_ref().map(OwnedFd::try_clone).transpose();
        Ok(Self {
            control: self.control.try_clone()?,
            errpipe: self.errpipe.try_clone()?,
            stdio: [dup(&self.stdio[0])?, dup(&self.stdio[1])?, dup(&self.stdio[2])?],
            ports: dup(&self.ports)?,
        })
    }
}

/// Everything the inside needs, prepared by the supervisor before the fork.
#[derive(Debug)]
pub struct Spec {
    pub ops: Vec<Op>,
    pub hostname: String,
    pub uid: u32,
    pub gid: u32,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    pub path_dirs: Vec<PathBuf>,
    pub cwd: PathBuf,
    pub stdio: [Slot; 3],
    pub winsize: Option<libc::winsize>,
    pub writable: Vec<PathBuf>,
    pub landlock: bool,
    /// Init was born in the session's cgroup leaf: make it the root of a new cgroup namespace
    /// (the one made by clone is rooted at the supervisor's cgroup, see copy_cgroup_ns).
    pub cgroup_ns_at_leaf: bool,
    pub seccomp: BpfProgram,
    /// The sandbox ports published with `--port`: the only ones init dials for the host.
    pub ports: Vec<u16>,
}

/// Runs inside the child made by `fork_into_namespaces`; never returns.
pub fn run(spec: &Spec, mut fds: Inherited) -> ! {
    match setup_and_start(spec, &fds) {
        Ok(child) => {
            let ports = fds.ports.take().map(|fd| (fd, spec.ports.clone()));
            // The command has its copies: pipes see EOF when it exits, and the supervisor's
            // error-pipe read ends. The control socket stays, for the end report. (Named, not
            // `..`: fields left in a partly moved struct would live as long as `init_loop`.)
            let Inherited { control, errpipe, stdio, ports: _ } = fds;
            drop((errpipe, stdio));
            init_loop(&Init { child, control }, ports)
        }
        Err(e) => {
            let mut f = std::fs::File::from(fds.errpipe);
            let _ = f.write_all(e.to_string().as_bytes());
            sysx::exit_now(125)
        }
    }
}

fn ctx<T>(what: &str, r: Result<T, impl std::fmt::Display>) -> io::Result<T> {
    r.map_err(|e| io::Error::other(format!("{what}: {e}")))
}

fn setup_and_start(spec: &Spec, fds: &Inherited) -> io::Result<Pid> {
    sysx::die_with_parent()?;
    sysx::install_noop_handlers(&forwarded_signals())?;
    // If the supervisor died before PDEATHSIG was armed, its end of the socketpair is closed.
    if peer_gone(fds.control.as_fd()) {
        return Err(io::Error::other("supervisor exited during setup"));
    }
    isolate_fds(fds)?;
    write_id_maps(spec.uid, spec.gid)?;
    if spec.cgroup_ns_at_leaf {
        ctx(
            "entering a cgroup namespace at the session's cgroup",
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWCGROUP),
        )?;
    }
    ctx("sethostname", nix::unistd::sethostname(&spec.hostname))?;
    #[cfg(feature = "test-hooks")]
    crate::sys::netfilter::test_hook_disable_ipv6();
    let (network, not_before) = beside(build_network, || {
        // The supervisor makes the repo's placeholders meanwhile; the plan binds them, so
        // nothing is mounted before it says they exist (and gives T0).
        let not_before = wait_for_go(fds.control.as_fd())?;
        mounts::execute(&spec.ops)?;
        Ok(not_before)
    });
    let not_before = not_before?;
    let (kinds, sockets, capture6) = network?;
    let pty = if spec.stdio.contains(&Slot::Pty) { Some(open_pty(spec.winsize)?) } else { None };
    // Wire order (fdpass::SocketKind::ALL), then the pty master.
    let mut passed: Vec<RawFd> = sockets.iter().map(AsRawFd::as_raw_fd).collect();
    if let Some((master, _)) = &pty {
        passed.push(master.as_raw_fd());
    }
    let landlock = if spec.landlock {
        match super::landlock::apply(&spec.writable) {
            Ok(enforced) => format!("{enforced:?}").to_lowercase(),
            Err(e) => format!("error: {e}"),
        }
    } else {
        "unavailable".to_string()
    };
    let msg = status_message(&landlock, &kinds, &capture6);
    let iov = [io::IoSlice::new(msg.as_bytes())];
    ctx(
        "passing the proxy and resolver sockets",
        sendmsg::<()>(
            fds.control.as_raw_fd(),
            &iov,
            &[ControlMessage::ScmRights(&passed)],
            MsgFlags::empty(),
            None,
        ),
    )?;
    drop(sockets);
    let slave = pty.map(|(master, slave)| {
        drop(master);
        slave
    });
    sysx::set_rlimit_nproc(NPROC_LIMIT)?;
    ctx("dropping capabilities", sysx::drop_all_capabilities())?;
    ctx("no_new_privs", sysx::set_no_new_privs())?;
    ctx("seccomp", super::seccomp::install(&spec.seccomp))?;
    // Our memory is a copy of the supervisor's (the host's environment included): nothing in
    // the sandbox may read it through /proc/1 (proc(5), PR_SET_DUMPABLE). Set last: a
    // non-dumpable process cannot write its own uid_map. execve makes the command dumpable.
    sysx::set_not_dumpable()?;
    super::sweep::wait_past(not_before);
    match namespaces::fork()? {
        Forked::Child => exec_command(spec, fds, slave.as_ref().map(|s| s.as_fd())),
        Forked::Parent(child) => {
            drop(slave);
            Ok(child)
        }
    }
}

/// The sandbox's network: `lo`, the capture and UDP refusal rules, and the sockets handed to
/// the daemon (with their kinds and the IPv6 capture's status). Touches no path (netlink,
/// ioctls and sockets only), so it can run beside the mounts.
fn build_network() -> io::Result<(Vec<SocketKind>, Vec<OwnedFd>, String)> {
    ctx("bringing up lo", namespaces::loopback_up())?;
    ctx("transparent capture", crate::sys::netfilter::install_capture(CAPTURE_PORT))?;
    ctx("refusing UDP", crate::sys::nflog::install_udp_refusal())?;
    // IPv6 capture is best effort: a namespace without IPv6 keeps the IPv4 capture, and its
    // IPv6 connections fail inside (nothing to leave through); the status travels with the fds.
    // The IPv6 UDP refusal comes first and belongs to it: the capture's route takes every IPv6
    // address to `lo`, where a datagram would vanish unaudited without the rule, so no route
    // without the rule.
    let capture6 = crate::sys::nflog::install_udp_refusal_v6()
        .and_then(|()| crate::sys::netfilter::install_capture_v6(CAPTURE_PORT))
        .map_err(|e| e.to_string());
    handover_sockets(capture6)
}

/// Runs `helper` on a helper thread while `main` runs on this one, and returns both results.
/// In init, `helper` builds the network while `main` waits for the go and mounts: each takes
/// about a millisecond and they share nothing (issue 22). The helper is joined, and its task
/// gone, before this returns, so what acts per thread afterwards (capabilities, no_new_privs,
/// Landlock, seccomp) and the fork's single-thread check see the threads there were before.
/// If no thread can be made (the user's RLIMIT_NPROC), `helper` runs first, on this thread.
fn beside<H: Send, M>(
    helper: impl FnOnce() -> io::Result<H> + Send,
    main: impl FnOnce() -> io::Result<M>,
) -> (io::Result<H>, io::Result<M>) {
    let threads_before = namespaces::thread_count();
    // The helper stays here until a thread takes it: a spawn that fails drops only the
    // closure that borrows it, and the helper then runs inline.
    let slot = std::sync::Mutex::new(Some(helper));
    let take_and_run = || match slot.lock().ok().and_then(|mut h| h.take()) {
        Some(h) => h(),
        None => Err(io::Error::other("the setup helper ran already")),
    };
    let (helped, mained) = std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new()
            .name("airlock-net".into())
            .stack_size(HELPER_THREAD_STACK)
            .spawn_scoped(scope, take_and_run);
        match spawned {
            Ok(handle) => {
                let mained = main();
                let helped = handle
                    .join()
                    .unwrap_or_else(|_| Err(io::Error::other("a setup thread panicked")));
                (helped, mained)
            }
            Err(_) => (take_and_run(), main()),
        }
    });
    // The joiner is woken when the helper's memory is released, a moment before its task
    // leaves /proc/self/task (kernel/exit.c: exit_mm, then release_task).
    match threads_before.and_then(wait_for_thread_count) {
        Ok(()) => (helped, mained),
        Err(e) => (Err(e), mained),
    }
}

/// Stack of init's helper thread (netlink buffers are on the heap).
const HELPER_THREAD_STACK: usize = 128 * 1024;

/// Waits (yielding, bounded) until this process has at most `n` threads again.
fn wait_for_thread_count(n: usize) -> io::Result<()> {
    for _ in 0..100_000 {
        if namespaces::thread_count()? <= n {
            return Ok(());
        }
        std::thread::yield_now();
    }
    Err(io::Error::other("a setup thread did not exit"))
}

fn peer_gone(control: BorrowedFd<'_>) -> bool {
    let mut pfd = [nix::poll::PollFd::new(control, nix::poll::PollFlags::POLLIN)];
    match nix::poll::poll(&mut pfd, nix::poll::PollTimeout::ZERO) {
        Ok(n) if n > 0 => pfd[0].revents().is_some_and(|r| {
            r.intersects(nix::poll::PollFlags::POLLHUP | nix::poll::PollFlags::POLLERR)
        }),
        _ => false,
    }
}

/// Puts /dev/null on 0–2 (the inherited ones may be the host's terminal) and closes every fd
/// the setup does not need.
fn isolate_fds(fds: &Inherited) -> io::Result<()> {
    let null = ctx(
        "open /dev/null",
        nix::fcntl::open("/dev/null", nix::fcntl::OFlag::O_RDWR, nix::sys::stat::Mode::empty()),
    )?;
    for target in sysx::StdFd::ALL {
        sysx::dup_onto(null.as_fd(), target)?;
    }
    drop(null);
    let mut keep = vec![0, 1, 2, fds.control.as_raw_fd(), fds.errpipe.as_raw_fd()];
    keep.extend(fds.stdio.iter().flatten().map(AsRawFd::as_raw_fd));
    keep.extend(fds.ports.iter().map(AsRawFd::as_raw_fd));
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    for fd in open {
        if !keep.contains(&fd) {
            // The directory iterator's own fd is already closed by now, or EBADF is harmless.
            let _ = nix::unistd::close(fd);
        }
    }
    Ok(())
}

/// `setgroups` deny first, then the caller's uid and gid mapped to themselves
/// (user_namespaces(7)).
pub(crate) fn write_id_maps(uid: u32, gid: u32) -> io::Result<()> {
    let w = |file: &str, text: String| {
        std::fs::write(file, text).map_err(|e| io::Error::other(format!("writing {file}: {e}")))
    };
    w("/proc/self/setgroups", "deny".into())?;
    w("/proc/self/uid_map", format!("{uid} {uid} 1\n"))?;
    w("/proc/self/gid_map", format!("{gid} {gid} 1\n"))
}

/// The supervisor's go-ahead: `go` and the sweep's `T0` as `not_before` (seconds and
/// nanoseconds, little-endian i64 each). The command starts only once the coarse clock is past
/// it, so the end sweep tells the agent's changes from the host's by ctime (see `sweep`).
pub(crate) fn go_message(not_before: super::sweep::Stamp) -> [u8; 18] {
    let mut msg = [0u8; 18];
    msg[..2].copy_from_slice(GO);
    msg[2..10].copy_from_slice(&not_before.0.to_le_bytes());
    msg[10..].copy_from_slice(&not_before.1.to_le_bytes());
    msg
}

const GO: &[u8; 2] = b"go";

/// Parses [`go_message`]; `None` for anything else.
fn parse_go(msg: &[u8]) -> Option<super::sweep::Stamp> {
    let rest = msg.strip_prefix(GO.as_slice())?;
    let secs: [u8; 8] = rest.get(..8)?.try_into().ok()?;
    let nanos: [u8; 8] = rest.get(8..)?.try_into().ok()?;
    Some((i64::from_le_bytes(secs), i64::from_le_bytes(nanos)))
}

/// Blocks until the supervisor's [`go_message`]; an error when it closed the socket instead
/// (it failed, or killed this child to fork another with a corrected plan).
fn wait_for_go(control: BorrowedFd<'_>) -> io::Result<super::sweep::Stamp> {
    let mut buf = [0u8; 64];
    let n = loop {
        match nix::sys::socket::recv(control.as_raw_fd(), &mut buf, MsgFlags::empty()) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break ctx("waiting for the supervisor", other)?,
        }
    };
    buf.get(..n)
        .and_then(parse_go)
        .ok_or_else(|| io::Error::other("the supervisor ended the setup before the mounts"))
}

/// What init tells the supervisor with the fds: the Landlock status, the kinds of the sockets
/// in the order they travel, and the IPv6 capture's status (`ok` or why not). One line each.
pub(crate) fn status_message(landlock: &str, kinds: &[SocketKind], capture6: &str) -> String {
    let names: Vec<&str> = kinds.iter().map(|k| k.name()).collect();
    let capture6 = capture6.replace('\n', " ");
    format!("landlock={landlock}\nsockets={}\ncapture6={capture6}", names.join(","))
}

/// The sockets handed to the daemon, in wire order ([`SocketKind::ALL`]), with their kinds and
/// the IPv6 capture's status: made inside the new network namespace after `lo` is up, while we
/// still hold `CAP_NET_BIND_SERVICE` in the namespace's user namespace (the resolver's port 53
/// is privileged, ip(7)). The IPv6 capture listener is left out when `capture6` (the route and
/// the IPv6 rules) failed or it cannot be made (no `::1`); every other socket is required.
fn handover_sockets(
    capture6: Result<(), String>,
) -> io::Result<(Vec<SocketKind>, Vec<OwnedFd>, String)> {
    let (mut kinds, mut fds) = (Vec::new(), Vec::new());
    let mut status = capture6.err();
    for kind in SocketKind::ALL {
        if kind == SocketKind::CaptureTcp6 {
            if status.is_none() {
                match handover_socket(kind) {
                    Ok(fd) => {
                        kinds.push(kind);
                        fds.push(fd);
                    }
                    Err(e) => status = Some(e.to_string()),
                }
            }
            continue;
        }
        fds.push(handover_socket(kind)?);
        kinds.push(kind);
    }
    Ok((kinds, fds, status.unwrap_or_else(|| "ok".into())))
}

/// One socket of `kind`, bound and (TCP) listening, or the bound netfilter log socket, as the
/// daemon's rules want it (also the capture probe's check that `[::1]:8889` can be made).
pub(crate) fn handover_socket(kind: SocketKind) -> io::Result<OwnedFd> {
    let Some(addr) = kind.addr() else {
        // The netfilter log socket the UDP refusal rule reports to (binding its group needs
        // CAP_NET_ADMIN over this namespace, still held here).
        return ctx(&format!("{kind} socket"), crate::sys::nflog::open_udp_log());
    };
    let ty = if kind.is_stream() { SockType::Stream } else { SockType::Datagram };
    let family = if kind.is_v6() { AddressFamily::Inet6 } else { AddressFamily::Inet };
    let fd = ctx(&format!("{kind} socket"), socket(family, ty, SockFlag::SOCK_CLOEXEC, None))?;
    if kind.is_stream() {
        ctx("SO_REUSEADDR", setsockopt(&fd, sockopt::ReuseAddr, &true))?;
    }
    let bound = match addr {
        std::net::SocketAddr::V4(a) => bind(fd.as_raw_fd(), &SockaddrIn::from(a)),
        std::net::SocketAddr::V6(a) => {
            // IPv6 only (ipv6(7) IPV6_V6ONLY): the daemon refuses this kind without it.
            ctx("IPV6_V6ONLY", setsockopt(&fd, sockopt::Ipv6V6Only, &true))?;
            bind(fd.as_raw_fd(), &SockaddrIn6::from(a))
        }
    };
    ctx(&format!("binding {addr} ({kind})"), bound)?;
    if kind.is_stream() {
        ctx("listen", listen(&fd, Backlog::new(1024).unwrap_or(Backlog::MAXCONN)))?;
    }
    Ok(fd)
}

/// A pty pair from the sandbox's own devpts instance; the slave gets the host's window size.
fn open_pty(ws: Option<libc::winsize>) -> io::Result<(OwnedFd, OwnedFd)> {
    use nix::fcntl::OFlag;
    let master = ctx("posix_openpt", nix::pty::posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY))?;
    ctx("grantpt", nix::pty::grantpt(&master))?;
    ctx("unlockpt", nix::pty::unlockpt(&master))?;
    let name = ctx("ptsname", nix::pty::ptsname_r(&master))?;
    let slave = ctx(
        "open pty slave",
        nix::fcntl::open(
            Path::new(&name),
            OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        ),
    )?;
    if let Some(ws) = ws {
        sysx::set_window_size(slave.as_fd(), &ws)?;
    }
    let master = OwnedFd::from(master);
    Ok((master, slave))
}

/// In the command's process: new session, controlling terminal, stdio, no other fds, exec.
fn exec_command(spec: &Spec, fds: &Inherited, slave: Option<BorrowedFd<'_>>) -> ! {
    let code = match prepare_and_exec(spec, fds, slave) {
        Ok(never) => match never {},
        Err((code, msg)) => {
            let _ = writeln!(io::stderr(), "airlock: {msg}");
            code
        }
    };
    sysx::exit_now(code)
}

enum Never {}

fn prepare_and_exec(
    spec: &Spec,
    fds: &Inherited,
    slave: Option<BorrowedFd<'_>>,
) -> Result<Never, (i32, String)> {
    let fail = |e: &dyn std::fmt::Display| (125, format!("starting the command: {e}"));
    sysx::reset_signals_for_exec(&forwarded_signals()).map_err(|e| fail(&e))?;
    nix::unistd::setsid().map_err(|e| fail(&e))?;
    if let Some(slave) = slave {
        sysx::set_controlling_tty(slave).map_err(|e| fail(&e))?;
    }
    for (target, slot) in sysx::StdFd::ALL.into_iter().zip(spec.stdio) {
        let src = match slot {
            Slot::Pty => slave,
            Slot::Pipe => fds.stdio[target.index()].as_ref().map(AsFd::as_fd),
        };
        let src = src.ok_or_else(|| fail(&format!("no descriptor for fd {}", target.raw())))?;
        sysx::dup_onto(src, target).map_err(|e| fail(&e))?;
    }
    // Everything else closes at exec (the command sees only 0–2).
    sysx::cloexec_fds_from(3).map_err(|e| fail(&e))?;
    std::env::set_current_dir(&spec.cwd).map_err(|e| fail(&e))?;
    let Some(cmd) = spec.argv.first() else { return Err((125, "no command given".into())) };
    let cmd_str = cmd.to_string_lossy().into_owned();
    let path = resolve(&cmd_str, &spec.path_dirs)?;
    let path = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| fail(&e))?;
    let err = match nix::unistd::execve(&path, &spec.argv, &spec.envp) {
        Ok(never) => match never {},
        Err(e) => e,
    };
    Err(match err {
        nix::errno::Errno::ENOENT => (127, format!("{cmd_str}: {err}")),
        _ => (126, format!("{cmd_str}: cannot execute: {err}")),
    })
}

/// Finds `cmd` like execvp(3) with the sandbox's PATH: 127 when absent, 126 when present but
/// not executable.
pub fn resolve(cmd: &str, path_dirs: &[PathBuf]) -> Result<PathBuf, (i32, String)> {
    use nix::unistd::{AccessFlags, access};
    if cmd.contains('/') {
        let p = PathBuf::from(cmd);
        return match std::fs::metadata(&p) {
            Err(_) => Err((127, format!("{cmd}: No such file or directory"))),
            Ok(m) if m.is_dir() => Err((126, format!("{cmd}: Is a directory"))),
            Ok(_) => Ok(p),
        };
    }
    let mut denied = None;
    for dir in path_dirs {
        let p = dir.join(cmd);
        if let Ok(meta) = std::fs::metadata(&p) {
            if meta.is_file() && access(&p, AccessFlags::X_OK).is_ok() {
                return Ok(p);
            }
            denied.get_or_insert(p);
        }
    }
    match denied {
        Some(p) => Err((126, format!("{}: Permission denied", p.display()))),
        None => Err((127, format!("{cmd}: command not found"))),
    }
}

/// The status the sandbox reports for a finished command (DESIGN §3).
pub fn exit_code(status: WaitStatus) -> Option<i32> {
    match status {
        WaitStatus::Exited(_, code) => Some(code),
        WaitStatus::Signaled(_, sig, _) => Some(128 + sig as i32),
        _ => None,
    }
}

/// Signals init passes on to the command.
pub fn forwarded_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGQUIT,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGCHLD,
        Signal::SIGWINCH,
    ] {
        set.add(s);
    }
    set
}

/// PID 1: wait for signals (they are blocked, inherited from the supervisor), forward them,
/// reap everything, and leave with the command's status ([`finish`]). With ports published it
/// also answers the supervisor's `--port` requests ([`super::ports::serve_request`]), waiting
/// for both with poll(2) on a signalfd(2); without, it holds no descriptor but stdio and the
/// control socket, and waits with sigtimedwait(2). Half a second in, it drops its setup pages
/// once.
fn init_loop(init: &Init, ports: Option<(OwnedFd, Vec<u16>)>) -> ! {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::time::Instant;
    // Init only waits from here on: once the command has run for a moment, the setup's code
    // pages are dropped (issue 22; best effort). Inline, off the path of a short command: a
    // helper thread would hold one of the user's RLIMIT_NPROC slots while it lives.
    let mut release_at = Some(Instant::now() + INIT_RELEASE_AFTER);
    let release_if_due = |release_at: &mut Option<Instant>| {
        if release_at.is_some_and(|at| Instant::now() >= at) {
            *release_at = None;
            let _ = crate::sys::memtrim::release_idle_pages();
        }
    };
    let set = forwarded_signals();
    let sigfd = ports.as_ref().and_then(|_| {
        nix::sys::signalfd::SignalFd::with_flags(
            &set,
            nix::sys::signalfd::SfdFlags::SFD_NONBLOCK | nix::sys::signalfd::SfdFlags::SFD_CLOEXEC,
        )
        .ok()
    });
    let (Some(sigfd), Some((channel, declared))) = (sigfd, ports) else {
        // No ports (or no signalfd: the channel is then closed, and the host side reports
        // each connection as failed).
        loop {
            let sig = match release_at {
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    let sig = sysx::sigtimedwait(&set, left).ok().flatten();
                    release_if_due(&mut release_at);
                    sig
                }
                None => set.wait().ok(),
            };
            if let Some(sig) = sig {
                on_signal(init, sig);
            }
        }
    };
    let mut channel = Some(channel);
    loop {
        let mut pfds = vec![PollFd::new(sigfd.as_fd(), PollFlags::POLLIN)];
        if let Some(c) = &channel {
            pfds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
        }
        let timeout = release_at.map_or(PollTimeout::NONE, |at| {
            // Rounded up to whole milliseconds, so the last one does not spin at timeout 0.
            let left = at.saturating_duration_since(Instant::now())
                + std::time::Duration::from_micros(999);
            PollTimeout::try_from(left).unwrap_or(PollTimeout::MAX)
        });
        let polled = poll(&mut pfds, timeout);
        release_if_due(&mut release_at);
        if !matches!(polled, Ok(n) if n > 0) {
            continue;
        }
        let ready = |i: usize| pfds.get(i).and_then(PollFd::revents).is_some_and(|r| !r.is_empty());
        let (signals, request) = (ready(0), ready(1));
        if request
            && let Some(c) = &channel
            && !super::ports::serve_request(c.as_fd(), &declared)
        {
            channel = None; // the supervisor is gone
        }
        if signals {
            while let Ok(Some(info)) = sigfd.read_signal() {
                if let Ok(sig) = Signal::try_from(info.ssi_signo as i32) {
                    on_signal(init, sig);
                }
            }
        }
    }
}

/// How long the command runs before init drops its setup pages.
const INIT_RELEASE_AFTER: std::time::Duration = std::time::Duration::from_millis(500);

/// What init's loop holds: the command's pid and its end of the control socket.
struct Init {
    child: Pid,
    control: OwnedFd,
}

/// One signal as init handles it: SIGCHLD reaps (and ends init with the command's status, see
/// [`finish`]), others go to the command.
fn on_signal(init: &Init, sig: Signal) {
    if sig == Signal::SIGCHLD {
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => break,
                Ok(status) => {
                    if status.pid() == Some(init.child)
                        && let Some(code) = exit_code(status)
                    {
                        finish(init, code);
                    }
                }
            }
        }
    } else if sig != Signal::SIGWINCH {
        let _ = nix::sys::signal::kill(init.child, sig);
    }
}

/// The command ended with `code`: every other process of this PID namespace is killed and
/// reaped, then the supervisor is told `code` ([`exit_message`]) and init exits with it. The
/// supervisor may start its end-of-session sweep on that message, while the kernel is still
/// tearing this process down (its mounts, an RCU grace period; issue 22): the session has no
/// process left but this one, which runs nothing more. `kill(-1)` from a PID namespace's init
/// reaches every process in it and in namespaces below it (kill(2), pid_namespaces(7)); they
/// all run as our one mapped uid, with no_new_privs, so none is out of reach, and a fork racing
/// the kill fails (the kernel re-checks for a fatal signal under the tasklist lock). Orphans
/// are reparented to init or to a subreaper below it, so `ECHILD` means none is left. Should
/// the reaping fail, no report is sent, and the supervisor learns the end from init's own
/// exit, as before.
fn finish(init: &Init, code: i32) -> ! {
    let _ = nix::sys::signal::kill(Pid::from_raw(-1), Signal::SIGKILL);
    let all_reaped = loop {
        match waitpid(None, None) {
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(nix::errno::Errno::ECHILD) => break true,
            Err(_) => break false,
        }
    };
    if all_reaped {
        let _ = nix::sys::socket::send(
            init.control.as_raw_fd(),
            &exit_message(code),
            MsgFlags::MSG_NOSIGNAL,
        );
    }
    sysx::exit_now(code)
}

const EXITED: &[u8; 6] = b"exited";

/// Init's end report: `exited` and the command's exit code (little-endian i32), sent once no
/// other process of the session is left ([`finish`]).
pub(crate) fn exit_message(code: i32) -> [u8; 10] {
    let mut msg = [0u8; 10];
    msg[..6].copy_from_slice(EXITED);
    msg[6..].copy_from_slice(&code.to_le_bytes());
    msg
}

/// Parses [`exit_message`]; `None` for anything else.
pub(crate) fn parse_exit(msg: &[u8]) -> Option<i32> {
    let code: [u8; 4] = msg.strip_prefix(EXITED.as_slice())?.try_into().ok()?;
    Some(i32::from_le_bytes(code))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn resolution_gives_127_and_126_like_a_shell() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = vec![tmp.path().to_path_buf(), PathBuf::from("/usr/bin")];
        assert_eq!(resolve("sh", &dirs).unwrap(), PathBuf::from("/usr/bin/sh"));
        assert_eq!(resolve("no-such-cmd-xyz", &dirs).unwrap_err().0, 127);
        std::fs::write(tmp.path().join("noexec"), "#!/bin/sh\n").unwrap();
        let (code, msg) = resolve("noexec", &dirs).unwrap_err();
        assert_eq!(code, 126, "{msg}");
        assert_eq!(resolve("/nonexistent/x", &dirs).unwrap_err().0, 127);
        assert_eq!(resolve("/usr", &dirs).unwrap_err().0, 126);
    }

    #[test]
    fn the_exit_report_round_trips_and_nothing_else_parses_as_one() {
        for code in [0, 1, 125, 137, 255] {
            assert_eq!(parse_exit(&exit_message(code)), Some(code));
        }
        assert_eq!(parse_exit(b"exited"), None);
        assert_eq!(parse_exit(&exit_message(3)[..9]), None);
        assert_eq!(parse_exit(&go_message((1, 2))), None);
    }

    #[test]
    fn signals_map_to_128_plus_n() {
        let pid = Pid::from_raw(2);
        assert_eq!(exit_code(WaitStatus::Exited(pid, 3)), Some(3));
        assert_eq!(exit_code(WaitStatus::Signaled(pid, Signal::SIGINT, false)), Some(130));
        assert_eq!(exit_code(WaitStatus::Signaled(pid, Signal::SIGKILL, true)), Some(137));
    }

    /// Set in the inner run of [`beside_overlaps_and_leaves_no_thread_behind`].
    const BESIDE_INNER: &str = "AIRLOCK_BESIDE_INNER";

    /// `beside` in a process of its own (a test harness has threads coming and going), so the
    /// thread count it restores is this test's alone.
    #[test]
    fn beside_overlaps_and_leaves_no_thread_behind() {
        let exe = std::env::current_exe().unwrap();
        let name = "sandbox::inside::tests::beside_inner";
        let out = std::process::Command::new(exe)
            .args(["--exact", name, "--ignored", "--nocapture", "--test-threads=1"])
            .env(BESIDE_INNER, "1")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
    }

    #[test]
    #[ignore = "run in a process of its own by beside_overlaps_and_leaves_no_thread_behind"]
    fn beside_inner() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::time::{Duration, Instant};
        if std::env::var_os(BESIDE_INNER).is_none() {
            return;
        }
        let before = namespaces::thread_count().unwrap();
        let this = std::thread::current().id();
        // The helper waits for something only `main` does, so it cannot have run before it:
        // the two overlap, on two threads.
        let mounted = AtomicBool::new(false);
        let (helped, mained) = beside(
            || {
                let until = Instant::now() + Duration::from_secs(10);
                while !mounted.load(Ordering::SeqCst) {
                    if Instant::now() > until {
                        return Err(io::Error::other("main never ran beside the helper"));
                    }
                    std::thread::yield_now();
                }
                Ok(std::thread::current().id())
            },
            || {
                mounted.store(true, Ordering::SeqCst);
                Ok(std::thread::current().id())
            },
        );
        assert_ne!(helped.unwrap(), this, "the helper ran on a thread of its own");
        assert_eq!(mained.unwrap(), this, "main ran on the caller's thread");
        assert_eq!(namespaces::thread_count().unwrap(), before, "the helper's task is gone");
        // Each side's error comes back on its own side.
        let (helped, mained) = beside(|| Err::<(), _>(io::Error::other("lo")), || Ok(7));
        assert_eq!(helped.unwrap_err().to_string(), "lo");
        assert_eq!(mained.unwrap(), 7);
        let (helped, mained) = beside(|| Ok(1), || Err::<(), _>(io::Error::other("mount")));
        assert_eq!(helped.unwrap(), 1);
        assert_eq!(mained.unwrap_err().to_string(), "mount");
        assert_eq!(namespaces::thread_count().unwrap(), before);
    }
}
