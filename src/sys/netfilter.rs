//! Transparent TCP capture inside the sandbox's network namespace, set up through netlink
//! (no `nft` or `ip` binary needed): the equivalent of
//!
//! ```text
//! ip route add local default dev lo table local
//! nft add table inet airlock
//! nft add chain inet airlock capture '{ type nat hook output priority -100; }'
//! nft add rule inet airlock capture ip daddr != 127.0.0.0/8 tcp dport 1-65535 redirect to :PORT
//! ```
//!
//! The route makes every IPv4 destination local (so `connect(2)` to any address gets a route
//! instead of `ENETUNREACH`, and nothing can leave through a device — there is only `lo`); the
//! rule rewrites the destination of each new outgoing TCP connection to `127.0.0.1:PORT`, where
//! the capture listener waits, and conntrack keeps the original for `SO_ORIGINAL_DST`
//! ([`original_dst`]).
//!
//! Message layouts: rtnetlink(7), `include/uapi/linux/rtnetlink.h`; nfnetlink batches and
//! nf_tables attributes: `include/uapi/linux/netfilter/nfnetlink.h` and `nf_tables.h`. The
//! expressions are the ones `nft --debug=netlink` prints for the rule above (the /8 compares
//! one byte of the destination; `dport 1-65535` is `dport != 0`).
//!
//! Everything here uses nix's safe socket calls: no `unsafe`.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, getsockopt, recv,
    send, setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;

/// Name of the nftables table (family `inet`) and its chain.
pub const TABLE: &str = "airlock";
pub const CHAIN: &str = "capture";

/// Why the capture could not be put in place.
#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error("{what}: {source}")]
    Io { what: &'static str, source: io::Error },
    /// The kernel refused a message (its errno).
    #[error("{what}: the kernel refused it: {errno}{hint}")]
    Refused { what: &'static str, errno: nix::errno::Errno, hint: &'static str },
}

impl CaptureError {
    fn io(what: &'static str, e: impl Into<io::Error>) -> Self {
        Self::Io { what, source: e.into() }
    }
}

// --- netlink framing (netlink(7)) ---------------------------------------------------------

pub(super) const NLMSG_HDRLEN: usize = 16;
pub(super) const NLMSG_ERROR: u16 = 2;
pub(super) const NLM_F_REQUEST: u16 = 0x1;
pub(super) const NLM_F_ACK: u16 = 0x4;
pub(super) const NLM_F_EXCL: u16 = 0x200;
pub(super) const NLM_F_CREATE: u16 = 0x400;
pub(super) const NLM_F_APPEND: u16 = 0x800;
pub(super) const NLA_F_NESTED: u16 = 0x8000;

/// A netlink message buffer: headers and attributes in host order unless noted, each
/// attribute padded to 4 bytes (NLA_ALIGN).
#[derive(Default)]
pub(super) struct Msg {
    pub(super) buf: Vec<u8>,
    /// Start of the current message's header.
    start: usize,
}

impl Msg {
    pub(super) fn begin(&mut self, ty: u16, flags: u16, seq: u32) {
        self.start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // length, patched in `end`
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(&flags.to_ne_bytes());
        self.buf.extend_from_slice(&seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel fills it
    }
    pub(super) fn end(&mut self) {
        let len = (self.buf.len() - self.start) as u32;
        self.buf[self.start..self.start + 4].copy_from_slice(&len.to_ne_bytes());
    }
    pub(super) fn raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        self.pad();
    }
    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }
    pub(super) fn attr(&mut self, ty: u16, payload: &[u8]) {
        let len = (4 + payload.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.raw(payload);
    }
    pub(super) fn str(&mut self, ty: u16, s: &str) {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.attr(ty, &v);
    }
    /// nf_tables numbers are big-endian (`ntohl` in the kernel).
    pub(super) fn be32(&mut self, ty: u16, v: u32) {
        self.attr(ty, &v.to_be_bytes());
    }
    pub(super) fn nest(&mut self, ty: u16, f: impl FnOnce(&mut Self)) {
        let at = self.buf.len();
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
        f(self);
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }
}

