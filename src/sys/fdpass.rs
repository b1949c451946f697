//! Passing file descriptors over unix sockets (`SCM_RIGHTS`, unix(7)), the fixed set of sockets
//! a sandbox hands the daemon ([`SocketKind`], [`Handover`]) and their validation (SECURITY §4,
//! docs/security.md: per kind the socket type and protocol, listening for TCP and no peer for
//! UDP, bound to exactly the kind's address, `IPV6_V6ONLY` for the IPv6 kind — for the
//! netfilter log socket, bound and in no multicast group —, a network-namespace cookie other
//! than the daemon's own).

use std::io::{self, IoSlice};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, SockaddrLike, SockaddrStorage,
    getsockname, sendmsg, socket,
};

/// At most this many fds are accepted with one message; extra ones are closed.
pub const MAX_FDS_PER_MESSAGE: usize = 8;

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

/// The sockets a sandbox makes inside its network namespace and hands to the daemon, in their
/// fixed order on the wire (SECURITY §4; the rules are written in docs/security.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SocketKind {
    /// The explicit proxy: TCP listener on 127.0.0.1:8888.
    Proxy,
    /// The resolver over UDP: a UDP socket bound to 127.0.0.53:53, no peer.
    DnsUdp,
    /// The resolver over TCP (RFC 7766): TCP listener on 127.0.0.53:53.
    DnsTcp,
    /// Transparent capture: TCP listener on 127.0.0.1:8889 that redirected traffic reaches.
    CaptureTcp,
    /// Transparent capture of IPv6: TCP listener on [::1]:8889 (`IPV6_V6ONLY`) that redirected
    /// IPv6 traffic reaches. Optional: absent when the sandbox's namespace has no IPv6.
    CaptureTcp6,
    /// UDP refusals: the netfilter log socket (`AF_NETLINK`, `NETLINK_NETFILTER`) bound to the
    /// sandbox's log group, on which every refused non-loopback datagram is reported
    /// ([`crate::sys::nflog`]).
    CaptureUdpLog,
}

/// The resolver's address inside the sandbox (the name `systemd-resolved` made familiar; any
/// 127/8 address is ours inside the netns).
pub const DNS_ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 53);
/// The explicit proxy's port inside the sandbox.
pub const PROXY_PORT: u16 = 8888;
/// The transparent-capture listener's port inside the sandbox.
pub const CAPTURE_PORT: u16 = 8889;

impl SocketKind {
    /// Every kind, in wire order.
    pub const ALL: [SocketKind; 6] = [
        SocketKind::Proxy,
        SocketKind::DnsUdp,
        SocketKind::DnsTcp,
        SocketKind::CaptureTcp,
        SocketKind::CaptureTcp6,
        SocketKind::CaptureUdpLog,
    ];

    /// The name used in `session_start`'s `sockets` list.
    pub fn name(self) -> &'static str {
        match self {
            SocketKind::Proxy => "proxy",
            SocketKind::DnsUdp => "dns_udp",
            SocketKind::DnsTcp => "dns_tcp",
            SocketKind::CaptureTcp => "capture_tcp",
            SocketKind::CaptureTcp6 => "capture_tcp6",
            SocketKind::CaptureUdpLog => "capture_udp_log",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The one address a socket of this kind must be bound to; `None` for the netlink kind
    /// ([`Self::is_netlink`]), which has no IP address.
    pub fn addr(self) -> Option<SocketAddr> {
        let v4 = |ip, port| Some(SocketAddr::V4(SocketAddrV4::new(ip, port)));
        match self {
            SocketKind::Proxy => v4(Ipv4Addr::LOCALHOST, PROXY_PORT),
            SocketKind::DnsUdp | SocketKind::DnsTcp => v4(DNS_ADDR, 53),
            SocketKind::CaptureTcp => v4(Ipv4Addr::LOCALHOST, CAPTURE_PORT),
            SocketKind::CaptureTcp6 => {
                Some(SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::LOCALHOST, CAPTURE_PORT, 0, 0)))
            }
            SocketKind::CaptureUdpLog => None,
        }
    }

    /// An `AF_INET6` socket (the others are `AF_INET`, or `AF_NETLINK` for the log socket).
    pub fn is_v6(self) -> bool {
        self.addr().is_some_and(|a| a.is_ipv6())
    }

    /// TCP (a listener) or UDP (an unconnected socket).
    pub fn is_stream(self) -> bool {
        !matches!(self, SocketKind::DnsUdp | SocketKind::CaptureUdpLog)
    }

    /// The netfilter log socket (not an `AF_INET`/`AF_INET6` socket).
    pub fn is_netlink(self) -> bool {
        self == SocketKind::CaptureUdpLog
    }
}

