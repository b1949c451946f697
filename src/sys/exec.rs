//! Process-level setup for the sandbox: capability sets and securebits (capabilities(7)),
//! `PR_SET_PDEATHSIG`, keeping inherited fds from the command (close_range(2)), the standard
//! descriptors ([`StdFd`]), signal state before execve, and the terminal ioctls (ioctl_tty(2)).
//!
//! Every function here is sound to call from safe code: fds come in as `BorrowedFd`/`OwnedFd`,
//! and nothing closes a descriptor some other object owns.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};

/// `SECBIT_*` from linux/securebits.h.
pub const SECBIT_NOROOT: libc::c_ulong = 1 << 0;
pub const SECBIT_NOROOT_LOCKED: libc::c_ulong = 1 << 1;
pub const SECBIT_NO_SETUID_FIXUP: libc::c_ulong = 1 << 2;
pub const SECBIT_NO_SETUID_FIXUP_LOCKED: libc::c_ulong = 1 << 3;
pub const SECBIT_KEEP_CAPS_LOCKED: libc::c_ulong = 1 << 5;
pub const SECBIT_NO_CAP_AMBIENT_RAISE: libc::c_ulong = 1 << 6;
pub const SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED: libc::c_ulong = 1 << 7;

/// The securebits the sandbox locks: root gains nothing on exec, setuid transitions do not
/// touch capabilities, and none of it can be undone.
pub const SANDBOX_SECUREBITS: libc::c_ulong = SECBIT_NOROOT
    | SECBIT_NOROOT_LOCKED
    | SECBIT_NO_SETUID_FIXUP
    | SECBIT_NO_SETUID_FIXUP_LOCKED
    | SECBIT_KEEP_CAPS_LOCKED
    | SECBIT_NO_CAP_AMBIENT_RAISE
    | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Highest capability number the kernel knows.
pub fn cap_last_cap() -> io::Result<u32> {
    let text = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")?;
    text.trim().parse().map_err(|e| io::Error::other(format!("cap_last_cap: {e}")))
}

/// Clears every capability set (bounding, ambient, inheritable, permitted, effective) and
/// locks the securebits. Needs CAP_SETPCAP (held in our own user namespace until the end).
pub fn drop_all_capabilities() -> io::Result<()> {
    let last = cap_last_cap()?;
    for cap in 0..=last {
        // SAFETY: PR_CAPBSET_DROP takes a capability number and no pointers.
        check(unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) })?;
    }
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL takes no pointers.
    check(unsafe {
        libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0)
    })?;
    // SAFETY: PR_SET_SECUREBITS takes a bit mask and no pointers.
    check(unsafe { libc::prctl(libc::PR_SET_SECUREBITS, SANDBOX_SECUREBITS, 0, 0, 0) })?;
    let mut header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let data = [CapData::default(); 2];
    // SAFETY: capset(2) reads one header and two data structs (version 3) from valid memory.
    check(unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) as libc::c_int })
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The current securebits (prctl PR_GET_SECUREBITS).
pub fn securebits() -> io::Result<libc::c_ulong> {
    // SAFETY: no pointers.
    let ret = unsafe { libc::prctl(libc::PR_GET_SECUREBITS, 0, 0, 0, 0) };
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(ret as libc::c_ulong) }
}

/// Delivers `SIGKILL` to this process when its parent exits (PR_SET_PDEATHSIG).
pub fn die_with_parent() -> io::Result<()> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(io::Error::from)
}

/// Makes this process non-dumpable: its /proc files become inaccessible to processes without
/// CAP_SYS_PTRACE over it (init is a fork of the supervisor: its memory holds the host's env).
pub fn set_not_dumpable() -> io::Result<()> {
    nix::sys::prctl::set_dumpable(false).map_err(io::Error::from)
}

/// Sets `no_new_privs`: execve never grants privileges again (setuid bits, file caps).
pub fn set_no_new_privs() -> io::Result<()> {
    nix::sys::prctl::set_no_new_privs().map_err(io::Error::from)
}

/// Marks every fd from `first` upwards close-on-exec (close_range(2) with
/// `CLOSE_RANGE_CLOEXEC`, Linux 5.11+): a successful execve(2) closes them, so the program sees
/// only what lies below `first`. Nothing is closed now, so every object owning one of them
/// stays valid if the exec fails.
pub fn cloexec_fds_from(first: u32) -> io::Result<()> {
    const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2; // linux/close_range.h
    // SAFETY: with CLOSE_RANGE_CLOEXEC, close_range only sets FD_CLOEXEC on open descriptors;
    // it closes none and touches no memory.
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, CLOSE_RANGE_CLOEXEC) };
    if ret < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

