//! Passing file descriptors over unix sockets (`SCM_RIGHTS`, unix(7)) and validating the proxy
//! listener a supervisor hands the daemon (SECURITY §4: `SO_ACCEPTCONN`, `AF_INET`/`SOCK_STREAM`,
//! bound to 127.0.0.1, a network-namespace cookie different from the daemon's own).

use std::io::{self, IoSlice, IoSliceMut};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, SockaddrIn,
    SockaddrLike, SockaddrStorage, getsockname, getsockopt, recvmsg, sendmsg, socket, sockopt,
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
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    let mut cmsg = nix::cmsg_space!([RawFd; MAX_FDS_PER_MESSAGE]);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = loop {
        match recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)
        {
            Ok(m) => break m,
            Err(nix::Error::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let n = msg.bytes;
    let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
    for c in msg.cmsgs().map_err(io::Error::from)? {
        if let ControlMessageOwned::ScmRights(raws) = c {
            for raw in raws {
                // SAFETY: the kernel installed these fds in our table for this message
                // (unix(7) SCM_RIGHTS); nothing else refers to them yet.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
    }
    if truncated {
        fds.clear(); // closes them: a sender that floods fds gets none accepted
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "too many file descriptors in one message",
        ));
    }
    Ok(n)
}

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