impl std::fmt::Display for SocketKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The sockets of one sandbox, as they travel from inside to the supervisor and on to the
/// daemon. Only `proxy` is required: a daemon that predates the `session_sockets` capability
/// receives it alone.
#[derive(Debug)]
pub struct Handover {
    pub proxy: OwnedFd,
    pub dns_udp: Option<OwnedFd>,
    pub dns_tcp: Option<OwnedFd>,
    pub capture_tcp: Option<OwnedFd>,
    pub capture_tcp6: Option<OwnedFd>,
    pub capture_udp_log: Option<OwnedFd>,
}

impl From<OwnedFd> for Handover {
    /// A proxy listener alone (what every client before `session_sockets` handed over).
    fn from(proxy: OwnedFd) -> Self {
        Self {
            proxy,
            dns_udp: None,
            dns_tcp: None,
            capture_tcp: None,
            capture_tcp6: None,
            capture_udp_log: None,
        }
    }
}

impl Handover {
    /// The sockets present, in wire order.
    pub fn borrowed(&self) -> Vec<(SocketKind, BorrowedFd<'_>)> {
        use std::os::fd::AsFd;
        let opt = [
            (SocketKind::DnsUdp, &self.dns_udp),
            (SocketKind::DnsTcp, &self.dns_tcp),
            (SocketKind::CaptureTcp, &self.capture_tcp),
            (SocketKind::CaptureTcp6, &self.capture_tcp6),
            (SocketKind::CaptureUdpLog, &self.capture_udp_log),
        ];
        let mut out = vec![(SocketKind::Proxy, self.proxy.as_fd())];
        out.extend(opt.into_iter().filter_map(|(k, fd)| Some((k, fd.as_ref()?.as_fd()))));
        out
    }

    /// Builds the set from fds named by `kinds` (same length, wire order, each kind at most
    /// once, `proxy` first). The error says which rule the list broke.
    pub fn from_named(kinds: &[SocketKind], fds: Vec<OwnedFd>) -> Result<Self, ListenerError> {
        if kinds.len() != fds.len() {
            return Err(ListenerError::Count { named: kinds.len(), passed: fds.len() });
        }
        if kinds.first() != Some(&SocketKind::Proxy) || !kinds.windows(2).all(|w| w[0] < w[1]) {
            return Err(ListenerError::Order(
                kinds.iter().map(|k| k.name()).collect::<Vec<_>>().join(","),
            ));
        }
        let mut set: Option<Self> = None;
        for (kind, fd) in kinds.iter().zip(fds) {
            match (kind, set.as_mut()) {
                (SocketKind::Proxy, None) => set = Some(Self::from(fd)),
                (SocketKind::DnsUdp, Some(s)) => s.dns_udp = Some(fd),
                (SocketKind::DnsTcp, Some(s)) => s.dns_tcp = Some(fd),
                (SocketKind::CaptureTcp, Some(s)) => s.capture_tcp = Some(fd),
                (SocketKind::CaptureTcp6, Some(s)) => s.capture_tcp6 = Some(fd),
                (SocketKind::CaptureUdpLog, Some(s)) => s.capture_udp_log = Some(fd),
                _ => unreachable!("order checked above: proxy first, each kind once"),
            }
        }
        set.ok_or(ListenerError::Count { named: 0, passed: 0 })
    }

