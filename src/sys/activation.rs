//! Socket activation: adopting the control socket a service manager hands `airlockd`
//! (systemd `LISTEN_FDS`/`LISTEN_PID`/`LISTEN_FDNAMES`, sd_listen_fds(3); launchd
//! `launch_activate_socket(3)`), preparing it (non-blocking, `FD_CLOEXEC`) and raising the
//! soft `RLIMIT_NOFILE` to the hard limit (DESIGN §6).
//!
//! Everything here runs in the synchronous `main`, before any thread exists: the `*_and_unset_env`
//! variant of the parser removes `LISTEN_*` so nothing the daemon starts later inherits them.

use std::ffi::{CString, c_char, c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
use nix::sys::socket::{
    AddressFamily, SockaddrLike, SockaddrStorage, getsockname, getsockopt, sockopt,
};

/// The name the control socket carries: `FileDescriptorName=airlock` in `airlock.socket`, the
/// `Sockets` key in the launchd plists, the argument of `launch_activate_socket`.
pub const SOCKET_NAME: &str = "airlock";

/// Set (to `airlock`) by the CLI's one-shot activator in the daemon's environment, so `status`
/// can say who started it: the `LISTEN_*` protocol alone looks the same as systemd's.
pub const ACTIVATOR_VAR: &str = "AIRLOCK_ACTIVATOR";

/// Where an adopted socket came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Systemd,
    Launchd,
    /// The `airlock` CLI's one-shot activator (no service manager).
    OneShot,
}

/// The adopted, prepared control socket.
#[derive(Debug)]
pub struct Adopted {
    pub fd: OwnedFd,
    pub source: Source,
}

#[derive(Debug, thiserror::Error)]
pub enum ActivationError {
    #[error(
        "no activation socket: airlockd is started by a service manager, never by hand.\n\
         Start it with `systemctl --user enable --now airlock.socket` (systemd), \
         `launchctl bootstrap gui/$UID ~/Library/LaunchAgents/dev.airlock.airlockd.plist` \
         (launchd; `airlock service install` writes both), or just run `airlock status`, which \
         activates it on machines without a service manager"
    )]
    NoSocket,
    #[error(
        "the service manager passed {count} socket(s) named {names:?} but none named \
         {wanted:?}; set `FileDescriptorName={wanted}` in the .socket unit \
         (or the `{wanted}` key under `Sockets` in the launchd plist)"
    )]
    WrongName { wanted: &'static str, count: usize, names: Vec<String> },
    #[error("invalid socket-activation environment: {0}; check LISTEN_FDS/LISTEN_FDNAMES")]
    BadEnvironment(#[source] std::io::Error),
    #[error("launch_activate_socket({SOCKET_NAME:?}) failed: {0}")]
    Launchd(#[source] std::io::Error),
    #[error(
        "the socket named {wanted:?} (fd {fd}) is not a listening {family} stream socket \
         ({what}); use `ListenStream=` with `Accept=no`"
    )]
    NotAListener { wanted: &'static str, family: &'static str, fd: RawFd, what: String },
    #[error("cannot prepare the activation socket: {0}")]
    Prepare(#[source] nix::Error),
}

/// Adopts the socket named [`SOCKET_NAME`], from launchd on macOS, else from systemd's variables.
///
/// Must be called before any thread exists (it unsets `LISTEN_*`).
pub fn adopt() -> Result<Adopted, ActivationError> {
    #[cfg(target_os = "macos")]
    {
        match launchd::adopt_with(launchd::launch_activate_socket, SOCKET_NAME) {
            Ok(mut fds) if !fds.is_empty() => {
                // launchd may pass one fd per address family; a unix path socket has one.
                let fd = fds.swap_remove(0);
                prepare(&fd)?;
                return Ok(Adopted { fd, source: Source::Launchd });
            }
            // ESRCH: not managed by launchd; fall through to the systemd variables (tests).
            Ok(_) | Err(LaunchdError::NotManaged) => {}
            Err(LaunchdError::Os(err)) => return Err(ActivationError::Launchd(err)),
        }
    }
    // SAFETY: `main` calls this before building the tokio runtime or spawning any thread, so
    // removing the variables cannot race a concurrent `getenv` (std::env::remove_var's rule).
    let fds = unsafe { sd_notify::listen_fds_with_names_and_unset_env() }
        .map_err(ActivationError::BadEnvironment)?;
    let fds: Vec<(RawFd, String)> = fds.collect();
    let fd = pick_named(fds, SOCKET_NAME, Family::Unix)?;
    let one_shot = std::env::var_os(ACTIVATOR_VAR).is_some_and(|v| v == "airlock");
    // SAFETY: as above, no other thread exists yet.
    unsafe { std::env::remove_var(ACTIVATOR_VAR) };
    let source = if one_shot { Source::OneShot } else { Source::Systemd };
    Ok(Adopted { fd, source })
}

/// The address family an adopted listener must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// The control socket (`ListenStream=` a path).
    Unix,
    /// The review plane (`ListenStream=` a TCP port).
    Inet,
}