/// Sends `msg` (holding `expect` messages that ask for an ACK, sequence numbers `first..`)
/// and reads until each is acknowledged; the first error wins.
pub(super) fn transact(
    proto: SockProtocol,
    msg: &Msg,
    first: u32,
    expect: u32,
    what: &'static str,
    hint: &'static str,
) -> Result<(), CaptureError> {
    let fd: OwnedFd = socket(AddressFamily::Netlink, SockType::Raw, SockFlag::SOCK_CLOEXEC, proto)
        .map_err(|e| CaptureError::io("opening a netlink socket", e))?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0))
        .map_err(|e| CaptureError::io("binding a netlink socket", e))?;
    transact_on(&fd, msg, first, expect, what, hint)
}

/// [`transact`] on a socket the caller made and bound (the NFLOG socket, whose port id the
/// kernel binds the log group to: `sys::nflog`).
pub(super) fn transact_on(
    fd: &OwnedFd,
    msg: &Msg,
    first: u32,
    expect: u32,
    what: &'static str,
    hint: &'static str,
) -> Result<(), CaptureError> {
    // The kernel answers a batch while handling our send (nfnetlink_rcv_batch runs in
    // sendmsg): a missing answer is a bug, not a slow kernel — do not hang on it.
    setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(5, 0))
        .map_err(|e| CaptureError::io("SO_RCVTIMEO on a netlink socket", e))?;
    send(fd.as_raw_fd(), &msg.buf, MsgFlags::empty()).map_err(|e| CaptureError::io(what, e))?;
    let mut acked = 0u32;
    let mut buf = vec![0u8; 64 * 1024];
    while acked < expect {
        let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty())
            .map_err(|e| CaptureError::io(what, e))?;
        let mut off = 0;
        while off + NLMSG_HDRLEN <= n {
            let len = u32::from_ne_bytes(word(&buf, off)) as usize;
            let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
            let seq = u32::from_ne_bytes(word(&buf, off + 8));
            if len < NLMSG_HDRLEN || off + len > n {
                break;
            }
            if ty == NLMSG_ERROR && len >= NLMSG_HDRLEN + 4 {
                let code = i32::from_ne_bytes(word(&buf, off + NLMSG_HDRLEN));
                if code != 0 {
                    let errno = nix::errno::Errno::from_raw(-code);
                    return Err(CaptureError::Refused { what, errno, hint });
                }
                if seq >= first && seq < first + expect {
                    acked += 1;
                }
            }
            off += len.next_multiple_of(4);
        }
    }
    Ok(())
}

pub(super) fn word(buf: &[u8], at: usize) -> [u8; 4] {
    [buf[at], buf[at + 1], buf[at + 2], buf[at + 3]]
}

// --- the route ------------------------------------------------------------------------------

const RTM_NEWROUTE: u16 = 24;
const RT_TABLE_LOCAL: u8 = 255;
const RTPROT_BOOT: u8 = 3;
const RT_SCOPE_HOST: u8 = 254;
const RTN_LOCAL: u8 = 2;
const RTA_OIF: u16 = 4;
const RTA_TABLE: u16 = 15;

/// `ip route add local default dev lo table local` as one RTM_NEWROUTE.
fn route_message(lo_index: u32) -> Msg {
    let mut m = Msg::default();
    m.begin(RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, 1);
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type; u32 flags.
    m.raw(&[
        libc::AF_INET as u8,
        0,
        0,
        0,
        RT_TABLE_LOCAL,
        RTPROT_BOOT,
        RT_SCOPE_HOST,
        RTN_LOCAL,
        0,
        0,
        0,
        0,
    ]);
    m.attr(RTA_TABLE, &u32::from(RT_TABLE_LOCAL).to_ne_bytes());
    m.attr(RTA_OIF, &lo_index.to_ne_bytes());
    m.end();
    m
}