    /// Duplicates every fd (for re-registration with the next daemon instance).
    pub fn try_clone(&self) -> io::Result<Self> {
        let dup = |fd: &Option<OwnedFd>| fd.as_ref().map(OwnedFd::try_clone).transpose();
        Ok(Self {
            proxy: self.proxy.try_clone()?,
            dns_udp: dup(&self.dns_udp)?,
            dns_tcp: dup(&self.dns_tcp)?,
            capture_tcp: dup(&self.capture_tcp)?,
            capture_tcp6: dup(&self.capture_tcp6)?,
            capture_udp_log: dup(&self.capture_udp_log)?,
        })
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ListenerError {
    #[error("the passed fd is not a socket")]
    NotASocket,
    #[error("the passed socket is not listening (SO_ACCEPTCONN is 0)")]
    NotListening,
    #[error("the passed socket is not AF_INET/SOCK_STREAM")]
    WrongKind,
    #[error("the passed {kind} socket is not {want} (it is {got})")]
    WrongType { kind: SocketKind, want: &'static str, got: String },
    #[error("the passed {kind} socket is bound to {got}, not {want}")]
    WrongAddress { kind: SocketKind, want: SocketAddr, got: String },
    #[error("the passed {kind} socket does not have IPV6_V6ONLY set; it must accept IPv6 only")]
    NotV6Only { kind: SocketKind },
    #[error(
        "the passed {kind} socket is bound to {got}; it must be bound to a kernel-assigned \
         port id and to no multicast group"
    )]
    NetlinkBinding { kind: SocketKind, got: String },
    #[error("the passed {kind} socket is connected to {peer}; it must have no peer")]
    Connected { kind: SocketKind, peer: String },
    #[error(
        "the passed listener lives in the daemon's own network namespace; it must be created \
         inside the sandbox's namespace"
    )]
    SameNamespace,
    #[error("cannot read the socket's network namespace: {0}")]
    Namespace(String),
    #[error("{passed} fds were passed but the request names {named} sockets")]
    Count { named: usize, passed: usize },
    #[error(
        "the request's sockets [{0}] are not in the fixed order proxy, dns_udp, dns_tcp, \
         capture_tcp, capture_tcp6, capture_udp_log (proxy required, each at most once)"
    )]
    Order(String),
    #[error("the request names an unknown socket kind {0:?}")]
    UnknownKind(String),
}

/// What [`validate_socket`] looks at, read from the fd by [`observe`]; a plain value so every
/// rule is unit-tested without making sockets the tests cannot make (port 53, another netns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// `SO_DOMAIN`.
    pub domain: libc::c_int,
    /// `SO_TYPE`.
    pub sock_type: libc::c_int,
    /// `SO_PROTOCOL`.
    pub protocol: libc::c_int,
    /// `SO_ACCEPTCONN`.
    pub listening: bool,
    /// `getsockname`, when it is an IPv4 or IPv6 address.
    pub local: Option<SocketAddr>,
    /// The family of `getsockname` when it is neither.
    pub other_family: Option<String>,
    /// `IPV6_V6ONLY` of an `AF_INET6` socket (`None` for other families).
    pub v6only: Option<bool>,
    /// `getsockname` of a netlink socket: (port id, multicast groups).
    pub netlink: Option<(u32, u32)>,
    /// `getpeername`, when the socket has a peer (for netlink: a destination port id or
    /// group other than 0, i.e. `connect(2)`ed).
    pub peer: Option<String>,
    /// `SO_NETNS_COOKIE` of the socket and of the daemon's own namespace.
    pub netns: u64,
    pub own_netns: u64,
}

fn int_sockopt(fd: BorrowedFd<'_>, opt: libc::c_int) -> io::Result<libc::c_int> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd` is borrowed live for the call; `v`/`len` are valid for writes of an int,
    // which is what SOL_SOCKET integer options return (socket(7)).
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut libc::c_int).cast::<libc::c_void>(),
            &mut len,
        )
    };
    if rc != 0 { Err(io::Error::last_os_error()) } else { Ok(v) }
}