/// Adopts the systemd socket named `name` (e.g. `review`, a TCP listener) for roles other than
/// the control socket. `Ok(None)` when no activation fds were passed at all.
///
/// Must be called before any thread exists (it unsets `LISTEN_*`).
pub fn adopt_named(name: &'static str, family: Family) -> Result<Option<OwnedFd>, ActivationError> {
    // SAFETY: callers run this in the synchronous `main` before any thread exists, so removing
    // the variables cannot race a concurrent `getenv` (std::env::remove_var's rule).
    let fds = unsafe { sd_notify::listen_fds_with_names_and_unset_env() }
        .map_err(ActivationError::BadEnvironment)?;
    let fds: Vec<(RawFd, String)> = fds.collect();
    match pick_named(fds, name, family) {
        Ok(fd) => Ok(Some(fd)),
        Err(ActivationError::NoSocket) => Ok(None),
        Err(err) => Err(err),
    }
}

/// Takes ownership of every passed fd, keeps the one named `wanted` (the rest are closed), and
/// prepares it.
fn pick_named(
    fds: Vec<(RawFd, String)>,
    wanted: &'static str,
    family: Family,
) -> Result<OwnedFd, ActivationError> {
    if fds.is_empty() {
        return Err(ActivationError::NoSocket);
    }
    let count = fds.len();
    let mut names = Vec::with_capacity(count);
    let mut chosen = None;
    for (raw, name) in fds {
        // SAFETY: sd_listen_fds(3): fds 3..3+LISTEN_FDS were passed to this process (LISTEN_PID
        // matched) and nothing else in the process has claimed them; we take each exactly once.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        if name == wanted && chosen.is_none() {
            chosen = Some(fd);
        }
        names.push(name);
    }
    let fd = chosen.ok_or(ActivationError::WrongName { wanted, count, names })?;
    prepare_as(&fd, wanted, family)?;
    Ok(fd)
}

/// Checks the fd is a listening unix stream socket and makes it non-blocking and CLOEXEC.
pub fn prepare(fd: &OwnedFd) -> Result<(), ActivationError> {
    prepare_as(fd, SOCKET_NAME, Family::Unix)
}

