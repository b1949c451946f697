//! Process-level setup for the sandbox: capability sets and securebits (capabilities(7)),
//! `PR_SET_PDEATHSIG`, closing inherited fds (close_range(2)), signal state before execve,
//! and the terminal ioctls (ioctl_tty(2)).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

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

/// Closes every fd from `first` upwards (close_range(2), Linux 5.9+).
pub fn close_fds_from(first: u32) -> io::Result<()> {
    // SAFETY: close_range only closes descriptors; callers own every fd >= `first` and keep no
    // Rust objects referring to them past this point (init/exec paths only).
    let ret = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, 0u32) };
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

/// Borrows an fd number this process inherited and keeps open for its whole life (the
/// sandbox's spec fds, valid from fork until the process execs or exits).
pub fn borrow_raw(fd: std::os::fd::RawFd) -> BorrowedFd<'static> {
    // SAFETY: callers pass only fds inherited at fork that stay open for the rest of this
    // process (they are closed only by close_range right before execve, or by exit).
    unsafe { BorrowedFd::borrow_raw(fd) }
}

/// Takes ownership of an inherited fd number (closing it on drop).
pub fn own_raw(fd: std::os::fd::RawFd) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: callers pass an fd this process owns and that no other object will close.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}

/// dup2(2): makes `target` a copy of `src` (clearing CLOEXEC on it).
pub fn dup_onto(src: std::os::fd::RawFd, target: std::os::fd::RawFd) -> io::Result<()> {
    if src == target {
        // dup2 is a no-op then and would leave CLOEXEC set; clear it explicitly.
        let fd = borrow_raw(src);
        return nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()))
            .map(|_| ())
            .map_err(io::Error::from);
    }
    // SAFETY: dup2 only manipulates the fd table; `target` is one of 0..=2, which the caller
    // intends to replace.
    check(unsafe { libc::dup2(src, target) })
}