/// Reads everything [`validate_socket`] judges from a passed fd.
pub fn observe(fd: BorrowedFd<'_>) -> Result<Observed, ListenerError> {
    let sock_type = int_sockopt(fd, libc::SO_TYPE).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOTSOCK) => ListenerError::NotASocket,
        _ => ListenerError::WrongKind,
    })?;
    let domain = int_sockopt(fd, libc::SO_DOMAIN).map_err(|_| ListenerError::WrongKind)?;
    let protocol = int_sockopt(fd, libc::SO_PROTOCOL).map_err(|_| ListenerError::WrongKind)?;
    let listening =
        int_sockopt(fd, libc::SO_ACCEPTCONN).map_err(|_| ListenerError::WrongKind)? != 0;
    let addr: SockaddrStorage =
        getsockname(fd.as_raw_fd()).map_err(|_| ListenerError::WrongKind)?;
    let (local, other_family) = match (addr.as_sockaddr_in(), addr.as_sockaddr_in6()) {
        (Some(sin), _) => (Some(SocketAddr::V4(SocketAddrV4::new(sin.ip(), sin.port()))), None),
        // Flow info and scope id are not compared: a ::1 listener has neither.
        (None, Some(sin6)) => {
            (Some(SocketAddr::V6(SocketAddrV6::new(sin6.ip(), sin6.port(), 0, 0))), None)
        }
        (None, None) => (None, Some(format!("{:?}", addr.family()))),
    };
    let v6only = match local {
        Some(SocketAddr::V6(_)) => Some(
            nix::sys::socket::getsockopt(&fd, nix::sys::socket::sockopt::Ipv6V6Only)
                .map_err(|_| ListenerError::WrongKind)?,
        ),
        _ => None,
    };
    let netlink = addr.as_netlink_addr().map(|nl| (nl.pid(), nl.groups()));
    // ENOTCONN is the expected answer for a listener and an unconnected UDP socket; a netlink
    // socket always answers, with port id and group 0 unless it was connected (netlink(7)).
    let peer = nix::sys::socket::getpeername::<SockaddrStorage>(fd.as_raw_fd())
        .ok()
        .filter(|p| p.as_netlink_addr().is_none_or(|nl| nl.pid() != 0 || nl.groups() != 0))
        .map(|p| match p.as_netlink_addr() {
            Some(nl) => format!("netlink port {} groups {:#x}", nl.pid(), nl.groups()),
            None => p.to_string(),
        });
    Ok(Observed {
        domain,
        sock_type,
        protocol,
        listening,
        local,
        other_family,
        v6only,
        netlink,
        peer,
        netns: netns_cookie(fd)?,
        own_netns: own_netns_cookie()?,
    })
}

/// What a handed-over socket was found bound to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// An `AF_INET` or `AF_INET6` socket's exact address.
    Inet(SocketAddr),
    /// The netfilter log socket's port id (assigned by the kernel at `bind`).
    Netlink { portid: u32 },
}

impl std::fmt::Display for Bound {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bound::Inet(a) => a.fmt(f),
            Bound::Netlink { portid } => write!(f, "netlink port {portid}"),
        }
    }
}

/// The rules for one kind (docs/security.md, "Validating the handed-over sockets"), in the
/// order the errors are reported: family, type and protocol, a network namespace other than
/// the daemon's, listening (TCP) or no peer (UDP, netlink), `IPV6_V6ONLY` (the IPv6 kind),
/// then the exact address (for the netlink kind: bound, in no multicast group).
pub fn check(kind: SocketKind, o: &Observed) -> Result<Bound, ListenerError> {
    let Some(want_addr) = kind.addr() else {
        return check_netlink(kind, o);
    };
    let (want_type, want_proto, want) = match (kind.is_stream(), kind.is_v6()) {
        (true, false) => (libc::SOCK_STREAM, libc::IPPROTO_TCP, "AF_INET/SOCK_STREAM/TCP"),
        (true, true) => (libc::SOCK_STREAM, libc::IPPROTO_TCP, "AF_INET6/SOCK_STREAM/TCP"),
        (false, _) => (libc::SOCK_DGRAM, libc::IPPROTO_UDP, "AF_INET/SOCK_DGRAM/UDP"),
    };
    let local = match o.local {
        Some(l)
            if l.is_ipv6() == kind.is_v6()
                && o.sock_type == want_type
                && o.protocol == want_proto =>
        {
            l
        }
        _ => {
            let family = o.other_family.clone().unwrap_or_else(|| {
                match o.local {
                    Some(SocketAddr::V6(_)) => "AF_INET6",
                    _ => "AF_INET",
                }
                .into()
            });
            let got = format!("{family} type {} protocol {}", o.sock_type, o.protocol);
            return Err(ListenerError::WrongType { kind, want, got });
        }
    };
    if o.netns == o.own_netns {
        return Err(ListenerError::SameNamespace);
    }
    if kind.is_stream() && !o.listening {
        return Err(ListenerError::NotListening);
    }
    if let Some(peer) = &o.peer {
        return Err(ListenerError::Connected { kind, peer: peer.clone() });
    }
    // Belt and braces: the kernel already sets IPV6_V6ONLY on a socket bound to a specific
    // address such as ::1 (net/ipv6/af_inet6.c), but a dual-stack socket must never stand in
    // for the IPv6 kind, whatever a later kernel does.
    if kind.is_v6() && o.v6only != Some(true) {
        return Err(ListenerError::NotV6Only { kind });
    }
    if local != want_addr {
        return Err(ListenerError::WrongAddress { kind, want: want_addr, got: local.to_string() });
    }
    Ok(Bound::Inet(local))
}

