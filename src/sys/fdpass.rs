//! Passing file descriptors over unix sockets (`SCM_RIGHTS`, unix(7)) and validating the proxy
//! listener a supervisor hands the daemon (SECURITY §4: `SO_ACCEPTCONN`, `AF_INET`/`SOCK_STREAM`,
//! bound to 127.0.0.1, a network-namespace cookie different from the daemon's own).

use std::io::{self, IoSlice};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, SockaddrIn, SockaddrLike,
    SockaddrStorage, getsockname, getsockopt, sendmsg, socket, sockopt,
};

/// At most this many fds are accepted with one message; extra ones are closed.
pub const MAX_FDS_PER_MESSAGE: usize = 4;

/// `SO_NETNS_COOKIE` (Linux 5.14, `include/uapi/asm-generic/socket.h`); not in libc yet for
/// every target.
#[cfg(target_os = "linux")]
const SO_NETNS_COOKIE: libc::c_int = 71;

/// Sends `bytes` with `fds` attached to the first byte (one `sendmsg(2)`). Returns how many
/// bytes were sent; the caller writes the rest without fds.
pub fn send_with_fds(
    sock: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsg };
    loop {
        match sendmsg::<()>(
            sock.as_raw_fd(),
            &[IoSlice::new(bytes)],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) => return Ok(n),
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives bytes into `buf`, appending any passed fds (made CLOEXEC) to `fds`. Returns the
/// byte count (0 = EOF). Non-blocking sockets return `WouldBlock` as usual.
///
/// A message whose control data did not fit (`MSG_CTRUNC`: more than [`MAX_FDS_PER_MESSAGE`]
/// fds) is an `InvalidData` error, and every fd of `fds` is closed — including those the kernel
/// did install before truncating (unix(7)), which is why this walks the control buffer itself
/// (`nix`'s iterator refuses a truncated buffer and would leave them open).
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    // `u64` words: the buffer must be aligned for `cmsghdr` (cmsg(3)).
    let mut control = [0u64; CONTROL_WORDS];
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    // SAFETY: an all-zero msghdr is a valid value (null pointers, zero lengths).
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    let n = loop {
        // SAFETY: `msg` points at `iov` (valid for `buf.len()` bytes of writes) and at `control`
        // (valid for `msg_controllen` bytes); both outlive the call.
        let ret = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if let Ok(n) = usize::try_from(ret) {
            break n;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    // SAFETY: the kernel set `msg_controllen` to the bytes of complete headers it wrote into
    // `control`, so CMSG_FIRSTHDR/CMSG_NXTHDR stay inside it (cmsg(3)); null ends the walk.
    let mut cmsg = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    while !cmsg.is_null() {
        // SAFETY: `cmsg` points at a complete, aligned header inside `control` (see above).
        let hdr = unsafe { std::ptr::read(cmsg) };
        if hdr.cmsg_level == libc::SOL_SOCKET && hdr.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: CMSG_DATA of a header inside the buffer points inside it too.
            let data = unsafe { libc::CMSG_DATA(cmsg) };
            let header_len = data as usize - cmsg as usize;
            let count = (hdr.cmsg_len as usize).saturating_sub(header_len) / size_of::<RawFd>();
            for i in 0..count {
                // SAFETY: the `count` fds lie within `cmsg_len` of this header, inside the
                // buffer; read unaligned because CMSG_DATA only promises header alignment.
                let raw = unsafe { std::ptr::read_unaligned(data.cast::<RawFd>().add(i)) };
                // SAFETY: the kernel installed these fds in our table for this message
                // (unix(7) SCM_RIGHTS); nothing else refers to them yet.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
        // SAFETY: as for CMSG_FIRSTHDR: bounded by `msg_controllen`.
        cmsg = unsafe { libc::CMSG_NXTHDR(&msg, cmsg) };
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        fds.clear(); // closes them: a sender that floods fds gets none accepted
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "too many file descriptors in one message (at most {MAX_FDS_PER_MESSAGE} are \
                 accepted)"
            ),
        ));
    }
    Ok(n)
}

/// `u64` words of control buffer: one `SCM_RIGHTS` header and [`MAX_FDS_PER_MESSAGE`] fds
/// (CMSG_SPACE; `cmsghdr` is a multiple of 8 bytes, the fds are rounded up to one).
const CONTROL_WORDS: usize =
    (std::mem::size_of::<libc::cmsghdr>() + MAX_FDS_PER_MESSAGE * size_of::<RawFd>()).div_ceil(8);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ListenerError {
    #[error("the passed fd is not a socket")]
    NotASocket,
    #[error("the passed socket is not listening (SO_ACCEPTCONN is 0)")]
    NotListening,
    #[error("the passed socket is not AF_INET/SOCK_STREAM")]
    WrongKind,
    #[error("the passed listener is bound to {0}, not 127.0.0.1")]
    NotLoopback(String),
    #[error(
        "the passed listener lives in the daemon's own network namespace; it must be created \
         inside the sandbox's namespace"
    )]
    SameNamespace,
    #[error("cannot read the socket's network namespace: {0}")]
    Namespace(String),
}

