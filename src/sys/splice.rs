//! Thin wrappers over Linux `splice(2)` and `pipe2(2)` for the proxy's zero-copy tunnel
//! (`src/proxy/splice.rs`). Everything here is non-blocking and fd-based; readiness is the
//! caller's business (tokio's `try_io`).

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A pipe used as the in-kernel buffer between two sockets: `(read end, write end)`, both
/// `O_NONBLOCK | O_CLOEXEC`.
pub fn nonblocking_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1 as libc::c_int; 2];
    // SAFETY: `fds` is a valid, writable array of two c_ints as pipe2(2) requires.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both fds are open and owned by nobody else.
    let pair = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok(pair)
}

/// Asks the kernel for a pipe of `bytes` capacity (`F_SETPIPE_SZ`, fcntl(2)); returns the size
/// granted. Failure is harmless: the pipe keeps its default 64 KiB.
pub fn set_pipe_size(fd: BorrowedFd<'_>, bytes: usize) -> io::Result<usize> {
    let want = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: F_SETPIPE_SZ takes an int argument and only affects the pipe behind `fd`, which
    // the borrow keeps open for the call.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, want) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(rc).unwrap_or(0))
}

/// One `splice(2)` call moving up to `len` bytes from `from` to `to` (one of them a pipe), with
/// `SPLICE_F_MOVE | SPLICE_F_NONBLOCK`. `Ok(0)` means end of input.
pub fn splice(from: BorrowedFd<'_>, to: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    // SAFETY: both fds are kept open by their borrows; null offsets are what splice(2)
    // requires for pipes and sockets; no memory of ours is touched.
    let rc = unsafe {
        libc::splice(
            from.as_raw_fd(),
            std::ptr::null_mut(),
            to.as_raw_fd(),
            std::ptr::null_mut(),
            len,
            libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(usize::try_from(rc).unwrap_or(0))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn moves_bytes_socket_to_pipe_to_socket() {
        let (mut a, b) = UnixStream::pair().unwrap();
        let (c, mut d) = UnixStream::pair().unwrap();
        let (r, w) = nonblocking_pipe().unwrap();
        let _ = set_pipe_size(w.as_fd(), 1 << 20);
        a.write_all(b"hello splice").unwrap();
        let n = splice(b.as_fd(), w.as_fd(), 1 << 16).unwrap();
        assert_eq!(n, 12);
        assert_eq!(splice(r.as_fd(), c.as_fd(), n).unwrap(), 12);
        let mut buf = [0u8; 12];
        d.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"hello splice");
        drop(a);
        assert_eq!(splice(b.as_fd(), w.as_fd(), 1 << 16).unwrap(), 0);
    }
}