// --- the nf_tables batch --------------------------------------------------------------------

pub(super) const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub(super) const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub(super) const NFNL_MSG_BATCH_END: u16 = 0x11;
const NFT_MSG_NEWTABLE: u16 = 0;
pub(super) const NFT_MSG_NEWCHAIN: u16 = 3;
pub(super) const NFT_MSG_NEWRULE: u16 = 6;
pub(super) const NFPROTO_UNSPEC: u8 = 0;
pub(super) const NFPROTO_INET: u8 = 1;
pub(super) const NFPROTO_IPV4: u8 = 2;

const NFTA_TABLE_NAME: u16 = 1;
pub(super) const NFTA_CHAIN_TABLE: u16 = 1;
pub(super) const NFTA_CHAIN_NAME: u16 = 3;
pub(super) const NFTA_CHAIN_HOOK: u16 = 4;
pub(super) const NFTA_CHAIN_TYPE: u16 = 7;
pub(super) const NFTA_HOOK_HOOKNUM: u16 = 1;
pub(super) const NFTA_HOOK_PRIORITY: u16 = 2;
pub(super) const NF_INET_LOCAL_OUT: u32 = 3;
/// `NF_IP_PRI_NAT_DST` (-100): destination NAT for locally generated packets.
const PRIORITY_DSTNAT: i32 = -100;

pub(super) const NFTA_RULE_TABLE: u16 = 1;
pub(super) const NFTA_RULE_CHAIN: u16 = 2;
pub(super) const NFTA_RULE_EXPRESSIONS: u16 = 4;
const NFTA_LIST_ELEM: u16 = 1;
const NFTA_EXPR_NAME: u16 = 1;
const NFTA_EXPR_DATA: u16 = 2;
const NFTA_DATA_VALUE: u16 = 1;

const NFT_REG_1: u32 = 1;
const NFTA_META_DREG: u16 = 1;
const NFTA_META_KEY: u16 = 2;
pub(super) const NFT_META_NFPROTO: u32 = 15;
pub(super) const NFT_META_L4PROTO: u32 = 16;
const NFTA_CMP_SREG: u16 = 1;
const NFTA_CMP_OP: u16 = 2;
const NFTA_CMP_DATA: u16 = 3;
pub(super) const NFT_CMP_EQ: u32 = 0;
pub(super) const NFT_CMP_NEQ: u32 = 1;
const NFTA_PAYLOAD_DREG: u16 = 1;
const NFTA_PAYLOAD_BASE: u16 = 2;
const NFTA_PAYLOAD_OFFSET: u16 = 3;
const NFTA_PAYLOAD_LEN: u16 = 4;
pub(super) const NFT_PAYLOAD_NETWORK_HEADER: u32 = 1;
const NFT_PAYLOAD_TRANSPORT_HEADER: u32 = 2;
const NFTA_IMMEDIATE_DREG: u16 = 1;
const NFTA_IMMEDIATE_DATA: u16 = 2;
const NFTA_REDIR_REG_PROTO_MIN: u16 = 1;

pub(super) fn nft_begin(m: &mut Msg, msg: u16, flags: u16, seq: u32, family: u8) {
    m.begin((NFNL_SUBSYS_NFTABLES << 8) | msg, flags, seq);
    // struct nfgenmsg: family, version (NFNETLINK_V0), res_id (big-endian).
    m.raw(&[family, 0, 0, 0]);
}

pub(super) fn expr(m: &mut Msg, name: &str, data: impl FnOnce(&mut Msg)) {
    m.nest(NFTA_LIST_ELEM, |m| {
        m.str(NFTA_EXPR_NAME, name);
        m.nest(NFTA_EXPR_DATA, data);
    });
}

pub(super) fn meta(m: &mut Msg, key: u32) {
    expr(m, "meta", |m| {
        m.be32(NFTA_META_KEY, key);
        m.be32(NFTA_META_DREG, NFT_REG_1);
    });
}

