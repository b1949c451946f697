//! Transparent TCP capture inside the sandbox's network namespace, set up through netlink
//! (no `nft` or `ip` binary needed): the equivalent of
//!
//! ```text
//! ip route add local default dev lo table local
//! nft add table inet airlock
//! nft add chain inet airlock capture '{ type nat hook output priority -100; }'
//! nft add rule inet airlock capture ip daddr != 127.0.0.0/8 tcp dport 1-65535 redirect to :PORT
//! # IPv6, where the namespace has it (install_capture_v6, after the above):
//! ip -6 route add local default dev lo table local
//! nft add rule inet airlock capture ip6 daddr != ::1 tcp dport 1-65535 redirect to :PORT
//! ```
//!
//! The route makes every IPv4 destination local (so `connect(2)` to any address gets a route
//! instead of `ENETUNREACH`, and nothing can leave through a device — there is only `lo`); the
//! rule rewrites the destination of each new outgoing TCP connection to `127.0.0.1:PORT`, where
//! the capture listener waits, and conntrack keeps the original for `SO_ORIGINAL_DST`
//! ([`original_dst`]). The IPv6 pair does the same for IPv6: the redirect of a locally made
//! connection goes to `[::1]:PORT` (`nf_nat_redirect_ipv6` uses the loopback address in the
//! output hook), and `IP6T_SO_ORIGINAL_DST` gives the original back. It is a separate step so a
//! namespace without IPv6 (`ipv6.disable=1`, `disable_ipv6`) still gets the IPv4 capture; there
//! an IPv6 `connect(2)` fails with `ENETUNREACH` or `EADDRNOTAVAIL` and nothing leaves.
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
    route_message_for(libc::AF_INET as u8, lo_index)
}

/// `ip -6 route add local default dev lo table local`: the same message with family AF_INET6
/// (the kernel gives it metric 1024, IP6_RT_PRIO_USER, as `ip` would).
fn route_message_v6(lo_index: u32) -> Msg {
    route_message_for(libc::AF_INET6 as u8, lo_index)
}

fn route_message_for(family: u8, lo_index: u32) -> Msg {
    let mut m = Msg::default();
    m.begin(RTM_NEWROUTE, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, 1);
    // struct rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type; u32 flags.
    m.raw(&[family, 0, 0, 0, RT_TABLE_LOCAL, RTPROT_BOOT, RT_SCOPE_HOST, RTN_LOCAL, 0, 0, 0, 0]);
    m.attr(RTA_TABLE, &u32::from(RT_TABLE_LOCAL).to_ne_bytes());
    m.attr(RTA_OIF, &lo_index.to_ne_bytes());
    m.end();
    m
}

// --- the nf_tables batch --------------------------------------------------------------------

pub(super) const NFNL_SUBSYS_NFTABLES: u16 = 10;
pub(super) const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
pub(super) const NFNL_MSG_BATCH_END: u16 = 0x11;
pub(super) const NFT_MSG_NEWTABLE: u16 = 0;
pub(super) const NFT_MSG_NEWCHAIN: u16 = 3;
pub(super) const NFT_MSG_NEWRULE: u16 = 6;
pub(super) const NFPROTO_UNSPEC: u8 = 0;
pub(super) const NFPROTO_INET: u8 = 1;
pub(super) const NFPROTO_IPV4: u8 = 2;
pub(super) const NFPROTO_IPV6: u8 = 10;

pub(super) const NFTA_TABLE_NAME: u16 = 1;
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

pub(super) const NFT_REG_1: u32 = 1;
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
pub(super) const NFTA_IMMEDIATE_DREG: u16 = 1;
pub(super) const NFTA_IMMEDIATE_DATA: u16 = 2;
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
    batch_marker(&mut m, NFNL_MSG_BATCH_BEGIN, seq);

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
        tcp_any_port(m);
        redirect_to(m, port);
    });
    m.end();

    seq += 1;
    batch_marker(&mut m, NFNL_MSG_BATCH_END, seq);
    (m, 3)
}

/// A batch's begin or end message (`kind`), addressed to the nf_tables subsystem.
pub(super) fn batch_marker(m: &mut Msg, kind: u16, seq: u32) {
    m.begin(kind, NLM_F_REQUEST, seq);
    m.raw(&[NFPROTO_UNSPEC, 0, (NFNL_SUBSYS_NFTABLES >> 8) as u8, NFNL_SUBSYS_NFTABLES as u8]);
    m.end();
}

