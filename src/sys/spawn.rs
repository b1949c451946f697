//! Starting `airlockd` the way a service manager does (sd_listen_fds(3)): the listening socket
//! as fd 3, `LISTEN_FDS=1`, `LISTEN_FDNAMES=<name>`, and `LISTEN_PID` = the pid of the process
//! that execs, in a new session (setsid(2)).
//!
//! Used by the CLI's one-shot activator (detached: double fork, so the daemon is never our
//! zombie) and by the test harness (attached: the caller waits for the child).
//!
//! Between fork and exec only async-signal-safe calls run (signal-safety(7)): every string,
//! the environment array and the `LISTEN_PID=` buffer are built before `fork`, and the child
//! only resets its signal state, writes digits into that buffer, `dup2`s, `setsid`s and
//! `execve`s.
//!
//! The signal mask and ignored dispositions survive `execve` (signal(7), "Signal mask and
//! pending signals"; execve(2)): a daemon started from the sandbox supervisor, which blocks
//! SIGTERM, SIGINT and friends, would otherwise never see SIGTERM. So the child resets every
//! catchable signal to `SIG_DFL` and empties its mask before exec, as a service manager does.

use std::ffi::{CString, OsStr, OsString, c_char};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// `LISTEN_PID=` plus up to 20 digits and a NUL.
const PID_VAR_CAP: usize = 40;

/// How the child relates to the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Double fork: the daemon is re-parented to init (or the subreaper); returns `None`.
    Detached,
    /// Single fork: returns the child's pid for `waitpid`.
    Attached,
}

/// What to exec and with which descriptors.
#[derive(Debug)]
pub struct ActivatedSpawn<'a> {
    pub program: &'a Path,
    pub args: &'a [OsString],
    /// The complete environment of the child (the caller removes stale `LISTEN_*`).
    pub env: &'a [(OsString, OsString)],
    /// The listening socket, installed as fd 3.
    pub listener: BorrowedFd<'a>,
    pub fd_name: &'a str,
    /// Becomes fd 2 (fd 0 and 1 are `/dev/null`).
    pub stderr: Option<BorrowedFd<'a>>,
    pub mode: Mode,
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(io::ErrorKind::InvalidInput, "NUL byte in argument or environment")
    })
}

fn env_entry(key: &OsStr, value: &OsStr) -> io::Result<CString> {
    let mut v = key.as_bytes().to_vec();
    v.push(b'=');
    v.extend_from_slice(value.as_bytes());
    cstring(&v)
}

/// Writes `LISTEN_PID=<pid>\0` into `buf` without allocating (async-signal-safe).
fn write_pid_var(buf: &mut [u8; PID_VAR_CAP], pid: libc::pid_t) {
    const PREFIX: &[u8] = b"LISTEN_PID=";
    let mut i = 0;
    while i < PREFIX.len() {
        buf[i] = PREFIX[i];
        i += 1;
    }
    let mut digits = [0u8; 20];
    let mut n = pid.unsigned_abs() as u64;
    let mut d = 0;
    loop {
        digits[d] = b'0' + (n % 10) as u8;
        n /= 10;
        d += 1;
        if n == 0 {
            break;
        }
    }
    while d > 0 {
        d -= 1;
        buf[i] = digits[d];
        i += 1;
    }
    buf[i] = 0;
}