/// The netfilter log socket's rules: `AF_NETLINK`, `SOCK_RAW`, `NETLINK_NETFILTER`; another
/// network namespace than the daemon's; not connected; bound (port id ≠ 0) and in no
/// multicast group (netfilter logging is unicast to the bound port: a group would only add
/// other traffic).
fn check_netlink(kind: SocketKind, o: &Observed) -> Result<Bound, ListenerError> {
    if o.domain != libc::AF_NETLINK
        || o.sock_type != libc::SOCK_RAW
        || o.protocol != libc::NETLINK_NETFILTER
    {
        let family = o.other_family.clone().unwrap_or_else(|| {
            match o.local {
                Some(SocketAddr::V6(_)) => "AF_INET6",
                _ => "AF_INET",
            }
            .into()
        });
        let got = format!("{family} type {} protocol {}", o.sock_type, o.protocol);
        return Err(ListenerError::WrongType {
            kind,
            want: "AF_NETLINK/SOCK_RAW/NETLINK_NETFILTER",
            got,
        });
    }
    if o.netns == o.own_netns {
        return Err(ListenerError::SameNamespace);
    }
    if let Some(peer) = &o.peer {
        return Err(ListenerError::Connected { kind, peer: peer.clone() });
    }
    match o.netlink {
        Some((portid, 0)) if portid != 0 => Ok(Bound::Netlink { portid }),
        Some((portid, groups)) => Err(ListenerError::NetlinkBinding {
            kind,
            got: format!("port id {portid}, groups {groups:#x}"),
        }),
        None => Err(ListenerError::NetlinkBinding { kind, got: "no netlink address".into() }),
    }
}

/// Checks one handed-over socket of `kind` per SECURITY §4 and returns what it is bound to.
pub fn validate_socket(kind: SocketKind, fd: BorrowedFd<'_>) -> Result<Bound, ListenerError> {
    check(kind, &observe(fd)?)
}