/// Restores the signal state a freshly exec'd program expects: nothing blocked, SIGPIPE at its
/// default (the Rust runtime ignores it, and ignored signals survive execve).
pub fn reset_signals_for_exec(forwarded: &nix::sys::signal::SigSet) -> io::Result<()> {
    use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, sigprocmask};
    for sig in forwarded.iter().chain([Signal::SIGPIPE]) {
        // SAFETY: installing SIG_DFL does not register any Rust code as a handler.
        unsafe { nix::sys::signal::signal(sig, SigHandler::SigDfl) }?;
    }
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
    Ok(())
}

extern "C" fn noop_handler(_: libc::c_int) {}

/// Installs a no-op handler for each signal in `set`. PID 1 of a namespace only receives
/// signals it has a handler for (pid_namespaces(7)); init keeps them blocked and collects them
/// with sigwait, so the handler never actually runs.
pub fn install_noop_handlers(set: &nix::sys::signal::SigSet) -> io::Result<()> {
    use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, sigaction};
    let action =
        SigAction::new(SigHandler::Handler(noop_handler), SaFlags::SA_RESTART, SigSet::empty());
    for sig in set.iter() {
        // SAFETY: the handler is an empty extern "C" fn: async-signal-safe by construction.
        unsafe { sigaction(sig, &action) }?;
    }
    Ok(())
}

/// Ignores SIGPIPE (the host-side relay reports EPIPE as an error instead of dying).
pub fn ignore_sigpipe() -> io::Result<()> {
    use nix::sys::signal::{SigHandler, Signal};
    // SAFETY: installing SIG_IGN does not register any Rust code as a handler.
    unsafe { nix::sys::signal::signal(Signal::SIGPIPE, SigHandler::SigIgn) }?;
    Ok(())
}

/// Makes `fd` (a terminal) the controlling terminal of this session (TIOCSCTTY).
pub fn set_controlling_tty(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: TIOCSCTTY takes an integer argument (0: do not steal), no pointers.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSCTTY, 0) })
}

/// The window size of terminal `fd`, if it is one.
pub fn window_size(fd: BorrowedFd<'_>) -> Option<libc::winsize> {
    // SAFETY: winsize is plain old data.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ writes one winsize into valid memory.
    let ret = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
    (ret == 0).then_some(ws)
}

/// Sets the window size of terminal `fd` (TIOCSWINSZ).
pub fn set_window_size(fd: BorrowedFd<'_>, ws: &libc::winsize) -> io::Result<()> {
    // SAFETY: TIOCSWINSZ reads one winsize from valid memory.
    check(unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCSWINSZ, ws) })
}

/// Sets a resource limit (soft = hard = `value`).
pub fn set_rlimit_nproc(value: u64) -> io::Result<()> {
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NPROC, value, value)
        .map_err(io::Error::from)
}

/// sigtimedwait(2): the next pending signal of `set` (which the caller has blocked), waiting at
/// most `timeout`; `None` once the time has passed.
pub fn sigtimedwait(
    set: &nix::sys::signal::SigSet,
    timeout: std::time::Duration,
) -> nix::Result<Option<nix::sys::signal::Signal>> {
    let ts = nix::sys::time::TimeSpec::from_duration(timeout);
    // SAFETY: `set` is a valid sigset_t, the siginfo pointer may be NULL and `ts` is a valid
    // timespec, all only read during the call (sigtimedwait(2)).
    let r = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), ts.as_ref()) };
    if r < 0 {
        return match nix::errno::Errno::last() {
            nix::errno::Errno::EAGAIN => Ok(None),
            e => Err(e),
        };
    }
    nix::sys::signal::Signal::try_from(r).map(Some)
}

/// Leaves immediately without running destructors or atexit handlers (used in forked
/// children that must not flush the parent's buffers twice).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit is always safe to call; it never returns.
    unsafe { libc::_exit(code) }
}

