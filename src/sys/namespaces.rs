//! Entering the sandbox's namespaces: a fork-like `clone(2)` straight into new user, mount,
//! network, PID, UTS, IPC and cgroup namespaces, and bringing `lo` up inside the new netns.
//! See user_namespaces(7), pid_namespaces(7), netdevice(7).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use nix::unistd::Pid;

/// Namespace flags for the sandbox (clone(2)).
pub const SANDBOX_NAMESPACES: libc::c_int = libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWCGROUP;

/// Which side of the fork we are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    Parent(Pid),
    Child,
}

/// Number of threads in this process (from `/proc/self/task`).
pub fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// `clone(flags | SIGCHLD)` with no new stack: fork(2) semantics, but the child starts inside
/// the new namespaces (as PID 1 of the new PID namespace). Refuses in a multi-threaded process,
/// where the child could inherit a lock held by another thread.
pub fn fork_into_namespaces(flags: libc::c_int) -> io::Result<Forked> {
    if thread_count()? != 1 {
        return Err(io::Error::other("the sandbox must be started from a single-threaded process"));
    }
    // SAFETY: a raw clone without CLONE_VM and with a NULL stack behaves like fork(2): the child
    // gets a copy-on-write copy of the address space and continues on its own copy of the stack.
    // The process is single-threaded (checked above), so no lock can be held by a thread that
    // does not exist in the child; the parent/child tid pointers and tls are unused (NULL).
    let ret = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
            0usize,
        )
    };
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(Pid::from_raw(pid as libc::pid_t))),
    }
}

/// `CLONE_INTO_CGROUP` (linux/sched.h, Linux 5.7+): clone3(2) places the child in the cgroup
/// whose directory fd is given, atomically, so nothing it does runs outside that cgroup.
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` up to `cgroup` (`CLONE_ARGS_SIZE_VER2`, 88 bytes; clone3(2)).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// Like [`fork_into_namespaces`], but the child is born in the cgroup v2 directory `cgroup`
/// (clone3 with `CLONE_INTO_CGROUP`). `ENOSYS`/`E2BIG` mean the kernel lacks it (before 5.7);
/// callers fall back to [`fork_into_namespaces`].
pub fn fork_into_namespaces_in_cgroup(
    flags: libc::c_int,
    cgroup: BorrowedFd<'_>,
) -> io::Result<Forked> {
    if thread_count()? != 1 {
        return Err(io::Error::other("the sandbox must be started from a single-threaded process"));
    }
    let args = CloneArgs {
        flags: flags as u32 as u64 | CLONE_INTO_CGROUP,
        exit_signal: libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: as in `fork_into_namespaces`: without CLONE_VM and with a zero stack/stack_size,
    // clone3 has fork(2) semantics (the child continues on its copy-on-write copy of this
    // stack); the process is single-threaded (checked above). `args` is a valid, initialised
    // `struct clone_args` of the size passed, alive for the whole call; the kernel only reads it.
    let ret = unsafe {
        libc::syscall(libc::SYS_clone3, &args as *const CloneArgs, std::mem::size_of::<CloneArgs>())
    };
    match ret {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child),
        pid => Ok(Forked::Parent(Pid::from_raw(pid as libc::pid_t))),
    }
}

/// Plain fork(2) (used by init to start the command). Refuses in a multi-threaded process,
/// like [`fork_into_namespaces`], so it is sound to call from safe code.
pub fn fork() -> io::Result<Forked> {
    if thread_count()? != 1 {
        return Err(io::Error::other("fork refused: the process is multi-threaded"));
    }
    // SAFETY: the process is single-threaded (checked above), so the child cannot inherit a
    // lock held by another thread; it gets a copy-on-write copy of this one's memory.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Parent { child } => Ok(Forked::Parent(child)),
        nix::unistd::ForkResult::Child => Ok(Forked::Child),
    }
}

/// Sets `IFF_UP` on the loopback interface of the current network namespace (netdevice(7)).
pub fn loopback_up() -> io::Result<()> {
    let sock: OwnedFd = nix::sys::socket::socket(
        nix::sys::socket::AddressFamily::Inet,
        nix::sys::socket::SockType::Datagram,
        nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    // SAFETY: ifreq is plain old data; zeroed is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in req.ifr_name.iter_mut().zip(b"lo\0") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS reads the flags of the interface named in `req` into `req`; the
    // pointer is valid for the call and the struct is the size the kernel expects.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel filled the ifru_flags member of the union in the call above.
    unsafe {
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
    }
    // SAFETY: as above; SIOCSIFFLAGS only reads `req`.
    if unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// `fork` is a safe fn: with another thread alive it must refuse instead of forking a
    /// child that could inherit that thread's locks.
    #[test]
    fn fork_refuses_in_a_multi_threaded_process() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::spawn(move || {
            let _ = rx.recv();
        });
        let err = fork().expect_err("forked with two threads");
        assert_eq!(err.to_string(), "fork refused: the process is multi-threaded");
        drop(tx);
        other.join().unwrap();
    }
}