fn prepare_as(fd: &OwnedFd, wanted: &'static str, family: Family) -> Result<(), ActivationError> {
    let raw = fd.as_raw_fd();
    let family_name = match family {
        Family::Unix => "unix",
        Family::Inet => "TCP",
    };
    let not_listener =
        |what: String| ActivationError::NotAListener { wanted, family: family_name, fd: raw, what };
    match getsockopt(fd, sockopt::AcceptConn) {
        Ok(true) => {}
        Ok(false) => return Err(not_listener("not listening".into())),
        Err(err) => return Err(not_listener(format!("not a socket: {err}"))),
    }
    let addr: SockaddrStorage = getsockname(raw).map_err(|e| not_listener(e.to_string()))?;
    let family_ok = match family {
        Family::Unix => addr.family() == Some(AddressFamily::Unix),
        Family::Inet => matches!(addr.family(), Some(AddressFamily::Inet | AddressFamily::Inet6)),
    };
    if !family_ok {
        return Err(not_listener(format!("address family {:?}", addr.family())));
    }
    let flags = fcntl(fd, FcntlArg::F_GETFL).map_err(ActivationError::Prepare)?;
    let flags = OFlag::from_bits_retain(flags) | OFlag::O_NONBLOCK;
    fcntl(fd, FcntlArg::F_SETFL(flags)).map_err(ActivationError::Prepare)?;
    fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(ActivationError::Prepare)?;
    Ok(())
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (each tunnel costs two fds). Returns the
/// new soft limit.
pub fn raise_nofile() -> Result<u64, nix::Error> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    Ok(hard.max(soft))
}

/// Errors of the launchd marshalling, kept apart so the "not managed" case can fall through.
#[derive(Debug)]
pub enum LaunchdError {
    /// `ESRCH`: the process is not managed by launchd.
    NotManaged,
    Os(std::io::Error),
}

/// The signature of `launch_activate_socket(3)`.
pub type ActivateFn =
    unsafe extern "C" fn(name: *const c_char, fds: *mut *mut c_int, cnt: *mut usize) -> c_int;

/// launchd adoption. The marshalling (`adopt_with`) is portable and unit-tested on Linux
/// against a fake; only the symbol itself is macOS-only.
pub mod launchd {
    use super::*;

    #[cfg(target_os = "macos")]
    unsafe extern "C" {
        /// `<launch.h>`: `int launch_activate_socket(const char *name, int **fds, size_t *cnt);`
        pub fn launch_activate_socket(
            name: *const c_char,
            fds: *mut *mut c_int,
            cnt: *mut usize,
        ) -> c_int;
    }