pub(super) fn cmp(m: &mut Msg, op: u32, value: &[u8]) {
    expr(m, "cmp", |m| {
        m.be32(NFTA_CMP_SREG, NFT_REG_1);
        m.be32(NFTA_CMP_OP, op);
        m.nest(NFTA_CMP_DATA, |m| m.attr(NFTA_DATA_VALUE, value));
    });
}

pub(super) fn payload(m: &mut Msg, base: u32, offset: u32, len: u32) {
    expr(m, "payload", |m| {
        m.be32(NFTA_PAYLOAD_DREG, NFT_REG_1);
        m.be32(NFTA_PAYLOAD_BASE, base);
        m.be32(NFTA_PAYLOAD_OFFSET, offset);
        m.be32(NFTA_PAYLOAD_LEN, len);
    });
}

/// The batch: table, chain, rule; returns it with the number of messages that ask for an ACK.
fn nft_batch(port: u16) -> (Msg, u32) {
    let mut m = Msg::default();
    let mut seq = 1;
    // The batch header's res_id names the subsystem (big-endian), nfnetlink.c.
    m.begin(NFNL_MSG_BATCH_BEGIN, NLM_F_REQUEST, seq);
    m.raw(&[NFPROTO_UNSPEC, 0, (NFNL_SUBSYS_NFTABLES >> 8) as u8, NFNL_SUBSYS_NFTABLES as u8]);
    m.end();

    seq += 1;
    let create = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE;
    nft_begin(&mut m, NFT_MSG_NEWTABLE, create | NLM_F_EXCL, seq, NFPROTO_INET);
    m.str(NFTA_TABLE_NAME, TABLE);
    m.end();

    seq += 1;
    nft_begin(&mut m, NFT_MSG_NEWCHAIN, create | NLM_F_EXCL, seq, NFPROTO_INET);
    m.str(NFTA_CHAIN_TABLE, TABLE);
    m.str(NFTA_CHAIN_NAME, CHAIN);
    m.nest(NFTA_CHAIN_HOOK, |m| {
        m.be32(NFTA_HOOK_HOOKNUM, NF_INET_LOCAL_OUT);
        m.attr(NFTA_HOOK_PRIORITY, &PRIORITY_DSTNAT.to_be_bytes());
    });
    m.str(NFTA_CHAIN_TYPE, "nat");
    m.end();

    seq += 1;
    nft_begin(&mut m, NFT_MSG_NEWRULE, create | NLM_F_APPEND, seq, NFPROTO_INET);
    m.str(NFTA_RULE_TABLE, TABLE);
    m.str(NFTA_RULE_CHAIN, CHAIN);
    m.nest(NFTA_RULE_EXPRESSIONS, |m| {
        // meta nfproto ipv4
        meta(m, NFT_META_NFPROTO);
        cmp(m, NFT_CMP_EQ, &[NFPROTO_IPV4]);
        // ip daddr != 127.0.0.0/8: the first byte of the destination (iphdr offset 16)
        payload(m, NFT_PAYLOAD_NETWORK_HEADER, 16, 1);
        cmp(m, NFT_CMP_NEQ, &[127]);
        // meta l4proto tcp
        meta(m, NFT_META_L4PROTO);
        cmp(m, NFT_CMP_EQ, &[libc::IPPROTO_TCP as u8]);
        // tcp dport 1-65535 (tcphdr offset 2)
        payload(m, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
        cmp(m, NFT_CMP_NEQ, &[0, 0]);
        // redirect to :port
        expr(m, "immediate", |m| {
            m.be32(NFTA_IMMEDIATE_DREG, NFT_REG_1);
            m.nest(NFTA_IMMEDIATE_DATA, |m| m.attr(NFTA_DATA_VALUE, &port.to_be_bytes()));
        });
        expr(m, "redir", |m| m.be32(NFTA_REDIR_REG_PROTO_MIN, NFT_REG_1));
    });
    m.end();

    seq += 1;
    m.begin(NFNL_MSG_BATCH_END, NLM_F_REQUEST, seq);
    m.raw(&[NFPROTO_UNSPEC, 0, (NFNL_SUBSYS_NFTABLES >> 8) as u8, NFNL_SUBSYS_NFTABLES as u8]);
    m.end();
    (m, 3)
}

/// Hint for an nf_tables refusal: which kernel piece is missing.
const NFT_HINT: &str = " (transparent capture needs nf_tables with the nat chain type and \
the redir expression: CONFIG_NF_TABLES, CONFIG_NFT_NAT, CONFIG_NFT_REDIR, CONFIG_NF_TABLES_INET; \
see `airlock doctor`)";
const ROUTE_HINT: &str = " (the sandbox could not route every IPv4 address to its loopback; \
see `airlock doctor`)";

/// Puts the capture in place in the **current** network namespace: the local default route and
/// the redirect of every non-loopback IPv4 TCP connection to `127.0.0.1:port`. Needs
/// CAP_NET_ADMIN over that namespace (the sandbox's own user namespace gives it).
pub fn install_capture(port: u16) -> Result<(), CaptureError> {
    let lo = nix::net::if_::if_nametoindex("lo")
        .map_err(|e| CaptureError::io("finding the loopback device", e))?;
    transact(
        SockProtocol::NetlinkRoute,
        &route_message(lo),
        1,
        1,
        "adding the local default route",
        ROUTE_HINT,
    )?;
    let (batch, expect) = nft_batch(port);
    transact(
        SockProtocol::NetlinkNetFilter,
        &batch,
        2,
        expect,
        "adding the nftables capture rule",
        NFT_HINT,
    )
}

/// The destination a redirected connection was made to (`SO_ORIGINAL_DST`, from conntrack;
/// `IP6T_SO_ORIGINAL_DST` for IPv6). `None` when the connection was not redirected (made
/// straight to the capture listener's own address): conntrack then reports the listener's own
/// address back (a tracked connection without NAT) or, untracked, ENOENT.
pub fn original_dst(sock: &impl AsFd, v6: bool) -> io::Result<Option<SocketAddr>> {
    let res = if v6 {
        getsockopt(sock, sockopt::Ip6tOriginalDst).map(|sa| {
            let ip = std::net::Ipv6Addr::from(sa.sin6_addr.s6_addr);
            SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(sa.sin6_port), 0, 0))
        })
    } else {
        getsockopt(sock, sockopt::OriginalDst).map(|sa| {
            let ip = Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr));
            SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sa.sin_port)))
        })
    };
    let local: Option<SocketAddr> = nix::sys::socket::getsockname::<
        nix::sys::socket::SockaddrStorage,
    >(sock.as_fd().as_raw_fd())
    .ok()
    .and_then(|s| {
        s.as_sockaddr_in().map(|a| SocketAddr::V4(SocketAddrV4::new(a.ip(), a.port()))).or_else(
            || {
                s.as_sockaddr_in6()
                    .map(|a| SocketAddr::V6(SocketAddrV6::new(a.ip(), a.port(), 0, 0)))
            },
        )
    });
    match res {
        Ok(sa) if Some(sa) == local => Ok(None),
        Ok(sa) => Ok(Some(sa)),
        Err(nix::errno::Errno::ENOENT) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Test support: runs the ignored test `name` of this test binary again inside `unshare -Urn`
/// (a fresh user and network namespace, where the capture can be installed without touching
/// the host) with `AIRLOCK_NETFILTER_INNER` set, and fails unless it passed there.
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) fn run_in_fresh_netns(name: &str) {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new("unshare")
        .arg("-Urn")
        .arg(exe)
        .args(["--exact", name, "--ignored", "--nocapture", "--test-threads=1"])
        .env(INNER_VAR, "1")
        .output()
        .unwrap();
    let text =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
}