/// The Landlock ABI version of the running kernel (`landlock_create_ruleset(NULL, 0,
/// LANDLOCK_CREATE_RULESET_VERSION)`), or None if Landlock is unavailable.
pub fn landlock_abi() -> Option<u32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attr and size 0 and the VERSION flag, the kernel reads no memory and
    // returns the ABI version (landlock_create_ruleset(2)).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    u32::try_from(ret).ok().filter(|v| *v > 0)
}

/// One of the standard descriptors 0, 1 and 2 (the caller's terminal or pipes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StdFd(RawFd);

impl StdFd {
    pub const IN: Self = Self(0);
    pub const OUT: Self = Self(1);
    pub const ERR: Self = Self(2);
    pub const ALL: [Self; 3] = [Self::IN, Self::OUT, Self::ERR];

    /// `fd` if it is 0, 1 or 2.
    pub fn new(fd: RawFd) -> Option<Self> {
        (0..=2).contains(&fd).then_some(Self(fd))
    }

    pub fn raw(self) -> RawFd {
        self.0
    }

    /// Index into per-descriptor arrays (`[_; 3]`).
    pub fn index(self) -> usize {
        // 0..=2 by construction.
        self.0 as usize
    }

    /// Borrows the descriptor for the life of the process.
    pub fn borrow(self) -> BorrowedFd<'static> {
        // SAFETY: 0–2 belong to the process, not to any object: the standard library makes the
        // same assumption (`impl AsFd for Stdin` borrows fd 0 unconditionally). This crate keeps
        // them open — the supervisor runs `ensure_stdio_open` first, and the only replacement,
        // `dup_onto`, is a dup2(2), which never leaves the number closed — and no `OwnedFd` in
        // it ever owns 0–2.
        unsafe { BorrowedFd::borrow_raw(self.0) }
    }
}

/// Makes sure 0, 1 and 2 are open, on `/dev/null` if they were closed (a closed one would be
/// reused by the next pipe, and [`StdFd::borrow`] relies on them being open).
pub fn ensure_stdio_open() -> io::Result<()> {
    for fd in StdFd::ALL {
        // SAFETY: F_GETFD on a descriptor number only queries the fd table; no object is
        // borrowed, and a closed number just fails with EBADF.
        if unsafe { libc::fcntl(fd.raw(), libc::F_GETFD) } >= 0 {
            continue;
        }
        let null = nix::fcntl::open(
            "/dev/null",
            nix::fcntl::OFlag::O_RDWR,
            nix::sys::stat::Mode::empty(),
        )?;
        if null.as_raw_fd() == fd.raw() {
            // open(2) returns the lowest free number: it *is* the standard descriptor now,
            // which no object may own (see `StdFd::borrow`).
            std::mem::forget(null);
        } else {
            dup_onto(null.as_fd(), fd)?;
        }
    }
    Ok(())
}

/// dup2(2): makes the standard descriptor `target` a copy of `src`, without CLOEXEC.
pub fn dup_onto(src: BorrowedFd<'_>, target: StdFd) -> io::Result<()> {
    if src.as_raw_fd() == target.raw() {
        // dup2 is a no-op then and would leave CLOEXEC set; clear it explicitly.
        return nix::fcntl::fcntl(src, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()))
            .map(|_| ())
            .map_err(io::Error::from);
    }
    // SAFETY: dup2 only manipulates the fd table: `src` is open for the call (borrowed) and
    // `target` is a standard descriptor, which no object owns (see `StdFd::borrow`); dup2
    // replaces it atomically.
    check(unsafe { libc::dup2(src.as_raw_fd(), target.raw()) })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn only_0_to_2_are_standard_descriptors() {
        assert_eq!(StdFd::new(2), Some(StdFd::ERR));
        assert_eq!(StdFd::new(3), None);
        assert_eq!(StdFd::new(-1), None);
        assert_eq!(StdFd::ALL.map(StdFd::index), [0, 1, 2]);
    }

    #[test]
    fn cloexec_marks_without_closing() {
        let file = std::fs::File::open("/dev/null").unwrap();
        nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()))
            .unwrap();
        let first = u32::try_from(file.as_raw_fd()).unwrap();
        cloexec_fds_from(first).unwrap();
        // Still open (the File stays valid), and now close-on-exec.
        let flags = nix::fcntl::fcntl(&file, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert!(
            nix::fcntl::FdFlag::from_bits_truncate(flags).contains(nix::fcntl::FdFlag::FD_CLOEXEC)
        );
        assert!(file.metadata().is_ok());
    }
}