/// Checks a proxy listener per SECURITY §4 and returns its local address.
pub fn validate_listener(fd: BorrowedFd<'_>) -> Result<SocketAddr, ListenerError> {
    match validate_socket(SocketKind::Proxy, fd)? {
        Bound::Inet(a) => Ok(a),
        Bound::Netlink { .. } => Err(ListenerError::WrongKind),
    }
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

    /// A socket of `kind` exactly as the sandbox makes it, seen from another namespace.
    fn good(kind: SocketKind) -> Observed {
        let Some(addr) = kind.addr() else {
            return Observed {
                domain: libc::AF_NETLINK,
                sock_type: libc::SOCK_RAW,
                protocol: libc::NETLINK_NETFILTER,
                listening: false,
                local: None,
                other_family: Some("Netlink".into()),
                v6only: None,
                netlink: Some((4242, 0)),
                peer: None,
                netns: 2,
                own_netns: 1,
            };
        };
        let (sock_type, protocol) = if kind.is_stream() {
            (libc::SOCK_STREAM, libc::IPPROTO_TCP)
        } else {
            (libc::SOCK_DGRAM, libc::IPPROTO_UDP)
        };
        Observed {
            domain: if kind.is_v6() { libc::AF_INET6 } else { libc::AF_INET },
            sock_type,
            protocol,
            listening: kind.is_stream(),
            local: Some(addr),
            other_family: None,
            v6only: kind.is_v6().then_some(true),
            netlink: None,
            peer: None,
            netns: 2,
            own_netns: 1,
        }
    }

    /// The kinds with an IP address.
    fn inet_kinds() -> impl Iterator<Item = SocketKind> {
        SocketKind::ALL.into_iter().filter(|k| !k.is_netlink())
    }

    /// The address of a kind that has one.
    fn addr_of(kind: SocketKind) -> SocketAddr {
        kind.addr().unwrap()
    }

    #[test]
    fn each_kind_as_the_sandbox_makes_it_is_accepted() {
        for kind in SocketKind::ALL {
            let want = match kind.addr() {
                Some(a) => Bound::Inet(a),
                None => Bound::Netlink { portid: 4242 },
            };
            assert_eq!(check(kind, &good(kind)), Ok(want), "{kind}");
            assert_eq!(SocketKind::from_name(kind.name()), Some(kind));
        }
        assert_eq!(addr_of(SocketKind::DnsUdp).to_string(), "127.0.0.53:53");
        assert_eq!(addr_of(SocketKind::CaptureTcp).to_string(), "127.0.0.1:8889");
        assert_eq!(addr_of(SocketKind::CaptureTcp6).to_string(), "[::1]:8889");
        assert!(SocketKind::CaptureTcp6.is_v6() && !SocketKind::CaptureTcp.is_v6());
        assert_eq!(SocketKind::CaptureUdpLog.name(), "capture_udp_log");
        assert!(!SocketKind::CaptureUdpLog.is_v6() && SocketKind::CaptureUdpLog.addr().is_none());
    }

    #[test]
    fn the_log_socket_rules_have_their_rejections() {
        use ListenerError as E;
        let kind = SocketKind::CaptureUdpLog;
        let with = |f: &dyn Fn(&mut Observed)| {
            let mut o = good(kind);
            f(&mut o);
            check(kind, &o)
        };
        // Another netlink protocol (rtnetlink), another type, another family.
        assert!(matches!(with(&|o| o.protocol = libc::NETLINK_ROUTE), Err(E::WrongType { .. })));
        assert!(matches!(with(&|o| o.sock_type = libc::SOCK_DGRAM), Err(E::WrongType { .. })));
        for other in inet_kinds() {
            assert!(matches!(check(kind, &good(other)), Err(E::WrongType { .. })), "{other}");
        }
        assert_eq!(with(&|o| o.own_netns = o.netns), Err(E::SameNamespace));
        assert!(matches!(
            with(&|o| o.peer = Some("netlink port 7 groups 0x0".into())),
            Err(E::Connected { .. })
        ));
        assert!(matches!(with(&|o| o.netlink = Some((0, 0))), Err(E::NetlinkBinding { .. })));
        assert!(matches!(with(&|o| o.netlink = Some((9, 1))), Err(E::NetlinkBinding { .. })));
        assert!(matches!(with(&|o| o.netlink = None), Err(E::NetlinkBinding { .. })));
    }

    #[test]
    fn a_real_netlink_socket_is_observed_as_it_is() {
        use nix::sys::socket::{NetlinkAddr, SockProtocol, bind};
        let fd = socket(
            AddressFamily::Netlink,
            SockType::Raw,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkNetFilter,
        )
        .unwrap();
        bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).unwrap();
        let o = observe(fd.as_fd()).unwrap();
        assert_eq!(
            (o.domain, o.sock_type, o.protocol, o.peer.as_deref()),
            (libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_NETFILTER, None)
        );
        assert!(o.netlink.is_some_and(|(pid, groups)| pid != 0 && groups == 0), "{o:?}");
        // Made in our own namespace: refused for that.
        assert_eq!(
            validate_socket(SocketKind::CaptureUdpLog, fd.as_fd()),
            Err(ListenerError::SameNamespace)
        );
        assert!(matches!(validate_listener(fd.as_fd()), Err(ListenerError::WrongType { .. })));
    }

    #[test]
    fn every_rule_has_its_rejection() {
        use ListenerError as E;
        for kind in inet_kinds() {
            let wrong_type = |f: &dyn Fn(&mut Observed)| {
                let mut o = good(kind);
                f(&mut o);
                assert!(matches!(check(kind, &o), Err(E::WrongType { .. })), "{kind}: {o:?}");
            };
            // UDP where TCP is due and the other way round.
            wrong_type(&|o| {
                o.sock_type = if kind.is_stream() { libc::SOCK_DGRAM } else { libc::SOCK_STREAM }
            });
            // Right type, other protocol (MPTCP / UDP-Lite).
            wrong_type(&|o| {
                o.protocol = if kind.is_stream() { 262 } else { libc::IPPROTO_UDPLITE }
            });
            // Not an Internet socket (AF_UNIX, AF_NETLINK).
            wrong_type(&|o| {
                o.local = None;
                o.other_family = Some("Unix".into());
            });
            // The other IP family at the same port: IPv6 for an IPv4 kind and the other way.
            wrong_type(&|o| {
                let port = addr_of(kind).port();
                o.local = Some(if kind.is_v6() {
                    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
                } else {
                    SocketAddr::from((Ipv6Addr::LOCALHOST, port))
                });
                o.v6only = (!kind.is_v6()).then_some(true);
            });
            let mut o = good(kind);
            o.peer = Some("127.0.0.1:9".into());
            assert!(matches!(check(kind, &o), Err(E::Connected { .. })), "{kind}");
            let others: &[&str] = if kind.is_v6() {
                &["::", "::2", "::ffff:127.0.0.1"]
            } else {
                &["0.0.0.0", "127.0.0.2"]
            };
            for addr in others {
                let mut o = good(kind);
                let ip: std::net::IpAddr = addr.parse().unwrap();
                o.local = Some(SocketAddr::new(ip, addr_of(kind).port()));
                assert!(matches!(check(kind, &o), Err(E::WrongAddress { .. })), "{kind} {addr}");
            }
            let mut o = good(kind);
            let mut next = addr_of(kind);
            next.set_port(next.port() + 1);
            o.local = Some(next);
            assert!(matches!(check(kind, &o), Err(E::WrongAddress { .. })), "{kind} port");
            let mut o = good(kind);
            o.own_netns = o.netns;
            assert_eq!(check(kind, &o), Err(E::SameNamespace), "{kind}");
        }
        for kind in SocketKind::ALL.into_iter().filter(|k| k.is_stream()) {
            let mut o = good(kind);
            o.listening = false;
            assert_eq!(check(kind, &o), Err(E::NotListening), "{kind}");
        }
        // A dual-stack [::1] listener (IPV6_V6ONLY 0), or one whose option was not read.
        for v6only in [Some(false), None] {
            let mut o = good(SocketKind::CaptureTcp6);
            o.v6only = v6only;
            assert_eq!(
                check(SocketKind::CaptureTcp6, &o),
                Err(E::NotV6Only { kind: SocketKind::CaptureTcp6 })
            );
        }
        // A socket of one kind does not pass as another: the addresses differ pairwise.
        for a in SocketKind::ALL {
            for b in SocketKind::ALL.into_iter().filter(|b| *b != a) {
                assert!(check(b, &good(a)).is_err(), "{a} as {b}");
            }
        }
    }

    #[test]
    fn real_sockets_are_observed_as_they_are() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let o = observe(l.as_fd()).unwrap();
        assert_eq!(
            (o.sock_type, o.protocol, o.listening),
            (libc::SOCK_STREAM, libc::IPPROTO_TCP, true)
        );
        assert_eq!(o.local, Some(l.local_addr().unwrap()));
        assert_eq!((o.peer.as_deref(), o.netns == o.own_netns, o.v6only), (None, true, None));
        // In our own namespace (and on another port): the namespace is what is reported.
        assert_eq!(validate_listener(l.as_fd()), Err(ListenerError::SameNamespace));
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let o = observe(udp.as_fd()).unwrap();
        assert_eq!(
            (o.sock_type, o.protocol, o.listening),
            (libc::SOCK_DGRAM, libc::IPPROTO_UDP, false)
        );
        assert_eq!(o.peer, None);
        udp.connect(l.local_addr().unwrap()).unwrap();
        assert!(observe(udp.as_fd()).unwrap().peer.is_some());
        let conn = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let o = observe(conn.as_fd()).unwrap();
        assert!(!o.listening && o.peer.is_some());
        let file = std::fs::File::open("/dev/null").unwrap();
        assert_eq!(validate_listener(file.as_fd()), Err(ListenerError::NotASocket));
        let (u, _) = UnixStream::pair().unwrap();
        assert!(matches!(validate_listener(u.as_fd()), Err(ListenerError::WrongType { .. })));
    }

    #[test]
    fn a_real_ipv6_listener_is_observed_with_its_v6only() {
        // Whatever was asked before bind, a socket bound to ::1 reads IPV6_V6ONLY 1: the kernel
        // sets it when binding a specific, non-mapped address (net/ipv6/af_inet6.c).
        use nix::sys::socket::{
            Backlog, SockaddrIn6, bind, listen, setsockopt, socket as mk, sockopt,
        };
        for v6only in [true, false] {
            let fd =
                mk(AddressFamily::Inet6, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).unwrap();
            setsockopt(&fd, sockopt::Ipv6V6Only, &v6only).unwrap();
            let any = SocketAddrV6::new(Ipv6Addr::LOCALHOST, 0, 0, 0);
            bind(fd.as_raw_fd(), &SockaddrIn6::from(any)).unwrap();
            listen(&fd, Backlog::new(8).unwrap()).unwrap();
            let o = observe(fd.as_fd()).unwrap();
            assert_eq!(o.v6only, Some(true), "asked for {v6only}");
            assert_eq!(
                check(SocketKind::CaptureTcp6, &o).unwrap_err(),
                ListenerError::SameNamespace,
                "everything but the namespace passes"
            );
            assert!(matches!(o.local, Some(SocketAddr::V6(a)) if *a.ip() == Ipv6Addr::LOCALHOST));
            assert!(o.listening && o.other_family.is_none());
        }
    }

    #[test]
    fn the_named_list_must_match_the_fds_and_the_fixed_order() {
        let fd = || OwnedFd::from(std::fs::File::open("/dev/null").unwrap());
        use SocketKind::*;
        let n = SocketKind::ALL.len();
        let all = Handover::from_named(&SocketKind::ALL, (0..n).map(|_| fd()).collect()).unwrap();
        assert_eq!(all.borrowed().iter().map(|(k, _)| *k).collect::<Vec<_>>(), SocketKind::ALL);
        let some = Handover::from_named(&[Proxy, DnsTcp], vec![fd(), fd()]).unwrap();
        assert!(some.dns_udp.is_none() && some.dns_tcp.is_some() && some.capture_tcp.is_none());
        // The IPv6 capture listener is optional (a namespace without IPv6 has none).
        let v4 = Handover::from_named(
            &[Proxy, DnsUdp, DnsTcp, CaptureTcp],
            vec![fd(), fd(), fd(), fd()],
        )
        .unwrap();
        assert!(v4.capture_tcp.is_some() && v4.capture_tcp6.is_none());
        assert_eq!(v4.borrowed().len(), 4);
        // The log socket comes after the IPv6 listener, and either may be absent.
        let nov6 =
            Handover::from_named(&[Proxy, CaptureTcp, CaptureUdpLog], vec![fd(), fd(), fd()])
                .unwrap();
        assert!(nov6.capture_tcp6.is_none() && nov6.capture_udp_log.is_some());
        assert!(matches!(
            Handover::from_named(&[Proxy, CaptureUdpLog, CaptureTcp6], vec![fd(), fd(), fd()]),
            Err(ListenerError::Order(_))
        ));
        assert!(matches!(
            Handover::from_named(&[Proxy, DnsUdp], vec![fd()]),
            Err(ListenerError::Count { named: 2, passed: 1 })
        ));
        for bad in [&[DnsUdp, Proxy][..], &[Proxy, Proxy], &[DnsUdp], &[]] {
            let fds = bad.iter().map(|_| fd()).collect();
            assert!(
                matches!(Handover::from_named(bad, fds), Err(ListenerError::Order(_))),
                "{bad:?}"
            );
        }
    }
}