    /// Calls `activate` for `name`, takes ownership of the returned fds and frees the array
    /// with `free(3)` as launch_activate_socket(3) requires.
    ///
    /// Return codes per the man page: 0 success, `ENOENT` no socket by that name, `ESRCH` not
    /// managed by launchd, `EALREADY` already activated (each fd is handed out once).
    pub fn adopt_with(activate: ActivateFn, name: &str) -> Result<Vec<OwnedFd>, LaunchdError> {
        let cname = CString::new(name).map_err(|e| {
            LaunchdError::Os(std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
        })?;
        let mut fds: *mut c_int = std::ptr::null_mut();
        let mut cnt: usize = 0;
        // SAFETY: `cname` is a valid NUL-terminated string for the call; `fds`/`cnt` are valid
        // out-pointers; the callee follows launch_activate_socket(3)'s contract.
        let rc = unsafe { activate(cname.as_ptr(), &mut fds, &mut cnt) };
        if rc != 0 {
            return Err(match rc {
                libc::ESRCH => LaunchdError::NotManaged,
                other => LaunchdError::Os(std::io::Error::from_raw_os_error(other)),
            });
        }
        if fds.is_null() {
            return Ok(Vec::new());
        }
        let mut owned = Vec::with_capacity(cnt);
        for i in 0..cnt {
            // SAFETY: on success `fds` points to `cnt` ints allocated by the callee.
            let raw = unsafe { *fds.add(i) };
            if raw >= 0 {
                // SAFETY: each fd in the array was created for this process and is handed out
                // exactly once (EALREADY afterwards); nothing else owns it.
                owned.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: the array was allocated with malloc by the callee and is ours to free, once.
        unsafe { libc::free(fds.cast::<c_void>()) };
        Ok(owned)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    /// A stand-in for launchd: mallocs an array holding a dup of a real listener.
    unsafe extern "C" fn fake_activate(
        name: *const c_char,
        fds: *mut *mut c_int,
        cnt: *mut usize,
    ) -> c_int {
        // SAFETY: test fake; the caller passes a valid C string and out-pointers.
        unsafe {
            let name = std::ffi::CStr::from_ptr(name).to_str().unwrap();
            match name {
                "airlock" => {
                    let dir = tempfile::tempdir().unwrap();
                    let l = UnixListener::bind(dir.path().join("s")).unwrap();
                    let arr = libc::malloc(2 * std::mem::size_of::<c_int>()).cast::<c_int>();
                    *arr = libc::dup(l.as_raw_fd());
                    *arr.add(1) = libc::dup(l.as_raw_fd());
                    *fds = arr;
                    *cnt = 2;
                    0
                }
                "unmanaged" => libc::ESRCH,
                _ => libc::ENOENT,
            }
        }
    }

    #[test]
    fn launchd_marshalling_takes_every_fd_and_maps_errors() {
        let fds = launchd::adopt_with(fake_activate, "airlock").unwrap();
        assert_eq!(fds.len(), 2);
        assert!(getsockopt(&fds[0], sockopt::AcceptConn).unwrap());
        assert!(matches!(
            launchd::adopt_with(fake_activate, "unmanaged"),
            Err(LaunchdError::NotManaged)
        ));
        match launchd::adopt_with(fake_activate, "other") {
            Err(LaunchdError::Os(e)) => assert_eq!(e.raw_os_error(), Some(libc::ENOENT)),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn prepare_sets_nonblocking_and_cloexec_and_rejects_non_listeners() {
        let dir = tempfile::tempdir().unwrap();
        let l = UnixListener::bind(dir.path().join("s")).unwrap();
        let fd: OwnedFd = l.into();
        prepare(&fd).unwrap();
        let fl = OFlag::from_bits_retain(fcntl(&fd, FcntlArg::F_GETFL).unwrap());
        assert!(fl.contains(OFlag::O_NONBLOCK));
        let fdf = FdFlag::from_bits_retain(fcntl(&fd, FcntlArg::F_GETFD).unwrap());
        assert!(fdf.contains(FdFlag::FD_CLOEXEC));

        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let err = prepare(&OwnedFd::from(a)).unwrap_err();
        assert!(err.to_string().contains("not listening"), "{err}");
        let file = OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        assert!(prepare(&file).unwrap_err().to_string().contains("not a socket"));
    }

    #[test]
    fn no_fds_and_wrong_names_are_clear_errors() {
        assert!(matches!(
            pick_named(Vec::new(), SOCKET_NAME, Family::Unix),
            Err(ActivationError::NoSocket)
        ));
        let dir = tempfile::tempdir().unwrap();
        let l = UnixListener::bind(dir.path().join("s")).unwrap();
        let raw = std::os::fd::IntoRawFd::into_raw_fd(l);
        let err = pick_named(vec![(raw, "control".into())], SOCKET_NAME, Family::Unix).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("\"control\"") && msg.contains("FileDescriptorName=airlock"), "{msg}");
    }

    #[test]
    fn the_review_role_adopts_a_tcp_listener_and_refuses_a_unix_one() {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let raw = std::os::fd::IntoRawFd::into_raw_fd(tcp);
        assert!(pick_named(vec![(raw, "review".into())], "review", Family::Inet).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let unix = UnixListener::bind(dir.path().join("s")).unwrap();
        let raw = std::os::fd::IntoRawFd::into_raw_fd(unix);
        let err = pick_named(vec![(raw, "review".into())], "review", Family::Inet).unwrap_err();
        assert!(err.to_string().contains("not a listening TCP stream socket"), "{err}");
    }

    #[test]
    fn nofile_soft_limit_reaches_hard() {
        let n = raise_nofile().unwrap();
        let (soft, hard) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!(soft, hard);
        assert_eq!(n, hard);
    }
}
