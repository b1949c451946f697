//! Which user and network namespace the process on the other end of a unix socket runs in,
//! compared with our own (SECURITY §7: the control socket refuses peers outside the daemon's own
//! user and network namespace). Namespaces are compared by the (st_dev, st_ino) of their nsfs
//! inode, as namespaces(7) says to.
//!
//! How the peer is identified, newest kernel first:
//!
//! 1. `SO_PEERPIDFD` (socket(7), Linux 6.5) gives a pidfd for the process that called
//!    connect(2), taken at that moment, so pid reuse cannot fool it. The pidfd ioctls
//!    `PIDFD_GET_USER_NAMESPACE` / `PIDFD_GET_NET_NAMESPACE` (Linux 6.11, pidfd_open(2),
//!    include/uapi/linux/pidfd.h) open that process's namespaces. No window.
//! 2. Linux 6.5–6.10 (the ioctls answer `ENOTTY`): the pidfd's pid from
//!    `/proc/self/fdinfo/<pidfd>` (proc(5)), then `/proc/<pid>/ns/*`; afterwards the pidfd must
//!    still refer to a live process (poll(2) not readable). A pid number is not reused while its
//!    process lives (not even as a zombie), so the reads were of the peer. No window.
//! 3. Older kernels (no `SO_PEERPIDFD`: `ENOPROTOOPT`): the pid from `SO_PEERCRED`, pinned with
//!    pidfd_open(2); its start time (proc(5) `/proc/<pid>/stat` field 22) is read before and after
//!    `/proc/<pid>/ns/*`, must not change, must not be later than the moment the check began, and
//!    the pidfd must still be live at the end. **Remaining window:** if the peer exits after its
//!    connect(2) and its pid is handed to a new process before the check begins (between connect
//!    and `pidfd_open`), that new process is judged instead. A sandboxed attacker can cycle host
//!    pids by forking, but it cannot choose which host process gets the freed pid; on these
//!    kernels the check narrows the attack to that race, it does not close it.
//!
//! Anything that cannot be determined — the peer exited, `/proc` is unreadable, the ioctl is
//! refused (`EACCES` from the ptrace access check), a pid not visible from our PID namespace —
//! is an error, and the caller refuses the peer (fail closed).
//!
//! The decision logic is written against the small [`PeerSource`] trait so it is unit-tested with
//! a fake kernel; [`Kernel`] is the real one.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::socket::{getsockopt, sockopt};

/// `SO_PEERPIDFD` (Linux 6.5, include/uapi/asm-generic/socket.h; x86_64 and aarch64 use the
/// generic value); not in the libc crate yet.
const SO_PEERPIDFD: libc::c_int = 77;
/// `PIDFS_IOCTL_MAGIC` and the namespace ioctls (include/uapi/linux/pidfd.h): `_IO(0xFF, nr)`,
/// which is `0xFF << 8 | nr` (no direction, no size).
const PIDFD_GET_NET_NAMESPACE: u32 = 0xFF << 8 | 4;
const PIDFD_GET_USER_NAMESPACE: u32 = 0xFF << 8 | 9;

/// The namespaces this check compares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NsKind {
    User,
    Net,
}

impl NsKind {
    /// The entry name under `/proc/<pid>/ns/`.
    pub fn proc_name(self) -> &'static str {
        match self {
            NsKind::User => "user",
            NsKind::Net => "net",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            NsKind::User => "user",
            NsKind::Net => "network",
        }
    }

    fn ioctl(self) -> u32 {
        match self {
            NsKind::User => PIDFD_GET_USER_NAMESPACE,
            NsKind::Net => PIDFD_GET_NET_NAMESPACE,
        }
    }
}

/// A namespace's identity: its nsfs inode's device and number (namespaces(7)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NsId {
    pub dev: u64,
    pub ino: u64,
}

/// A process's user and network namespaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Namespaces {
    pub user: NsId,
    pub net: NsId,
}