/// Checks a proxy listener per SECURITY §4 and returns its local address.
pub fn validate_listener(fd: BorrowedFd<'_>) -> Result<SocketAddrV4, ListenerError> {
    let listening = getsockopt(&fd, sockopt::AcceptConn).map_err(|e| match e {
        nix::Error::ENOTSOCK => ListenerError::NotASocket,
        _ => ListenerError::NotListening,
    })?;
    if !listening {
        return Err(ListenerError::NotListening);
    }
    let ty = getsockopt(&fd, sockopt::SockType).map_err(|_| ListenerError::WrongKind)?;
    let addr: SockaddrStorage =
        getsockname(fd.as_raw_fd()).map_err(|_| ListenerError::WrongKind)?;
    if ty != SockType::Stream || addr.family() != Some(AddressFamily::Inet) {
        return Err(ListenerError::WrongKind);
    }
    let sin: &SockaddrIn = addr.as_sockaddr_in().ok_or(ListenerError::WrongKind)?;
    let local = SocketAddrV4::new(sin.ip(), sin.port());
    if *local.ip() != Ipv4Addr::LOCALHOST {
        return Err(ListenerError::NotLoopback(local.to_string()));
    }
    let theirs = netns_cookie(fd)?;
    let ours = own_netns_cookie()?;
    if theirs == ours {
        return Err(ListenerError::SameNamespace);
    }
    Ok(local)
}

/// The network-namespace cookie of the namespace the daemon itself runs in.
pub fn own_netns_cookie() -> Result<u64, ListenerError> {
    let probe = socket(AddressFamily::Inet, SockType::Datagram, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|e| ListenerError::Namespace(e.to_string()))?;
    use std::os::fd::AsFd;
    netns_cookie(probe.as_fd())
}

/// `getsockopt(SO_NETNS_COOKIE)`: a 64-bit id unique per network namespace for the boot.
#[cfg(target_os = "linux")]
pub fn netns_cookie(fd: BorrowedFd<'_>) -> Result<u64, ListenerError> {
    let mut cookie: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `fd` is a live socket borrowed for the call; `cookie`/`len` are valid for writes
    // of `len` bytes (socket(7) SO_NETNS_COOKIE returns a u64).
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            (&mut cookie as *mut u64).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if rc != 0 {
        let err = io::Error::last_os_error();
        return Err(ListenerError::Namespace(format!(
            "SO_NETNS_COOKIE: {err} (needs Linux 5.14 or later)"
        )));
    }
    Ok(cookie)
}

#[cfg(not(target_os = "linux"))]
pub fn netns_cookie(_fd: BorrowedFd<'_>) -> Result<u64, ListenerError> {
    Err(ListenerError::Namespace("network namespaces exist only on Linux".into()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn fds_travel_with_the_first_byte() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let n = send_with_fds(a.as_fd(), b"hello", &[file.as_fd()]).unwrap();
        assert_eq!(n, 5);
        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        let got = recv_with_fds(b.as_fd(), &mut buf, &mut fds).unwrap();
        assert_eq!(&buf[..got], b"hello");
        assert_eq!(fds.len(), 1);
        let meta = std::fs::File::from(fds.pop().unwrap()).metadata().unwrap();
        assert_eq!(meta.len(), 0);
        drop(a);
        assert_eq!(recv_with_fds(b.as_fd(), &mut buf, &mut fds).unwrap(), 0);
    }

    #[test]
    fn listeners_in_our_own_namespace_or_off_loopback_are_refused() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        assert_eq!(validate_listener(l.as_fd()), Err(ListenerError::SameNamespace));
        let any = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
        assert!(matches!(validate_listener(any.as_fd()), Err(ListenerError::NotLoopback(_))));
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(validate_listener(udp.as_fd()).is_err());
        let conn = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        assert_eq!(validate_listener(conn.as_fd()), Err(ListenerError::NotListening));
        let file = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(validate_listener(file.as_fd()), Err(ListenerError::NotASocket));
        let (u, _) = UnixStream::pair().unwrap();
        assert!(validate_listener(u.as_fd()).is_err());
    }
}