/// Forks and execs `spec.program` as a socket-activated service. See the module docs.
pub fn spawn_activated(spec: &ActivatedSpawn<'_>) -> io::Result<Option<libc::pid_t>> {
    let program = cstring(spec.program.as_os_str().as_bytes())?;
    let mut argv_c = vec![program.clone()];
    for a in spec.args {
        argv_c.push(cstring(a.as_bytes())?);
    }
    let mut envp_c = Vec::with_capacity(spec.env.len() + 2);
    for (k, v) in spec.env {
        // Stale activation variables would name the wrong pid or fds.
        if k.as_bytes().starts_with(b"LISTEN_") {
            continue;
        }
        envp_c.push(env_entry(k, v)?);
    }
    envp_c.push(cstring(b"LISTEN_FDS=1")?);
    envp_c.push(env_entry(OsStr::new("LISTEN_FDNAMES"), OsStr::new(spec.fd_name))?);
    let mut pid_var = Box::new([0u8; PID_VAR_CAP]);

    let argv: Vec<*const c_char> =
        argv_c.iter().map(|c| c.as_ptr()).chain(std::iter::once(std::ptr::null())).collect();
    let mut envp: Vec<*const c_char> = envp_c.iter().map(|c| c.as_ptr()).collect();
    envp.push(pid_var.as_ptr().cast::<c_char>());
    envp.push(std::ptr::null());
    let pid_var_ptr: *mut [u8; PID_VAR_CAP] = &mut *pid_var;

    let devnull = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null")?;
    let null_fd = devnull.as_raw_fd();
    let listener_fd = spec.listener.as_raw_fd();
    let stderr_fd = spec.stderr.map_or(-1, |f| f.as_raw_fd());
    let detached = spec.mode == Mode::Detached;

    // SAFETY: fork(2). The child runs only async-signal-safe libc calls (see `child`) on memory
    // prepared above, which stays valid in the child's copy of the address space.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: we are the freshly forked child; `child` never returns.
        unsafe {
            child(
                detached,
                null_fd,
                listener_fd,
                stderr_fd,
                pid_var_ptr,
                argv.as_ptr(),
                envp.as_ptr(),
            )
        }
    }
    if detached {
        // Reap the intermediate child, which exits right after its own fork.
        loop {
            match nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None) {
                Err(nix::Error::EINTR) => continue,
                Ok(nix::sys::wait::WaitStatus::Exited(_, 0)) => return Ok(None),
                Ok(other) => {
                    return Err(io::Error::other(format!("activator child failed: {other:?}")));
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
    drop(devnull);
    Ok(Some(pid))
}

/// The child side of [`spawn_activated`]: async-signal-safe calls only, never returns.
///
/// # Safety
/// Must be called only in a just-forked child, with pointers into memory prepared before fork.
unsafe fn child(
    detached: bool,
    null_fd: libc::c_int,
    listener_fd: libc::c_int,
    stderr_fd: libc::c_int,
    pid_var: *mut [u8; PID_VAR_CAP],
    argv: *const *const c_char,
    envp: *const *const c_char,
) -> ! {
    // SAFETY: every call below is listed in signal-safety(7) (or is a raw syscall); the
    // pointers were prepared before fork and are valid in this copy of the address space.
    unsafe {
        if libc::setsid() < 0 {
            libc::_exit(126);
        }
        if detached {
            let pid = libc::fork();
            if pid < 0 {
                libc::_exit(126);
            }
            if pid > 0 {
                libc::_exit(0);
            }
        }
        reset_signals();
        // fd 3 is the listener's place: if /dev/null or the log happen to sit there (fd numbers
        // depend on what the caller had open), move them above it first, or installing the
        // listener would close them. The copies above 3 are closed by close_range below.
        let mut null_fd = null_fd;
        let mut stderr_fd = stderr_fd;
        if null_fd == 3 {
            null_fd = libc::fcntl(null_fd, libc::F_DUPFD, 4);
            if null_fd < 0 {
                libc::_exit(126);
            }
        }
        if stderr_fd == 3 && listener_fd != 3 {
            stderr_fd = libc::fcntl(stderr_fd, libc::F_DUPFD, 4);
            if stderr_fd < 0 {
                libc::_exit(126);
            }
        }
        // Move the listener to fd 3 first: dup2 onto 0..2 below could otherwise clobber it.
        if listener_fd == 3 {
            let flags = libc::fcntl(3, libc::F_GETFD);
            if flags < 0 || libc::fcntl(3, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                libc::_exit(126);
            }
        } else if libc::dup2(listener_fd, 3) < 0 {
            libc::_exit(126);
        }
        let err = if stderr_fd >= 0 && stderr_fd != 3 { stderr_fd } else { null_fd };
        if libc::dup2(null_fd, 0) < 0 || libc::dup2(null_fd, 1) < 0 || libc::dup2(err, 2) < 0 {
            libc::_exit(126);
        }
        // Nothing but 0-3 reaches the daemon (close_range(2), Linux 5.9; best effort elsewhere).
        #[cfg(target_os = "linux")]
        libc::syscall(libc::SYS_close_range, 4u32, u32::MAX, 0u32);
        write_pid_var(&mut *pid_var, libc::getpid());
        libc::execve(*argv, argv, envp);
        libc::_exit(127);
    }
}

/// Every catchable signal back to `SIG_DFL`, then an empty mask (async-signal-safe: only
/// sigaction(2), sigemptyset(3) and sigprocmask(2), all in signal-safety(7)). Dispositions go
/// first, so a signal that is pending when the mask opens gets its default action, never a
/// handler of the parent's that makes no sense in this child.
///
/// # Safety
/// Must be called only in a just-forked child that is about to exec.
unsafe fn reset_signals() {
    // SAFETY: the structs are plain C data on our stack, zero-initialised (a valid "SIG_DFL, no
    // flags, empty mask" action) or filled by sigemptyset; the calls are async-signal-safe.
    // SIGKILL and SIGSTOP cannot be changed and fail with EINVAL, which is ignored.
    unsafe {
        for sig in 1..SIGNAL_LIMIT {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            // Raw rt_sigaction on Linux: the C library refuses the real-time signals it keeps
            // for itself (32 and 33 in glibc, nptl(7)), yet an ignored one still survives
            // execve. The kernel's struct is four words here, all zero = SIG_DFL, and its mask
            // is 64 bits (8 bytes) on every Linux architecture.
            #[cfg(target_os = "linux")]
            {
                let action = [0u64; 4];
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    action.as_ptr(),
                    std::ptr::null_mut::<u64>(),
                    8usize,
                );
            }
            #[cfg(not(target_os = "linux"))]
            {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = libc::SIG_DFL;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(sig, &action, std::ptr::null_mut());
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
    }
}

/// One past the highest signal number: Linux has 64 (`_NSIG` = 65, signal(7)); other Unixes
/// fewer, where the extra numbers just fail with EINVAL.
const SIGNAL_LIMIT: libc::c_int = 65;

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn pid_var_is_formatted_without_allocation() {
        let mut buf = [0u8; PID_VAR_CAP];
        write_pid_var(&mut buf, 4_194_304);
        let end = buf.iter().position(|&b| b == 0).unwrap();
        assert_eq!(&buf[..end], b"LISTEN_PID=4194304");
        write_pid_var(&mut buf, 7);
        let end = buf.iter().position(|&b| b == 0).unwrap();
        assert_eq!(&buf[..end], b"LISTEN_PID=7");
    }

    /// Regression: when the caller's `/dev/null` landed on fd 3, installing the listener there
    /// closed it and the child gave up with 126 (seen as a flaky unit test under parallel load).
    #[test]
    fn a_devnull_or_log_on_fd_3_is_moved_out_of_the_listeners_way() {
        let dir = tempfile::tempdir().unwrap();
        let l = std::os::unix::net::UnixListener::bind(dir.path().join("s")).unwrap();
        let log = std::fs::File::create(dir.path().join("log")).unwrap();
        let out = dir.path().join("out");
        let script =
            format!("test -S /proc/self/fd/3 && echo err-ok >&2 && echo ok > {}", out.display());
        let args = vec![OsString::from("-c"), OsString::from(script)];
        // Run the spawn in a forked test child whose fd 3 is the log file, so the parent test
        // process's descriptors are untouched.
        use std::os::fd::AsRawFd;
        // SAFETY: test-only fork; the child only calls dup2/spawn_activated/waitpid/_exit.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // Other tests run in parallel, so the listener itself may be fd 3: move it first.
            let mut listener_fd = l.as_raw_fd();
            if listener_fd == 3 {
                // SAFETY: F_DUPFD on an fd we own, in the forked child.
                listener_fd = unsafe { libc::fcntl(3, libc::F_DUPFD_CLOEXEC, 4) };
            }
            // SAFETY: dup2 onto fd 3 in the forked child; whatever sat there is not used again.
            unsafe { libc::dup2(log.as_raw_fd(), 3) };
            // SAFETY: fd 3 now refers to the log file and nothing else owns this number.
            let log3 = unsafe { BorrowedFd::borrow_raw(3) };
            // SAFETY: `listener_fd` is the listener (or its copy), open for the child's life.
            let listener = unsafe { BorrowedFd::borrow_raw(listener_fd) };
            let code = match spawn_activated(&ActivatedSpawn {
                program: Path::new("/bin/sh"),
                args: &args,
                env: &[],
                listener,
                fd_name: "airlock",
                stderr: Some(log3),
                mode: Mode::Attached,
            }) {
                Ok(Some(child)) => {
                    match nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(child), None) {
                        Ok(nix::sys::wait::WaitStatus::Exited(_, c)) => c,
                        _ => 99,
                    }
                }
                _ => 98,
            };
            // SAFETY: leave the forked test child without running the harness's atexit code.
            unsafe { libc::_exit(code) };
        }
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
        assert_eq!(status, nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 0));
        assert_eq!(std::fs::read_to_string(&out).unwrap().trim(), "ok");
        let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
        assert_eq!(log.trim(), "err-ok", "stderr must still reach the log");
    }

    #[test]
    fn attached_child_sees_fd3_and_its_own_pid() {
        let dir = tempfile::tempdir().unwrap();
        let l = std::os::unix::net::UnixListener::bind(dir.path().join("s")).unwrap();
        let out = dir.path().join("out");
        let script = format!(
            "test \"$LISTEN_PID\" = \"$$\" && test \"$LISTEN_FDS\" = 1 && \
             test \"$LISTEN_FDNAMES\" = airlock && test -S /proc/self/fd/3 && echo ok > {}",
            out.display()
        );
        use std::os::fd::AsFd;
        let args = vec![OsString::from("-c"), OsString::from(script)];
        let env = vec![(OsString::from("LISTEN_PID"), OsString::from("1"))];
        let pid = spawn_activated(&ActivatedSpawn {
            program: Path::new("/bin/sh"),
            args: &args,
            env: &env,
            listener: l.as_fd(),
            fd_name: "airlock",
            stderr: None,
            mode: Mode::Attached,
        })
        .unwrap()
        .unwrap();
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
        assert_eq!(status, nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 0));
        assert_eq!(std::fs::read_to_string(out).unwrap().trim(), "ok");
    }
}