/// Set in the inner run of [`run_in_fresh_netns`]; the inner test does nothing without it.
#[cfg(test)]
pub(crate) const INNER_VAR: &str = "AIRLOCK_NETFILTER_INNER";

/// Inner-run setup: `lo` up (a fresh netns has it down).
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) fn inner_setup() -> bool {
    if std::env::var_os(INNER_VAR).is_none() {
        return false;
    }
    crate::sys::namespaces::loopback_up().unwrap();
    true
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// Walks a message buffer's netlink headers: (type, flags, seq, total length).
    fn headers(buf: &[u8]) -> Vec<(u16, u16, u32, usize)> {
        let mut out = Vec::new();
        let mut off = 0;
        while off + NLMSG_HDRLEN <= buf.len() {
            let len = u32::from_ne_bytes(word(buf, off)) as usize;
            let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
            let flags = u16::from_ne_bytes([buf[off + 6], buf[off + 7]]);
            let seq = u32::from_ne_bytes(word(buf, off + 8));
            out.push((ty, flags, seq, len));
            assert_eq!(len % 4, 0, "messages stay aligned");
            off += len;
        }
        assert_eq!(off, buf.len(), "lengths cover the buffer exactly");
        out
    }

    #[test]
    fn the_batch_is_framed_begin_table_chain_rule_end() {
        let (m, expect) = nft_batch(8889);
        let h = headers(&m.buf);
        let types: Vec<u16> = h.iter().map(|x| x.0).collect();
        assert_eq!(
            types,
            vec![
                NFNL_MSG_BATCH_BEGIN,
                0x0a00 | NFT_MSG_NEWTABLE,
                0x0a00 | NFT_MSG_NEWCHAIN,
                0x0a00 | NFT_MSG_NEWRULE,
                NFNL_MSG_BATCH_END
            ]
        );
        assert_eq!(h.iter().filter(|x| x.1 & NLM_F_ACK != 0).count() as u32, expect);
        let seqs: Vec<u32> = h.iter().map(|x| x.2).collect();
        assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
        // The port goes out big-endian in the immediate's data.
        let be = 8889u16.to_be_bytes();
        assert!(m.buf.windows(2).any(|w| w == be));
        // The chain priority is -100, big-endian two's complement.
        assert!(m.buf.windows(4).any(|w| w == (-100i32).to_be_bytes()));
    }

    /// Inner half of `capture_redirects_and_recovers_the_destination`.
    #[test]
    #[ignore = "run by capture_redirects_and_recovers_the_destination inside unshare -Urn"]
    fn inner_capture_in_a_fresh_netns() {
        if !inner_setup() {
            return;
        }
        use std::net::{TcpListener, TcpStream};
        let port = 8889;
        install_capture(port).unwrap();
        let l = TcpListener::bind(("127.0.0.1", port)).unwrap();
        let _c = TcpStream::connect("10.1.2.3:443").unwrap();
        let (s, _) = l.accept().unwrap();
        assert_eq!(original_dst(&s, false).unwrap(), Some("10.1.2.3:443".parse().unwrap()));
        // Straight to the listener: no NAT entry, no original destination.
        let _d = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (s, _) = l.accept().unwrap();
        assert_eq!(original_dst(&s, false).unwrap(), None);
        // Loopback is left alone: another local port is not captured.
        assert!(TcpStream::connect("127.0.0.2:9").is_err());
        // A second install in the same namespace is refused (the table exists), with a reason.
        let e = install_capture(port).unwrap_err().to_string();
        assert!(e.contains("kernel refused"), "{e}");
    }

    #[test]
    fn capture_redirects_and_recovers_the_destination() {
        run_in_fresh_netns("sys::netfilter::tests::inner_capture_in_a_fresh_netns");
    }

    #[test]
    fn the_route_message_is_one_aligned_request() {
        let m = route_message(1);
        let h = headers(&m.buf);
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].0, RTM_NEWROUTE);
        assert_eq!(h[0].3, NLMSG_HDRLEN + 12 + 8 + 8);
    }
}