impl std::fmt::Display for Namespaces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The form readlink(2) shows for /proc/<pid>/ns/* (namespaces(7)).
        write!(f, "user:[{}] net:[{}]", self.user.ino, self.net.ino)
    }
}

/// Which of the kernel interfaces identified the peer (see the module header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `SO_PEERPIDFD` + the pidfd namespace ioctls.
    PidfdIoctl,
    /// `SO_PEERPIDFD` + `/proc/<pid>/ns`, pidfd re-checked.
    PidfdProc,
    /// `SO_PEERCRED` + `pidfd_open` + `/proc/<pid>/ns`, start time re-checked.
    PeerCred,
}

/// An identified peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    /// Its pid in our PID namespace, when visible there.
    pub pid: Option<i32>,
    pub ns: Namespaces,
    pub method: Method,
}

/// Why a peer is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PeerError {
    #[error(
        "peer {pid} runs in another {which} than airlockd (peer {theirs}; airlockd {ours})",
        pid = PidText(*pid),
        which = differing_text(ours, theirs)
    )]
    Foreign { pid: Option<i32>, ours: Namespaces, theirs: Namespaces },
    #[error("cannot tell which namespaces peer {pid} runs in: {reason}", pid = PidText(*pid))]
    Unknown { pid: Option<i32>, reason: String },
}

impl PeerError {
    /// The namespaces that differ (empty unless [`PeerError::Foreign`]).
    pub fn differing(&self) -> Vec<NsKind> {
        match self {
            PeerError::Foreign { ours, theirs, .. } => differing(ours, theirs),
            PeerError::Unknown { .. } => Vec::new(),
        }
    }
}

struct PidText(Option<i32>);

impl std::fmt::Display for PidText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(pid) => write!(f, "pid {pid}"),
            None => f.write_str("(pid not visible in airlockd's PID namespace)"),
        }
    }
}

fn differing(ours: &Namespaces, theirs: &Namespaces) -> Vec<NsKind> {
    let mut out = Vec::new();
    if ours.user != theirs.user {
        out.push(NsKind::User);
    }
    if ours.net != theirs.net {
        out.push(NsKind::Net);
    }
    out
}

fn differing_text(ours: &Namespaces, theirs: &Namespaces) -> String {
    match differing(ours, theirs).as_slice() {
        [one] => format!("{} namespace", one.describe()),
        [a, b] => format!("{} and {} namespace", a.describe(), b.describe()),
        _ => "namespace".into(),
    }
}

/// The kernel interfaces the check uses; [`Kernel`] implements them for a real socket.
pub trait PeerSource {
    type Pidfd;
    /// `SO_PEERPIDFD`; `Ok(None)` when the kernel does not know the option.
    fn peer_pidfd(&mut self) -> io::Result<Option<Self::Pidfd>>;
    /// The pid `SO_PEERCRED` reports (0 when not visible from our PID namespace).
    fn peer_cred_pid(&mut self) -> io::Result<i32>;
    /// pidfd_open(2).
    fn pidfd_open(&mut self, pid: i32) -> io::Result<Self::Pidfd>;
    /// `PIDFD_GET_*_NAMESPACE`; `Ok(None)` when the kernel does not have the ioctl.
    fn pidfd_namespace(&mut self, pidfd: &Self::Pidfd, kind: NsKind) -> io::Result<Option<NsId>>;
    /// The pid a pidfd refers to (`Pid:` in its fdinfo; ≤ 0 when gone or not visible).
    fn pidfd_pid(&mut self, pidfd: &Self::Pidfd) -> io::Result<i32>;
    /// `/proc/<pid>/ns/<kind>`.
    fn proc_namespace(&mut self, pid: i32, kind: NsKind) -> io::Result<NsId>;
    /// `/proc/<pid>/stat` field 22, in clock ticks since boot.
    fn start_time(&mut self, pid: i32) -> io::Result<u64>;
    /// `CLOCK_BOOTTIME` now, in the same clock ticks.
    fn now_ticks(&mut self) -> io::Result<u64>;
    /// Whether the pidfd's process has exited (zombies count as exited).
    fn exited(&mut self, pidfd: &Self::Pidfd) -> io::Result<bool>;
    /// `/proc/self/ns/<kind>`.
    fn own_namespace(&mut self, kind: NsKind) -> io::Result<NsId>;
}

fn unknown(pid: Option<i32>, what: &str, err: impl std::fmt::Display) -> PeerError {
    PeerError::Unknown { pid, reason: format!("{what}: {err}") }
}

/// Identifies the peer's namespaces (module header, steps 1–3).
pub fn identify<S: PeerSource>(src: &mut S) -> Result<Peer, PeerError> {
    // Only for messages and the legacy path: never trusted to name the process otherwise.
    let cred_pid = src.peer_cred_pid().ok().filter(|p| *p > 0);
    match src.peer_pidfd() {
        Ok(Some(pidfd)) => via_pidfd(src, &pidfd, cred_pid),
        Ok(None) => via_peer_cred(src, cred_pid),
        Err(e) => Err(unknown(cred_pid, "SO_PEERPIDFD", e)),
    }
}

fn via_pidfd<S: PeerSource>(
    src: &mut S,
    pidfd: &S::Pidfd,
    cred_pid: Option<i32>,
) -> Result<Peer, PeerError> {
    let user = src
        .pidfd_namespace(pidfd, NsKind::User)
        .map_err(|e| unknown(cred_pid, "PIDFD_GET_USER_NAMESPACE", e))?;
    let net = src
        .pidfd_namespace(pidfd, NsKind::Net)
        .map_err(|e| unknown(cred_pid, "PIDFD_GET_NET_NAMESPACE", e))?;
    if let (Some(user), Some(net)) = (user, net) {
        return Ok(Peer {
            pid: cred_pid,
            ns: Namespaces { user, net },
            method: Method::PidfdIoctl,
        });
    }
    // Linux 6.5–6.10: through /proc, by the pid the pidfd pins.
    let pid = src.pidfd_pid(pidfd).map_err(|e| unknown(cred_pid, "pidfd fdinfo", e))?;
    if pid <= 0 {
        return Err(unknown(cred_pid, "pidfd fdinfo", "the peer exited or is not visible"));
    }
    let ns = proc_namespaces(src, pid)?;
    if src.exited(pidfd).map_err(|e| unknown(Some(pid), "polling the pidfd", e))? {
        return Err(unknown(Some(pid), "pidfd", "the peer exited while it was checked"));
    }
    Ok(Peer { pid: Some(pid), ns, method: Method::PidfdProc })
}

fn via_peer_cred<S: PeerSource>(src: &mut S, cred_pid: Option<i32>) -> Result<Peer, PeerError> {
    let Some(pid) = cred_pid else {
        return Err(unknown(None, "SO_PEERCRED", "no peer pid"));
    };
    let began = src.now_ticks().map_err(|e| unknown(Some(pid), "CLOCK_BOOTTIME", e))?;
    let pidfd = src.pidfd_open(pid).map_err(|e| unknown(Some(pid), "pidfd_open", e))?;
    let before = src.start_time(pid).map_err(|e| unknown(Some(pid), "start time", e))?;
    let ns = proc_namespaces(src, pid)?;
    let after = src.start_time(pid).map_err(|e| unknown(Some(pid), "start time", e))?;
    let exited = src.exited(&pidfd).map_err(|e| unknown(Some(pid), "polling the pidfd", e))?;
    if exited || before != after {
        return Err(unknown(Some(pid), "pid", "the peer exited while it was checked"));
    }
    if before > began {
        // Started after the connection was already accepted: not the process that connected.
        return Err(unknown(Some(pid), "pid", "reused by a process younger than the connection"));
    }
    Ok(Peer { pid: Some(pid), ns, method: Method::PeerCred })
}

fn proc_namespaces<S: PeerSource>(src: &mut S, pid: i32) -> Result<Namespaces, PeerError> {
    let mut read = |kind: NsKind| {
        src.proc_namespace(pid, kind)
            .map_err(|e| unknown(Some(pid), &format!("/proc/{pid}/ns/{}", kind.proc_name()), e))
    };
    Ok(Namespaces { user: read(NsKind::User)?, net: read(NsKind::Net)? })
}

/// Our own namespaces.
pub fn own_namespaces<S: PeerSource>(src: &mut S) -> Result<Namespaces, PeerError> {
    let mut read = |kind: NsKind| {
        src.own_namespace(kind)
            .map_err(|e| unknown(None, &format!("/proc/self/ns/{}", kind.proc_name()), e))
    };
    Ok(Namespaces { user: read(NsKind::User)?, net: read(NsKind::Net)? })
}

/// `Ok` only when the peer shares both namespaces with us.
pub fn compare(ours: Namespaces, peer: &Peer) -> Result<(), PeerError> {
    if ours == peer.ns {
        Ok(())
    } else {
        Err(PeerError::Foreign { pid: peer.pid, ours, theirs: peer.ns })
    }
}

/// Checks that the peer of the connected unix socket `sock` runs in our user and network
/// namespaces; returns who it is.
pub fn check_same_namespaces(sock: BorrowedFd<'_>) -> Result<Peer, PeerError> {
    let mut kernel = Kernel { sock };
    let ours = own_namespaces(&mut kernel)?;
    let peer = identify(&mut kernel)?;
    compare(ours, &peer)?;
    Ok(peer)
}

/// The real kernel, for one connected unix socket.
#[derive(Debug)]
pub struct Kernel<'a> {
    pub sock: BorrowedFd<'a>,
}

fn ns_of_path(path: &str) -> io::Result<NsId> {
    // stat (not lstat): the magic link resolves to the nsfs inode (namespaces(7)).
    let meta = std::fs::metadata(path)?;
    Ok(NsId { dev: meta.dev(), ino: meta.ino() })
}

impl PeerSource for Kernel<'_> {
    type Pidfd = OwnedFd;

    fn peer_pidfd(&mut self) -> io::Result<Option<OwnedFd>> {
        let mut fd: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `sock` is a live socket borrowed for the call; `fd`/`len` are valid for writes
        // of `len` bytes (socket(7): SO_PEERPIDFD returns an int).
        let rc = unsafe {
            libc::getsockopt(
                self.sock.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERPIDFD,
                (&mut fd as *mut libc::c_int).cast::<libc::c_void>(),
                &mut len,
            )
        };
        if rc != 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::ENOPROTOOPT) => Ok(None),
                _ => Err(err),
            };
        }
        if fd < 0 {
            return Err(io::Error::other("SO_PEERPIDFD returned no fd"));
        }
        // SAFETY: the kernel just installed `fd` in our table for us (O_CLOEXEC, like every
        // pidfd); nothing else refers to it.
        Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn peer_cred_pid(&mut self) -> io::Result<i32> {
        let cred = getsockopt(&self.sock, sockopt::PeerCredentials)?;
        Ok(cred.pid())
    }

    fn pidfd_open(&mut self, pid: i32) -> io::Result<OwnedFd> {
        // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd or -1; no memory is
        // passed.
        let ret = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if ret < 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = libc::c_int::try_from(ret).map_err(|_| io::Error::other("pidfd out of range"))?;
        // SAFETY: a new fd the kernel installed for us (pidfd_open(2): always O_CLOEXEC).
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    fn pidfd_namespace(&mut self, pidfd: &OwnedFd, kind: NsKind) -> io::Result<Option<NsId>> {
        // SAFETY: the namespace ioctls take no argument (`_IO`); `pidfd` is a live fd for the
        // call. The result is a new fd or -1.
        let ret = unsafe { libc::ioctl(pidfd.as_raw_fd(), kind.ioctl() as _, 0) };
        if ret < 0 {
            let err = io::Error::last_os_error();
            // Before Linux 6.11 pidfds have no ioctls (ENOTTY); a kernel built without the
            // namespace type answers EOPNOTSUPP. Either way /proc is the fallback, which checks
            // just as strictly, so falling back never loosens the check.
            return match err.raw_os_error() {
                Some(libc::ENOTTY | libc::EOPNOTSUPP | libc::EINVAL) => Ok(None),
                _ => Err(err),
            };
        }
        // SAFETY: a new fd the kernel installed for us (the namespace, O_CLOEXEC).
        let ns = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(ret) });
        let meta = ns.metadata()?;
        Ok(Some(NsId { dev: meta.dev(), ino: meta.ino() }))
    }

    fn pidfd_pid(&mut self, pidfd: &OwnedFd) -> io::Result<i32> {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd()))?;
        parse_fdinfo_pid(&info).ok_or_else(|| io::Error::other("no Pid: line in the fdinfo"))
    }

    fn proc_namespace(&mut self, pid: i32, kind: NsKind) -> io::Result<NsId> {
        ns_of_path(&format!("/proc/{pid}/ns/{}", kind.proc_name()))
    }

    fn start_time(&mut self, pid: i32) -> io::Result<u64> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        parse_start_time(&stat).ok_or_else(|| io::Error::other("malformed /proc/<pid>/stat"))
    }

    fn now_ticks(&mut self) -> io::Result<u64> {
        let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: `ts` is a valid, writable timespec for the call (clock_gettime(2)).
        if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: sysconf(3) reads a configuration value; no memory is passed.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let hz = u64::try_from(hz).ok().filter(|h| *h > 0);
        let hz = hz.ok_or_else(|| io::Error::other("sysconf(_SC_CLK_TCK) failed"))?;
        let secs = u64::try_from(ts.tv_sec).map_err(io::Error::other)?;
        let nsecs = u64::try_from(ts.tv_nsec).map_err(io::Error::other)?;
        Ok(secs * hz + nsecs * hz / 1_000_000_000)
    }

    fn exited(&mut self, pidfd: &OwnedFd) -> io::Result<bool> {
        // pidfd_open(2): a pidfd polls readable once the process has exited.
        let mut fds = [PollFd::new(pidfd.as_fd(), PollFlags::POLLIN)];
        let n = poll(&mut fds, PollTimeout::ZERO)?;
        Ok(n > 0)
    }

    fn own_namespace(&mut self, kind: NsKind) -> io::Result<NsId> {
        ns_of_path(&format!("/proc/self/ns/{}", kind.proc_name()))
    }
}

/// The `Pid:` value of a pidfd's fdinfo (proc(5)): the pid in our PID namespace, -1 once the
/// process is gone, 0 when it is not visible from here.
pub fn parse_fdinfo_pid(info: &str) -> Option<i32> {
    info.lines().find_map(|l| l.strip_prefix("Pid:")).and_then(|v| v.trim().parse().ok())
}

/// Field 22 (`starttime`) of `/proc/<pid>/stat` (proc(5)). The command name (field 2) may hold
/// spaces and parentheses, so fields are counted after its last `)`.
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // `rest` starts at field 3; field 22 is the 20th from there.
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};

    const OURS: Namespaces =
        Namespaces { user: NsId { dev: 4, ino: 100 }, net: NsId { dev: 4, ino: 200 } };
    const OTHER_USER: NsId = NsId { dev: 4, ino: 101 };
    const OTHER_NET: NsId = NsId { dev: 4, ino: 201 };

    fn errno(e: i32) -> io::Error {
        io::Error::from_raw_os_error(e)
    }

    /// A scripted kernel: each field is what the matching call answers.
    struct Fake {
        pidfd: Result<Option<u32>, i32>,
        cred_pid: i32,
        open: Result<u32, i32>,
        ioctl: Result<Option<Namespaces>, i32>,
        fdinfo_pid: i32,
        proc: Result<Namespaces, i32>,
        /// Start times returned by successive reads.
        starts: Vec<u64>,
        now: u64,
        exited: bool,
    }

    impl Default for Fake {
        fn default() -> Self {
            Self {
                pidfd: Ok(Some(7)),
                cred_pid: 42,
                open: Ok(8),
                ioctl: Ok(Some(OURS)),
                fdinfo_pid: 42,
                proc: Ok(OURS),
                starts: vec![500, 500],
                now: 1000,
                exited: false,
            }
        }
    }

    fn pick(ns: &Namespaces, kind: NsKind) -> NsId {
        match kind {
            NsKind::User => ns.user,
            NsKind::Net => ns.net,
        }
    }

    impl PeerSource for Fake {
        type Pidfd = u32;
        fn peer_pidfd(&mut self) -> io::Result<Option<u32>> {
            self.pidfd.map_err(errno)
        }
        fn peer_cred_pid(&mut self) -> io::Result<i32> {
            Ok(self.cred_pid)
        }
        fn pidfd_open(&mut self, _pid: i32) -> io::Result<u32> {
            self.open.map_err(errno)
        }
        fn pidfd_namespace(&mut self, _: &u32, kind: NsKind) -> io::Result<Option<NsId>> {
            self.ioctl.map(|o| o.map(|ns| pick(&ns, kind))).map_err(errno)
        }
        fn pidfd_pid(&mut self, _: &u32) -> io::Result<i32> {
            Ok(self.fdinfo_pid)
        }
        fn proc_namespace(&mut self, _pid: i32, kind: NsKind) -> io::Result<NsId> {
            self.proc.map(|ns| pick(&ns, kind)).map_err(errno)
        }
        fn start_time(&mut self, _pid: i32) -> io::Result<u64> {
            Ok(self.starts.remove(0))
        }
        fn now_ticks(&mut self) -> io::Result<u64> {
            Ok(self.now)
        }
        fn exited(&mut self, _: &u32) -> io::Result<bool> {
            Ok(self.exited)
        }
        fn own_namespace(&mut self, kind: NsKind) -> io::Result<NsId> {
            Ok(pick(&OURS, kind))
        }
    }

    fn verdict(mut fake: Fake) -> Result<Peer, PeerError> {
        let ours = own_namespaces(&mut fake)?;
        let peer = identify(&mut fake)?;
        compare(ours, &peer).map(|()| peer)
    }

    #[test]
    fn same_namespaces_are_accepted_by_each_method() {
        let p = verdict(Fake::default()).unwrap();
        assert_eq!((p.pid, p.method), (Some(42), Method::PidfdIoctl));
        let p = verdict(Fake { ioctl: Err(libc::ENOTTY), ..Fake::default() });
        assert!(p.is_err(), "an ioctl error the source did not call unsupported: {p:?}");
        let p = verdict(Fake { ioctl: Ok(None), ..Fake::default() }).unwrap();
        assert_eq!((p.pid, p.method), (Some(42), Method::PidfdProc));
        let p = verdict(Fake { pidfd: Ok(None), ..Fake::default() }).unwrap();
        assert_eq!((p.pid, p.method), (Some(42), Method::PeerCred));
    }

    #[test]
    fn a_foreign_namespace_is_refused_and_named() {
        for (theirs, want, text) in [
            (Namespaces { net: OTHER_NET, ..OURS }, vec![NsKind::Net], "another network namespace"),
            (Namespaces { user: OTHER_USER, ..OURS }, vec![NsKind::User], "another user namespace"),
            (
                Namespaces { user: OTHER_USER, net: OTHER_NET },
                vec![NsKind::User, NsKind::Net],
                "another user and network namespace",
            ),
        ] {
            for fake in [
                Fake { ioctl: Ok(Some(theirs)), ..Fake::default() },
                Fake { ioctl: Ok(None), proc: Ok(theirs), ..Fake::default() },
                Fake { pidfd: Ok(None), proc: Ok(theirs), ..Fake::default() },
            ] {
                let err = verdict(fake).unwrap_err();
                assert_eq!(err.differing(), want);
                let msg = err.to_string();
                assert!(msg.contains(text) && msg.contains("pid 42"), "{msg}");
            }
        }
        // Same inode number on another device is another namespace.
        let theirs = Namespaces { net: NsId { dev: 5, ino: 200 }, ..OURS };
        assert!(verdict(Fake { ioctl: Ok(Some(theirs)), ..Fake::default() }).is_err());
    }

    #[test]
    fn anything_undeterminable_is_refused() {
        let cases = [
            Fake { pidfd: Err(libc::EINVAL), ..Fake::default() }, // peer already reaped
            Fake { ioctl: Err(libc::ESRCH), ..Fake::default() },
            Fake { ioctl: Err(libc::EACCES), ..Fake::default() },
            Fake { ioctl: Ok(None), fdinfo_pid: -1, ..Fake::default() },
            Fake { ioctl: Ok(None), fdinfo_pid: 0, ..Fake::default() },
            Fake { ioctl: Ok(None), proc: Err(libc::EACCES), ..Fake::default() },
            Fake { ioctl: Ok(None), exited: true, ..Fake::default() },
            Fake { pidfd: Ok(None), cred_pid: 0, ..Fake::default() },
            Fake { pidfd: Ok(None), open: Err(libc::ESRCH), ..Fake::default() },
            Fake { pidfd: Ok(None), proc: Err(libc::ENOENT), ..Fake::default() },
            Fake { pidfd: Ok(None), exited: true, ..Fake::default() },
            Fake { pidfd: Ok(None), starts: vec![500, 501], ..Fake::default() },
            // Started after the check began: a reused pid, not the process that connected.
            Fake { pidfd: Ok(None), starts: vec![1001, 1001], ..Fake::default() },
        ];
        for (i, fake) in cases.into_iter().enumerate() {
            match verdict(fake) {
                Err(PeerError::Unknown { .. }) => {}
                other => panic!("case {i}: {other:?}"),
            }
        }
    }

    #[test]
    fn fdinfo_and_stat_parsing() {
        let info = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1234\nPid:\t4242\nNSpid:\t4242\n";
        assert_eq!(parse_fdinfo_pid(info), Some(4242));
        assert_eq!(parse_fdinfo_pid("Pid:\t-1\n"), Some(-1));
        assert_eq!(parse_fdinfo_pid("pos:\t0\n"), None);
        let stat = "77 (a) b) c) S 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        assert_eq!(parse_start_time(stat), Some(987654));
        assert_eq!(parse_start_time("77 (x) S 1 2"), None);
        assert_eq!(parse_start_time("garbage"), None);
    }

    /// The real kernel, with chosen features hidden, to drive each fallback path for real.
    struct Degraded<'a> {
        inner: Kernel<'a>,
        no_peerpidfd: bool,
        no_ioctl: bool,
    }

    impl PeerSource for Degraded<'_> {
        type Pidfd = OwnedFd;
        fn peer_pidfd(&mut self) -> io::Result<Option<OwnedFd>> {
            if self.no_peerpidfd { Ok(None) } else { self.inner.peer_pidfd() }
        }
        fn peer_cred_pid(&mut self) -> io::Result<i32> {
            self.inner.peer_cred_pid()
        }
        fn pidfd_open(&mut self, pid: i32) -> io::Result<OwnedFd> {
            self.inner.pidfd_open(pid)
        }
        fn pidfd_namespace(&mut self, fd: &OwnedFd, kind: NsKind) -> io::Result<Option<NsId>> {
            if self.no_ioctl { Ok(None) } else { self.inner.pidfd_namespace(fd, kind) }
        }
        fn pidfd_pid(&mut self, fd: &OwnedFd) -> io::Result<i32> {
            self.inner.pidfd_pid(fd)
        }
        fn proc_namespace(&mut self, pid: i32, kind: NsKind) -> io::Result<NsId> {
            self.inner.proc_namespace(pid, kind)
        }
        fn start_time(&mut self, pid: i32) -> io::Result<u64> {
            self.inner.start_time(pid)
        }
        fn now_ticks(&mut self) -> io::Result<u64> {
            self.inner.now_ticks()
        }
        fn exited(&mut self, fd: &OwnedFd) -> io::Result<bool> {
            self.inner.exited(fd)
        }
        fn own_namespace(&mut self, kind: NsKind) -> io::Result<NsId> {
            self.inner.own_namespace(kind)
        }
    }

    fn kernel_has_peerpidfd(sock: BorrowedFd<'_>) -> bool {
        matches!(Kernel { sock }.peer_pidfd(), Ok(Some(_)))
    }

    #[test]
    fn a_socketpair_peer_in_our_namespaces_is_accepted_by_the_real_kernel() {
        let (a, _b) = UnixStream::pair().unwrap();
        let me = Some(std::process::id() as i32);
        let peer = check_same_namespaces(a.as_fd()).unwrap();
        assert_eq!(peer.pid, me);
        // Every path, for real, on this kernel (the ones it has).
        let has_pidfd = kernel_has_peerpidfd(a.as_fd());
        for (no_peerpidfd, no_ioctl, method) in [
            (false, false, Method::PidfdIoctl),
            (false, true, Method::PidfdProc),
            (true, true, Method::PeerCred),
        ] {
            if !has_pidfd && !no_peerpidfd {
                eprintln!("SKIP {method:?}: no SO_PEERPIDFD on this kernel");
                continue;
            }
            let mut src = Degraded { inner: Kernel { sock: a.as_fd() }, no_peerpidfd, no_ioctl };
            let ours = own_namespaces(&mut src).unwrap();
            let peer = identify(&mut src).unwrap();
            if method == Method::PidfdIoctl && peer.method == Method::PidfdProc {
                eprintln!("SKIP PidfdIoctl: this kernel has no pidfd namespace ioctls");
            } else {
                assert_eq!(peer.method, method);
            }
            assert_eq!(peer.pid, me);
            compare(ours, &peer).unwrap();
        }
    }

    /// A peer made by `unshare -rn` (new user and network namespace) is refused by every path.
    /// Skipped where unprivileged user namespaces or python3 are unavailable.
    #[test]
    fn a_peer_in_new_namespaces_is_refused_by_the_real_kernel() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peer.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let code = "import socket,sys,time\n\
                    s=socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])\n\
                    sys.stdin.read()\n";
        let child = std::process::Command::new("unshare")
            .args(["-rn", "python3", "-c", code])
            .arg(&path)
            .stdin(std::process::Stdio::piped())
            .spawn();
        let Ok(mut child) = child else {
            eprintln!("SKIP: cannot run unshare");
            return;
        };
        listener.set_nonblocking(true).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let conn = loop {
            match listener.accept() {
                Ok((c, _)) => break Some(c),
                Err(_) if std::time::Instant::now() < deadline => {
                    if child.try_wait().unwrap().is_some() {
                        break None;
                    }
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(_) => break None,
            }
        };
        let Some(conn) = conn else {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!("SKIP: unshare -rn python3 did not connect (no user namespaces here?)");
            return;
        };
        let has_pidfd = kernel_has_peerpidfd(conn.as_fd());
        let err = check_same_namespaces(conn.as_fd()).unwrap_err();
        assert_eq!(err.differing(), vec![NsKind::User, NsKind::Net], "{err}");
        for (no_peerpidfd, no_ioctl) in [(false, true), (true, true)] {
            if !has_pidfd && !no_peerpidfd {
                continue;
            }
            let mut src = Degraded { inner: Kernel { sock: conn.as_fd() }, no_peerpidfd, no_ioctl };
            let ours = own_namespaces(&mut src).unwrap();
            let peer = identify(&mut src).unwrap();
            let err = compare(ours, &peer).unwrap_err();
            assert_eq!(err.differing(), vec![NsKind::User, NsKind::Net], "{err}");
        }
        drop(child.stdin.take());
        let _ = child.wait();
    }
}
