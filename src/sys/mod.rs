//! The only place with `unsafe`: socket activation, fd passing, fork/exec and sandbox setup.
//! Every block carries a `// SAFETY:` comment.

pub mod activation;
pub mod exec;
pub mod fdpass;
pub mod namespaces;
pub mod spawn;
pub mod splice;
/// Adopts the socket-activation fd named `name` (systemd `LISTEN_FDNAMES`) as a TCP listener.
/// Returns `Ok(None)` when no fd of that name was passed. Call before any thread exists.
/// (Added for the review role; the DAEMON helper's activation code may replace it.)
pub fn adopt_named_tcp_listener(name: &str) -> std::io::Result<Option<std::net::TcpListener>> {
    use std::os::fd::FromRawFd;
    if std::env::var_os("LISTEN_FDS").is_none() {
        return Ok(None);
    }
    let fds: Vec<(std::os::fd::RawFd, String)> = sd_notify::listen_fds_with_names()?.collect();
    let Some((fd, _)) = fds.into_iter().find(|(_, n)| n == name) else {
        return Ok(None);
    };
    // Validate before taking ownership: it must be a listening stream socket.
    let mut ty: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `ty`/`len` are valid for writes of the sizes given; getsockopt only reads `fd`.
    let rc = unsafe {
        libc::getsockopt(fd, libc::SOL_SOCKET, libc::SO_TYPE, (&raw mut ty).cast(), &raw mut len)
    };
    if rc != 0 || ty != libc::SOCK_STREAM {
        return Err(std::io::Error::other(format!(
            "activation fd {fd} ({name}) is not a stream socket"
        )));
    }
    // SAFETY: the service manager passed us this fd for our exclusive use (sd_listen_fds(3));
    // sd-notify has set CLOEXEC and nothing else in the process owns it.
    Ok(Some(unsafe { std::net::TcpListener::from_raw_fd(fd) }))
}