/// `meta l4proto tcp tcp dport 1-65535` (the port at tcphdr offset 2; `1-65535` is `!= 0`).
fn tcp_any_port(m: &mut Msg) {
    meta(m, NFT_META_L4PROTO);
    cmp(m, NFT_CMP_EQ, &[libc::IPPROTO_TCP as u8]);
    payload(m, NFT_PAYLOAD_TRANSPORT_HEADER, 2, 2);
    cmp(m, NFT_CMP_NEQ, &[0, 0]);
}

/// `redirect to :port`: the port into register 1, then `redir` reading it.
fn redirect_to(m: &mut Msg, port: u16) {
    expr(m, "immediate", |m| {
        m.be32(NFTA_IMMEDIATE_DREG, NFT_REG_1);
        m.nest(NFTA_IMMEDIATE_DATA, |m| m.attr(NFTA_DATA_VALUE, &port.to_be_bytes()));
    });
    expr(m, "redir", |m| m.be32(NFTA_REDIR_REG_PROTO_MIN, NFT_REG_1));
}

/// The IPv6 rule, appended to the chain [`nft_batch`] made, as a batch of its own (so a kernel
/// without IPv6 NAT keeps the IPv4 capture); with the number of messages that ask for an ACK.
/// `nft --debug=netlink` for `ip6 daddr != ::1 tcp dport 1-65535 redirect to :PORT`, with the
/// port range as `cmp neq 0` like the IPv4 rule (nft itself writes `[ range eq reg 1 0x00000100
/// 0x0000ffff ]`, the same set of ports):
///
/// ```text
/// [ meta load nfproto => reg 1 ]
/// [ cmp eq reg 1 0x0000000a ]
/// [ payload load 16b @ network header + 24 => reg 1 ]
/// [ cmp neq reg 1 0x00000000 0x00000000 0x00000000 0x01000000 ]
/// [ meta load l4proto => reg 1 ]
/// [ cmp eq reg 1 0x00000006 ]
/// [ payload load 2b @ transport header + 2 => reg 1 ]
/// [ cmp neq reg 1 0x00000000 ]
/// [ immediate reg 1 0x0000b922 ]
/// [ redir proto_min reg 1 ]
/// ```
fn nft_batch_v6(port: u16) -> (Msg, u32) {
    let mut m = Msg::default();
    let mut seq = 1;
    batch_marker(&mut m, NFNL_MSG_BATCH_BEGIN, seq);

    seq += 1;
    let create = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE;
    nft_begin(&mut m, NFT_MSG_NEWRULE, create | NLM_F_APPEND, seq, NFPROTO_INET);
    m.str(NFTA_RULE_TABLE, TABLE);
    m.str(NFTA_RULE_CHAIN, CHAIN);
    m.nest(NFTA_RULE_EXPRESSIONS, |m| {
        // meta nfproto ipv6
        meta(m, NFT_META_NFPROTO);
        cmp(m, NFT_CMP_EQ, &[NFPROTO_IPV6]);
        // ip6 daddr != ::1: the whole destination (ipv6hdr offset 24, 16 bytes), RFC 8200 §3
        payload(m, NFT_PAYLOAD_NETWORK_HEADER, 24, 16);
        cmp(m, NFT_CMP_NEQ, &std::net::Ipv6Addr::LOCALHOST.octets());
        tcp_any_port(m);
        // (for IPv6 in the output hook the redirect goes to [::1]:port)
        redirect_to(m, port);
    });
    m.end();

    seq += 1;
    batch_marker(&mut m, NFNL_MSG_BATCH_END, seq);
    (m, 1)
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

const ROUTE_V6_HINT: &str = " (the sandbox's namespace has no usable IPv6: is it disabled, \
ipv6.disable=1 at boot or net.ipv6.conf.default.disable_ipv6=1?)";
const NFT_V6_HINT: &str = " (nf_tables lacks IPv6 NAT: CONFIG_NF_NAT with IPv6, \
CONFIG_NFT_REDIR)";

/// The IPv6 half of the capture, in the **current** network namespace, after
/// [`install_capture`]: the IPv6 local default route and the redirect of every IPv6 TCP
/// connection not to `::1` to `[::1]:port`. An error leaves the IPv4 capture working; the caller
/// then makes no IPv6 capture listener. Whatever step failed, no IPv6 packet can leave the
/// namespace (it has only `lo`).
pub fn install_capture_v6(port: u16) -> Result<(), CaptureError> {
    let lo = nix::net::if_::if_nametoindex("lo")
        .map_err(|e| CaptureError::io("finding the loopback device", e))?;
    transact(
        SockProtocol::NetlinkRoute,
        &route_message_v6(lo),
        1,
        1,
        "adding the IPv6 local default route",
        ROUTE_V6_HINT,
    )?;
    let (batch, expect) = nft_batch_v6(port);
    transact(
        SockProtocol::NetlinkNetFilter,
        &batch,
        2,
        expect,
        "adding the nftables IPv6 capture rule",
        NFT_V6_HINT,
    )
}

/// Test hook (feature `test-hooks`): with `AIRLOCK_TEST_NO_IPV6` set, turns IPv6 off in the
/// **current** network namespace (`disable_ipv6` on `all`, `default` and `lo`; ip-sysctl.rst),
/// as on a host booted without IPv6, so the degraded path is testable. Announced on stderr.
#[cfg(feature = "test-hooks")]
pub fn test_hook_disable_ipv6() {
    if std::env::var_os("AIRLOCK_TEST_NO_IPV6").is_none() {
        return;
    }
    eprintln!("airlock: TEST HOOK: IPv6 disabled in the sandbox's network namespace");
    for dev in ["all", "default", "lo"] {
        let file = format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6");
        if let Err(e) = std::fs::write(&file, "1") {
            eprintln!("airlock: TEST HOOK: cannot write {file}: {e}");
        }
    }
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

    /// The IPv6 route is the IPv4 one with family AF_INET6, byte for byte otherwise:
    /// rtmsg {family 10, dst_len 0 (default), table 255 local, proto boot, scope host, type
    /// local}, RTA_TABLE 255, RTA_OIF lo — what `ip -6 route add local default dev lo table
    /// local` sends (iproute2 ip/iproute.c, minus the RTA_PRIORITY it leaves to the kernel).
    #[test]
    fn the_ipv6_route_message_differs_only_in_the_family() {
        let (v4, v6) = (route_message(7).buf, route_message_v6(7).buf);
        assert_eq!(v4.len(), v6.len());
        let differ: Vec<usize> = (0..v4.len()).filter(|&i| v4[i] != v6[i]).collect();
        assert_eq!(differ, vec![NLMSG_HDRLEN], "only rtm_family");
        assert_eq!(v6[NLMSG_HDRLEN], libc::AF_INET6 as u8);
        let mut want = vec![libc::AF_INET6 as u8, 0, 0, 0, 255, 3, 254, 2, 0, 0, 0, 0];
        want.extend_from_slice(&8u16.to_ne_bytes());
        want.extend_from_slice(&RTA_TABLE.to_ne_bytes());
        want.extend_from_slice(&255u32.to_ne_bytes());
        want.extend_from_slice(&8u16.to_ne_bytes());
        want.extend_from_slice(&RTA_OIF.to_ne_bytes());
        want.extend_from_slice(&7u32.to_ne_bytes());
        assert_eq!(&v6[NLMSG_HDRLEN..], &want[..]);
        let h = headers(&v6);
        assert_eq!((h[0].0, h[0].1), (RTM_NEWROUTE, 0x605), "REQUEST|ACK|EXCL|CREATE");
    }

    /// Attributes of a buffer: (type without NLA_F_NESTED, payload).
    fn attrs(mut buf: &[u8]) -> Vec<(u16, &[u8])> {
        let mut out = Vec::new();
        while buf.len() >= 4 {
            let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
            let ty = u16::from_ne_bytes([buf[2], buf[3]]) & !NLA_F_NESTED;
            assert!(len >= 4 && len <= buf.len(), "attribute length {len} in {}", buf.len());
            out.push((ty, &buf[4..len]));
            buf = &buf[len.next_multiple_of(4).min(buf.len())..];
        }
        assert!(buf.is_empty(), "trailing bytes");
        out
    }

    fn get<'a>(a: &[(u16, &'a [u8])], ty: u16) -> &'a [u8] {
        a.iter().find(|x| x.0 == ty).map(|x| x.1).unwrap_or_else(|| panic!("no attr {ty}"))
    }

    fn be(v: &[u8]) -> u32 {
        u32::from_be_bytes(v.try_into().unwrap())
    }

    /// `0x%08x` per 32-bit word in host order, zero-padded, as libnftnl prints data
    /// (`nftnl_data_reg_snprintf`).
    fn words(v: &[u8]) -> String {
        v.chunks(4)
            .map(|c| {
                let mut w = [0u8; 4];
                w[..c.len()].copy_from_slice(c);
                format!("0x{:08x}", u32::from_ne_bytes(w))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// A rule message's expressions as `nft --debug=netlink` prints them (libnftnl's
    /// expr/{meta,cmp,payload,immediate,redir}.c snprintf formats), for the keys and bases used
    /// here; anything else is printed raw so a comparison fails loudly.
    fn decode_rule(msg: &[u8]) -> (String, String, Vec<String>) {
        let a = attrs(&msg[NLMSG_HDRLEN + 4..]);
        let name = |t| String::from_utf8(get(&a, t).split_last().unwrap().1.to_vec()).unwrap();
        let mut lines = Vec::new();
        for (ty, elem) in attrs(get(&a, NFTA_RULE_EXPRESSIONS)) {
            assert_eq!(ty, NFTA_LIST_ELEM);
            let e = attrs(elem);
            let kind = std::str::from_utf8(get(&e, NFTA_EXPR_NAME)).unwrap().trim_end_matches('\0');
            let d = attrs(get(&e, NFTA_EXPR_DATA));
            let data = |t| get(&attrs(get(&d, t)), NFTA_DATA_VALUE).to_vec();
            lines.push(match kind {
                "meta" => {
                    let key = match be(get(&d, NFTA_META_KEY)) {
                        NFT_META_NFPROTO => "nfproto".to_string(),
                        NFT_META_L4PROTO => "l4proto".to_string(),
                        k => format!("key{k}"),
                    };
                    format!("[ meta load {key} => reg {} ]", be(get(&d, NFTA_META_DREG)))
                }
                "cmp" => {
                    let op = match be(get(&d, NFTA_CMP_OP)) {
                        NFT_CMP_EQ => "eq".to_string(),
                        NFT_CMP_NEQ => "neq".to_string(),
                        o => format!("op{o}"),
                    };
                    let sreg = be(get(&d, NFTA_CMP_SREG));
                    format!("[ cmp {op} reg {sreg} {} ]", words(&data(NFTA_CMP_DATA)))
                }
                "payload" => {
                    let base = match be(get(&d, NFTA_PAYLOAD_BASE)) {
                        NFT_PAYLOAD_NETWORK_HEADER => "network".to_string(),
                        NFT_PAYLOAD_TRANSPORT_HEADER => "transport".to_string(),
                        b => format!("base{b}"),
                    };
                    format!(
                        "[ payload load {}b @ {base} header + {} => reg {} ]",
                        be(get(&d, NFTA_PAYLOAD_LEN)),
                        be(get(&d, NFTA_PAYLOAD_OFFSET)),
                        be(get(&d, NFTA_PAYLOAD_DREG))
                    )
                }
                "immediate" => format!(
                    "[ immediate reg {} {} ]",
                    be(get(&d, NFTA_IMMEDIATE_DREG)),
                    words(&data(NFTA_IMMEDIATE_DATA))
                ),
                "redir" => {
                    format!("[ redir proto_min reg {} ]", be(get(&d, NFTA_REDIR_REG_PROTO_MIN)))
                }
                other => format!("[ {other} {d:?} ]"),
            });
        }
        (name(NFTA_RULE_TABLE), name(NFTA_RULE_CHAIN), lines)
    }

    /// The messages of a batch buffer, each as (type, family, bytes).
    fn messages(buf: &[u8]) -> Vec<(u16, u8, &[u8])> {
        let mut out = Vec::new();
        let mut off = 0;
        for (ty, _, _, len) in headers(buf) {
            out.push((ty, buf[off + NLMSG_HDRLEN], &buf[off..off + len]));
            off += len;
        }
        out
    }

    /// The IPv4 rule as nft prints it for
    /// `ip daddr != 127.0.0.0/8 tcp dport 1-65535 redirect to :8889` on a little-endian host
    /// (the port range as `cmp neq 0`).
    #[test]
    #[cfg(target_endian = "little")]
    fn the_ipv4_rule_is_what_nft_debug_netlink_prints() {
        let (m, _) = nft_batch(8889);
        let rule =
            messages(&m.buf).into_iter().find(|x| x.0 == (0x0a00 | NFT_MSG_NEWRULE)).unwrap();
        let (table, chain, lines) = decode_rule(rule.2);
        assert_eq!((table.as_str(), chain.as_str(), rule.1), (TABLE, CHAIN, NFPROTO_INET));
        assert_eq!(
            lines,
            [
                "[ meta load nfproto => reg 1 ]",
                "[ cmp eq reg 1 0x00000002 ]",
                "[ payload load 1b @ network header + 16 => reg 1 ]",
                "[ cmp neq reg 1 0x0000007f ]",
                "[ meta load l4proto => reg 1 ]",
                "[ cmp eq reg 1 0x00000006 ]",
                "[ payload load 2b @ transport header + 2 => reg 1 ]",
                "[ cmp neq reg 1 0x00000000 ]",
                "[ immediate reg 1 0x0000b922 ]",
                "[ redir proto_min reg 1 ]",
            ]
        );
    }

    /// The IPv6 rule as nft prints it for `ip6 daddr != ::1 tcp dport 1-65535 redirect to
    /// :8889` (`inet airlock capture`; the port range as `cmp neq 0`, see `nft_batch_v6`),
    /// alone between a batch begin and end.
    #[test]
    #[cfg(target_endian = "little")]
    fn the_ipv6_rule_is_what_nft_debug_netlink_prints() {
        let (m, expect) = nft_batch_v6(8889);
        let msgs = messages(&m.buf);
        let types: Vec<u16> = msgs.iter().map(|x| x.0).collect();
        assert_eq!(
            types,
            [NFNL_MSG_BATCH_BEGIN, 0x0a00 | NFT_MSG_NEWRULE, NFNL_MSG_BATCH_END],
            "a rule only: the table and chain come from the IPv4 batch"
        );
        assert_eq!(expect, 1);
        let h = headers(&m.buf);
        assert_eq!(h[1].1, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_APPEND);
        assert_eq!(h.iter().map(|x| x.2).collect::<Vec<_>>(), [1, 2, 3]);
        let (table, chain, lines) = decode_rule(msgs[1].2);
        assert_eq!((table.as_str(), chain.as_str(), msgs[1].1), (TABLE, CHAIN, NFPROTO_INET));
        assert_eq!(
            lines,
            [
                "[ meta load nfproto => reg 1 ]",
                "[ cmp eq reg 1 0x0000000a ]",
                "[ payload load 16b @ network header + 24 => reg 1 ]",
                "[ cmp neq reg 1 0x00000000 0x00000000 0x00000000 0x01000000 ]",
                "[ meta load l4proto => reg 1 ]",
                "[ cmp eq reg 1 0x00000006 ]",
                "[ payload load 2b @ transport header + 2 => reg 1 ]",
                "[ cmp neq reg 1 0x00000000 ]",
                "[ immediate reg 1 0x0000b922 ]",
                "[ redir proto_min reg 1 ]",
            ]
        );
    }

    /// Inner half of `ipv6_capture_redirects_and_recovers_the_destination`.
    #[test]
    #[ignore = "run by ipv6_capture_redirects_and_recovers_the_destination inside unshare -Urn"]
    fn inner_capture_v6_in_a_fresh_netns() {
        if !inner_setup() {
            return;
        }
        use std::net::{TcpListener, TcpStream};
        let port = 8889;
        install_capture(port).unwrap();
        install_capture_v6(port).unwrap();
        let l6 = TcpListener::bind(("::1", port)).unwrap();
        let l4 = TcpListener::bind(("127.0.0.1", port)).unwrap();
        // The documentation prefix (RFC 3849), inside this namespace only (it has only `lo`).
        let _c = TcpStream::connect("[2001:db8::1]:443").unwrap();
        let (s, _) = l6.accept().unwrap();
        assert_eq!(original_dst(&s, true).unwrap(), Some("[2001:db8::1]:443".parse().unwrap()));
        // Straight to the listener: no original destination.
        let _d = TcpStream::connect(("::1", port)).unwrap();
        let (s, _) = l6.accept().unwrap();
        assert_eq!(original_dst(&s, true).unwrap(), None);
        // ::1 is left alone: another local port is not captured.
        assert!(TcpStream::connect("[::1]:9").is_err());
        // IPv4 is still captured, to the IPv4 listener.
        let _e = TcpStream::connect("10.1.2.3:443").unwrap();
        let (s, _) = l4.accept().unwrap();
        assert_eq!(original_dst(&s, false).unwrap(), Some("10.1.2.3:443".parse().unwrap()));
        // The route exists once: a second install is refused with the reason.
        let e = install_capture_v6(port).unwrap_err().to_string();
        assert!(e.contains("kernel refused") && e.contains("IPv6"), "{e}");
    }

    #[test]
    fn ipv6_capture_redirects_and_recovers_the_destination() {
        run_in_fresh_netns("sys::netfilter::tests::inner_capture_v6_in_a_fresh_netns");
    }
}
