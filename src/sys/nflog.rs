//! UDP other than DNS inside the sandbox's network namespace: refused there, and logged to a
//! netfilter log (NFLOG) socket made inside and handed to the daemon, which writes one audit
//! line per datagram (`proxy::udp`). Set up through netlink like the TCP capture
//! ([`super::netfilter`]), right after it and in the same `inet airlock` table: the
//! equivalent of
//!
//! ```text
//! nft add chain inet airlock refuse_udp '{ type filter hook output priority 0; }'
//! nft add rule inet airlock refuse_udp meta nfproto ipv4 ip daddr != 127.0.0.0/8 \
//!     meta l4proto udp log group 1 reject
//! nft add rule inet airlock refuse_udp meta nfproto ipv6 ip6 daddr != ::1 \
//!     meta l4proto udp log group 1 reject
//! ```
//!
//! The IPv6 rule ([`install_udp_refusal_v6`]) is a batch of its own, part of the best-effort
//! IPv6 half of the capture and added right before it (`netfilter::install_capture_v6`): that
//! capture routes every IPv6 address to `lo`, so without the rule a datagram to a global IPv6
//! address would vanish there unaudited; if the rule is refused, the sandbox adds no IPv6 route
//! either. A namespace without that route has nowhere to send IPv6: `sendto` fails with
//! `ENETUNREACH` (or `EADDRNOTAVAIL`) and nothing is sent.
//!
//! A separate `filter` chain, not a rule in the `nat` capture chain: a nat chain sees only the
//! first packet of a conntrack flow, and every datagram must be logged and refused. `reject`
//! in the `inet` family answers with ICMP port unreachable (`icmpx port-unreachable`), so a
//! connected UDP socket gets `ECONNREFUSED` at once and a QUIC client falls back to TCP, which
//! is captured. UDP to `127.0.0.0/8` is the sandbox's own loopback (its resolver at
//! `127.0.0.53:53`, a dev server): left alone, it never leaves the namespace.
//!
//! The log socket ([`open_udp_log`]): `AF_NETLINK`/`NETLINK_NETFILTER`, bound to log group
//! [`LOG_GROUP`] with one `NFULNL_MSG_CONFIG` (`CMD_BIND`, `COPY_PACKET` of the first
//! [`COPY_RANGE`] bytes — an IPv4 header with options and the UDP header fit —, a queue
//! threshold of 1 so each datagram is sent at once, and `NFULNL_CFG_F_SEQ` so a message the
//! kernel dropped for a full receive buffer shows as a gap). Binding needs `CAP_NET_ADMIN`
//! over the namespace; after that the socket only receives, so the daemon reads it without
//! privileges. The PF_BIND/PF_UNBIND commands are not sent: they are no-ops since Linux 3.17.
//!
//! [`parse`] reads what the daemon receives: netlink messages of `NFULNL_MSG_PACKET`, their
//! `NFULA_SEQ` and `NFULA_PAYLOAD`, and from the payload the IP and UDP headers (every length
//! bounds-checked; the bytes are the sandbox's packet, untrusted).
//!
//! Layouts: `include/uapi/linux/netfilter/nfnetlink_log.h`, `nfnetlink.h`, `nf_tables.h`
//! (`nft_log_attributes`, `nft_reject_attributes`); ip(7), RFC 791 (IPv4 header), RFC 8200
//! (IPv6 header), RFC 768 (UDP header). One `unsafe`: registering the socket with tokio
//! ([`into_async`]), whose I/O-safety contract an `OwnedFd` meets.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    AddressFamily, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, setsockopt, socket, sockopt,
};
use nix::sys::time::TimeVal;

use super::netfilter::{
    CaptureError, Msg, NF_INET_LOCAL_OUT, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFPROTO_INET,
    NFPROTO_IPV4, NFPROTO_IPV6, NFPROTO_UNSPEC, NFT_CMP_EQ, NFT_CMP_NEQ, NFT_META_L4PROTO,
    NFT_META_NFPROTO, NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE, NFT_PAYLOAD_NETWORK_HEADER,
    NFTA_CHAIN_HOOK, NFTA_CHAIN_NAME, NFTA_CHAIN_TABLE, NFTA_CHAIN_TYPE, NFTA_HOOK_HOOKNUM,
    NFTA_HOOK_PRIORITY, NFTA_RULE_CHAIN, NFTA_RULE_EXPRESSIONS, NFTA_RULE_TABLE, NLA_F_NESTED,
    NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_REQUEST, NLMSG_HDRLEN, TABLE, batch_marker, cmp,
    expr, meta, nft_begin, payload, transact, transact_on,
};

/// The chain (type `filter`, hook `output`) that logs and refuses UDP, in table [`TABLE`].
pub const UDP_CHAIN: &str = "refuse_udp";
/// The NFLOG group the rule logs to. Log instances are per network namespace, so any number
/// works: the sandbox's namespace has only this one.
pub const LOG_GROUP: u16 = 1;
/// Receive buffer asked for on the log socket, which the kernel doubles for bookkeeping
/// (socket(7)); each queued report costs at most one page-sized buffer (the log instance's
/// default `nlbufsiz`), so some hundreds of reports wait here before the kernel drops any.
/// The sandbox asks with `SO_RCVBUF` (capped at `net.core.rmem_max`); a daemon
/// running as root forces it past that cap (`proxy::udp`).
pub const LOG_RCVBUF: usize = 1 << 20;
/// Bytes of each datagram copied to the log socket: the largest IPv4 header (60) plus the UDP
/// header (8), and an IPv6 header (40) plus UDP, fit.
pub const COPY_RANGE: u32 = 128;

// nf_tables.h: the log and reject expressions.
const NFTA_LOG_GROUP: u16 = 1;
const NFTA_REJECT_TYPE: u16 = 1;
const NFTA_REJECT_ICMP_CODE: u16 = 2;
/// `NF_IP_PRI_FILTER`.
const PRIORITY_FILTER: i32 = libc::NF_IP_PRI_FILTER;

// nfnetlink_log.h.
const NFNL_SUBSYS_ULOG: u16 = libc::NFNL_SUBSYS_ULOG as u16;
const NFULNL_MSG_PACKET: u16 = libc::NFULNL_MSG_PACKET as u16;
const NFULNL_MSG_CONFIG: u16 = libc::NFULNL_MSG_CONFIG as u16;
const NFULA_PAYLOAD: u16 = libc::NFULA_PAYLOAD as u16;
const NFULA_SEQ: u16 = libc::NFULA_SEQ as u16;
const NFULA_CFG_CMD: u16 = libc::NFULA_CFG_CMD as u16;
const NFULA_CFG_MODE: u16 = libc::NFULA_CFG_MODE as u16;
const NFULA_CFG_QTHRESH: u16 = libc::NFULA_CFG_QTHRESH as u16;
const NFULA_CFG_FLAGS: u16 = libc::NFULA_CFG_FLAGS as u16;
/// `NLA_TYPE_MASK`: the attribute type without the nested / byte-order flags (netlink.h).
const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | 0x4000);
const NLMSG_NOOP: u16 = 1;
const NLMSG_DONE: u16 = 3;

const NFT_HINT: &str = " (refusing and logging UDP needs nf_tables with the log and reject \
expressions and netfilter netlink logging: CONFIG_NFT_LOG, CONFIG_NFT_REJECT, \
CONFIG_NFT_REJECT_INET, CONFIG_NETFILTER_NETLINK_LOG; see `airlock doctor`)";
const LOG_HINT: &str = " (the sandbox could not bind its netfilter log socket: \
CONFIG_NETFILTER_NETLINK_LOG; see `airlock doctor`)";

/// The batch adding [`UDP_CHAIN`] and its one rule to the existing table (made by
/// `netfilter::install_capture`); returns it with the number of messages that ask for an ACK.
fn udp_batch() -> (Msg, u32) {
    let mut m = Msg::default();
    let mut seq = 1;
    batch_marker(&mut m, NFNL_MSG_BATCH_BEGIN, seq);

    seq += 1;
    let create = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE;
    nft_begin(&mut m, NFT_MSG_NEWCHAIN, create | super::netfilter::NLM_F_EXCL, seq, NFPROTO_INET);
    m.str(NFTA_CHAIN_TABLE, TABLE);
    m.str(NFTA_CHAIN_NAME, UDP_CHAIN);
    m.nest(NFTA_CHAIN_HOOK, |m| {
        m.be32(NFTA_HOOK_HOOKNUM, NF_INET_LOCAL_OUT);
        m.attr(NFTA_HOOK_PRIORITY, &PRIORITY_FILTER.to_be_bytes());
    });
    m.str(NFTA_CHAIN_TYPE, "filter");
    m.end();

    seq += 1;
    udp_rule(&mut m, seq, false);

    seq += 1;
    batch_marker(&mut m, NFNL_MSG_BATCH_END, seq);
    (m, 2)
}

/// The batch appending the IPv6 rule to [`UDP_CHAIN`] (made by [`udp_batch`]); with the number
/// of messages that ask for an ACK.
fn udp_batch_v6() -> (Msg, u32) {
    let mut m = Msg::default();
    batch_marker(&mut m, NFNL_MSG_BATCH_BEGIN, 1);
    udp_rule(&mut m, 2, true);
    batch_marker(&mut m, NFNL_MSG_BATCH_END, 3);
    (m, 1)
}

/// One refusal rule, appended to [`UDP_CHAIN`]: UDP of the family (`v6`: IPv6) to anything but
/// the namespace's loopback, logged to [`LOG_GROUP`] and rejected.
fn udp_rule(m: &mut Msg, seq: u32, v6: bool) {
    let create = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE;
    nft_begin(m, NFT_MSG_NEWRULE, create | NLM_F_APPEND, seq, NFPROTO_INET);
    m.str(NFTA_RULE_TABLE, TABLE);
    m.str(NFTA_RULE_CHAIN, UDP_CHAIN);
    m.nest(NFTA_RULE_EXPRESSIONS, |m| {
        if v6 {
            // meta nfproto ipv6
            meta(m, NFT_META_NFPROTO);
            cmp(m, NFT_CMP_EQ, &[NFPROTO_IPV6]);
            // ip6 daddr != ::1: the whole destination (ipv6hdr offset 24, 16 bytes), RFC 8200
            // §3. Only ::1 is the loopback; the rest of ::/0 reaches `lo` by the capture's
            // route alone.
            payload(m, NFT_PAYLOAD_NETWORK_HEADER, 24, 16);
            cmp(m, NFT_CMP_NEQ, &Ipv6Addr::LOCALHOST.octets());
        } else {
            // meta nfproto ipv4
            meta(m, NFT_META_NFPROTO);
            cmp(m, NFT_CMP_EQ, &[NFPROTO_IPV4]);
            // ip daddr != 127.0.0.0/8: the first byte of the destination (iphdr offset 16)
            payload(m, NFT_PAYLOAD_NETWORK_HEADER, 16, 1);
            cmp(m, NFT_CMP_NEQ, &[127]);
        }
        // meta l4proto udp
        meta(m, NFT_META_L4PROTO);
        cmp(m, NFT_CMP_EQ, &[libc::IPPROTO_UDP as u8]);
        // log group 1 (nft_log: a group makes it an NFLOG, not a kernel-log, logger)
        expr(m, "log", |m| m.attr(NFTA_LOG_GROUP, &LOG_GROUP.to_be_bytes()));
        // reject with icmpx port-unreachable
        expr(m, "reject", |m| {
            m.be32(NFTA_REJECT_TYPE, libc::NFT_REJECT_ICMPX_UNREACH as u32);
            m.attr(NFTA_REJECT_ICMP_CODE, &[libc::NFT_REJECT_ICMPX_PORT_UNREACH as u8]);
        });
    });
    m.end();
}

/// Adds the UDP refusal to the **current** network namespace, whose `inet airlock` table
/// `netfilter::install_capture` made. Needs CAP_NET_ADMIN over the namespace.
pub fn install_udp_refusal() -> Result<(), CaptureError> {
    let (batch, expect) = udp_batch();
    transact(
        SockProtocol::NetlinkNetFilter,
        &batch,
        2,
        expect,
        "adding the nftables UDP refusal rule",
        NFT_HINT,
    )
}

/// The IPv6 half of the refusal, after [`install_udp_refusal`] (whose chain it appends to) and
/// before `netfilter::install_capture_v6` (see the module header). Needs CAP_NET_ADMIN over the
/// namespace.
pub fn install_udp_refusal_v6() -> Result<(), CaptureError> {
    let (batch, expect) = udp_batch_v6();
    transact(
        SockProtocol::NetlinkNetFilter,
        &batch,
        2,
        expect,
        "adding the nftables IPv6 UDP refusal rule",
        NFT_HINT,
    )
}

/// The one `NFULNL_MSG_CONFIG` that binds [`LOG_GROUP`] to the sending socket and sets it up.
fn config_message() -> Msg {
    let mut m = Msg::default();
    m.begin((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_CONFIG, NLM_F_REQUEST | NLM_F_ACK, 1);
    // struct nfgenmsg: family (unused by CMD_BIND), version, res_id = the group (big-endian).
    let group = LOG_GROUP.to_be_bytes();
    m.raw(&[NFPROTO_UNSPEC, 0, group[0], group[1]]);
    m.attr(NFULA_CFG_CMD, &[libc::NFULNL_CFG_CMD_BIND as u8]);
    // struct nfulnl_msg_config_mode (packed): __be32 copy_range, __u8 copy_mode, __u8 _pad.
    let mut mode = COPY_RANGE.to_be_bytes().to_vec();
    mode.extend_from_slice(&[libc::NFULNL_COPY_PACKET as u8, 0]);
    m.attr(NFULA_CFG_MODE, &mode);
    m.be32(NFULA_CFG_QTHRESH, 1);
    m.attr(NFULA_CFG_FLAGS, &(libc::NFULNL_CFG_F_SEQ as u16).to_be_bytes());
    m.end();
    m
}

/// Makes the netfilter log socket in the **current** network namespace and binds it to
/// [`LOG_GROUP`] (needs CAP_NET_ADMIN over the namespace). Blocking, with no receive timeout
/// left set: the daemon makes it non-blocking.
pub fn open_udp_log() -> Result<OwnedFd, CaptureError> {
    let fd: OwnedFd = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )
    .map_err(|e| CaptureError::Io { what: "opening the netfilter log socket", source: e.into() })?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(|e| CaptureError::Io {
        what: "binding the netfilter log socket",
        source: e.into(),
    })?;
    setsockopt(&fd, sockopt::RcvBuf, &LOG_RCVBUF).map_err(|e| CaptureError::Io {
        what: "sizing the netfilter log socket's receive buffer",
        source: e.into(),
    })?;
    // transact_on sets a receive timeout for the ACK; cleared after.
    transact_on(&fd, &config_message(), 1, 1, "binding the netfilter log group", LOG_HINT)?;
    setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(0, 0)).map_err(|e| {
        CaptureError::Io { what: "clearing SO_RCVTIMEO on the log socket", source: e.into() }
    })?;
    Ok(fd)
}

/// The daemon's side: registers the handed-over log socket with tokio's reactor so it can be
/// awaited (the caller makes it non-blocking first).
pub fn into_async(fd: OwnedFd) -> std::io::Result<tokio::io::unix::AsyncFd<OwnedFd>> {
    // SAFETY: `AsyncFd::register` requires that `as_raw_fd()` return one valid, open fd for the
    // AsyncFd's whole life. An `OwnedFd` owns its fd, closes it only on drop (which the AsyncFd,
    // now its owner, controls) and always returns the same number.
    unsafe { tokio::io::unix::AsyncFd::register(fd) }.map_err(std::io::Error::from)
}

/// One datagram the sandbox tried to send, as the log socket reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    /// `NFULA_SEQ`: the log instance's own counter, from 0 (absent if the flag was not set).
    pub seq: Option<u32>,
    /// Where the datagram was going and where it came from.
    pub dst: SocketAddr,
    pub src: SocketAddr,
}

/// Why one log message could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("truncated netlink message at byte {0}")]
    Framing(usize),
    #[error("log message without a packet payload (NFULA_PAYLOAD)")]
    NoPayload,
    #[error("logged packet too short for its IP and UDP headers ({0} bytes)")]
    Short(usize),
    #[error("logged packet is IP version {0}, not 4 or 6")]
    Version(u8),
    #[error("logged packet carries protocol {0}, not UDP (17)")]
    NotUdp(u8),
    #[error("logged packet is a non-first IPv4 fragment (no UDP header)")]
    Fragment,
}

/// Each netlink message in one datagram from the log socket: `Ok` for a logged packet, `Err`
/// for one that could not be read; ACKs, `NLMSG_DONE` (the end of a batch) and other types are
/// skipped. A framing error ends the walk.
pub fn parse(buf: &[u8]) -> Vec<Result<Logged, ParseError>> {
    let mut out = Vec::new();
    let mut off = 0;
    while off < buf.len() {
        let Some(hdr) = buf.get(off..off + NLMSG_HDRLEN) else {
            out.push(Err(ParseError::Framing(off)));
            break;
        };
        let len = u32::from_ne_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]) as usize;
        let ty = u16::from_ne_bytes([hdr[4], hdr[5]]);
        let Some(msg) = (len >= NLMSG_HDRLEN).then(|| buf.get(off..off + len)).flatten() else {
            out.push(Err(ParseError::Framing(off)));
            break;
        };
        match ty {
            NLMSG_NOOP | NLMSG_DONE | super::netfilter::NLMSG_ERROR => {}
            t if t == (NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET => {
                out.push(packet(&msg[NLMSG_HDRLEN..]));
            }
            _ => {}
        }
        off = off.saturating_add(len.next_multiple_of(4));
    }
    out
}

/// One `NFULNL_MSG_PACKET` body: `struct nfgenmsg`, then attributes.
fn packet(body: &[u8]) -> Result<Logged, ParseError> {
    let mut seq = None;
    let mut data = None;
    let mut off = 4; // nfgenmsg
    while off + 4 <= body.len() {
        let len = u16::from_ne_bytes([body[off], body[off + 1]]) as usize;
        let ty = u16::from_ne_bytes([body[off + 2], body[off + 3]]) & NLA_TYPE_MASK;
        let Some(value) = (len >= 4).then(|| body.get(off + 4..off + len)).flatten() else {
            return Err(ParseError::Framing(off));
        };
        match ty {
            NFULA_SEQ if value.len() == 4 => {
                seq = Some(u32::from_be_bytes([value[0], value[1], value[2], value[3]]));
            }
            NFULA_PAYLOAD => data = Some(value),
            _ => {}
        }
        off += len.next_multiple_of(4);
    }
    let (src, dst) = ip_udp(data.ok_or(ParseError::NoPayload)?)?;
    Ok(Logged { seq, dst, src })
}

/// The source and destination of an IPv4 or IPv6 UDP packet (IPv6 without extension
/// headers: the rule's `meta l4proto udp` would match behind them, but the sandbox's own
/// stack adds none to a plain `sendto`).
pub fn ip_udp(p: &[u8]) -> Result<(SocketAddr, SocketAddr), ParseError> {
    let first = *p.first().ok_or(ParseError::Short(0))?;
    let (src, dst, udp) = match first >> 4 {
        4 => {
            let ihl = usize::from(first & 0x0f) * 4;
            if ihl < 20 || p.len() < ihl + 8 {
                return Err(ParseError::Short(p.len()));
            }
            if p[9] != libc::IPPROTO_UDP as u8 {
                return Err(ParseError::NotUdp(p[9]));
            }
            if u16::from_be_bytes([p[6], p[7]]) & 0x1fff != 0 {
                return Err(ParseError::Fragment);
            }
            let v4 = |at: usize| IpAddr::V4(Ipv4Addr::new(p[at], p[at + 1], p[at + 2], p[at + 3]));
            (v4(12), v4(16), &p[ihl..])
        }
        6 => {
            if p.len() < 48 {
                return Err(ParseError::Short(p.len()));
            }
            if p[6] != libc::IPPROTO_UDP as u8 {
                return Err(ParseError::NotUdp(p[6]));
            }
            let v6 = |at: usize| {
                let mut o = [0u8; 16];
                o.copy_from_slice(&p[at..at + 16]);
                IpAddr::V6(Ipv6Addr::from(o))
            };
            (v6(8), v6(24), &p[40..])
        }
        v => return Err(ParseError::Version(v)),
    };
    let sport = u16::from_be_bytes([udp[0], udp[1]]);
    let dport = u16::from_be_bytes([udp[2], udp[3]]);
    Ok((SocketAddr::new(src, sport), SocketAddr::new(dst, dport)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// An IPv4 header (`ihl` words) and a UDP header, as the kernel logs them.
    fn ipv4_udp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, ihl: u8) -> Vec<u8> {
        let mut p = vec![0x40 | ihl, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0];
        p.extend_from_slice(&src);
        p.extend_from_slice(&dst);
        p.resize(usize::from(ihl) * 4, 0);
        p.extend_from_slice(&sport.to_be_bytes());
        p.extend_from_slice(&dport.to_be_bytes());
        p.extend_from_slice(&[0, 9, 0, 0, b'x']);
        p
    }

    /// A netlink message of `NFULNL_MSG_PACKET` with `seq` and `payload`.
    fn log_message(seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut m = Msg::default();
        m.begin((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET, 0, 0);
        m.raw(&[libc::AF_INET as u8, 0, 0, 1]);
        m.attr(1, &[8, 0, 3, 0]); // NFULA_PACKET_HDR: hw_protocol 0x0800, hook 3
        m.attr(NFULA_SEQ, &seq.to_be_bytes());
        m.attr(NFULA_PAYLOAD, payload);
        m.end();
        m.buf
    }

    #[test]
    fn a_logged_datagram_names_its_destination() {
        let p = ipv4_udp([10, 1, 2, 3], [10, 1, 2, 3], 40000, 443, 5);
        let mut buf = log_message(7, &p);
        // A batch ends with NLMSG_DONE; an ACK may precede: both skipped.
        let mut done = Msg::default();
        done.begin(NLMSG_DONE, 0, 0);
        done.raw(&[0, 0, 0, 0]);
        done.end();
        buf.extend_from_slice(&done.buf);
        buf.extend_from_slice(&log_message(8, &ipv4_udp([1, 1, 1, 1], [198, 18, 0, 7], 1, 53, 6)));
        let got = parse(&buf);
        assert_eq!(
            got,
            vec![
                Ok(Logged {
                    seq: Some(7),
                    dst: "10.1.2.3:443".parse().unwrap(),
                    src: "10.1.2.3:40000".parse().unwrap()
                }),
                Ok(Logged {
                    seq: Some(8),
                    dst: "198.18.0.7:53".parse().unwrap(),
                    src: "1.1.1.1:1".parse().unwrap()
                }),
            ]
        );
    }

    #[test]
    fn bad_packets_are_errors_not_panics() {
        let good = ipv4_udp([10, 0, 0, 1], [10, 0, 0, 2], 1, 2, 5);
        assert_eq!(ip_udp(&good[..27]), Err(ParseError::Short(27)));
        assert_eq!(ip_udp(&[]), Err(ParseError::Short(0)));
        let mut tcp = good.clone();
        tcp[9] = 6;
        assert_eq!(ip_udp(&tcp), Err(ParseError::NotUdp(6)));
        let mut frag = good.clone();
        frag[7] = 1;
        assert_eq!(ip_udp(&frag), Err(ParseError::Fragment));
        let mut ihl = good.clone();
        ihl[0] = 0x44;
        assert!(matches!(ip_udp(&ihl), Err(ParseError::Short(_))));
        assert_eq!(ip_udp(&[0x50; 40]), Err(ParseError::Version(5)));
        // IPv6 + UDP.
        let mut v6 = vec![0x60, 0, 0, 0, 0, 8, 17, 64];
        v6.extend_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&"2001:db8::2".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&[0x9c, 0x40, 0x01, 0xbb, 0, 8, 0, 0]);
        assert_eq!(ip_udp(&v6).unwrap().1, "[2001:db8::2]:443".parse().unwrap());
        // No payload attribute; a message cut short.
        let mut m = Msg::default();
        m.begin((NFNL_SUBSYS_ULOG << 8) | NFULNL_MSG_PACKET, 0, 0);
        m.raw(&[2, 0, 0, 1]);
        m.end();
        assert_eq!(parse(&m.buf), vec![Err(ParseError::NoPayload)]);
        let whole = log_message(1, &good);
        assert!(matches!(parse(&whole[..whole.len() - 3])[..], [Err(ParseError::Framing(_))]));
        assert!(matches!(parse(&whole[..10])[..], [Err(ParseError::Framing(0))]));
    }

    proptest! {
        /// Whatever bytes arrive, parsing ends without a panic, and every `Ok` names a
        /// destination that is inside the bytes it was given.
        #[test]
        fn parsing_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = parse(&bytes);
            let _ = ip_udp(&bytes);
        }

        /// A well-formed IPv4 UDP packet always parses back to its addresses and ports, with
        /// any header length and any trailing bytes.
        #[test]
        fn well_formed_ipv4_roundtrips(
            src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(), sport in any::<u16>(),
            dport in any::<u16>(), ihl in 5u8..=15, seq in any::<u32>(),
        ) {
            let p = ipv4_udp(src, dst, sport, dport, ihl);
            let got = parse(&log_message(seq, &p));
            prop_assert_eq!(got, vec![Ok(Logged {
                seq: Some(seq),
                dst: SocketAddr::new(IpAddr::V4(dst.into()), dport),
                src: SocketAddr::new(IpAddr::V4(src.into()), sport),
            })]);
        }

        /// Cutting a good message anywhere never yields a wrong destination.
        #[test]
        fn truncations_are_errors(cut in 0usize..80) {
            let whole = log_message(3, &ipv4_udp([10, 1, 2, 3], [10, 1, 2, 4], 5, 6, 5));
            let cut = cut.min(whole.len() - 1);
            for r in parse(&whole[..cut]) {
                prop_assert!(r.is_err());
            }
        }
    }

    #[test]
    fn the_batch_adds_a_filter_chain_and_one_rule() {
        let (m, expect) = udp_batch();
        assert_eq!(expect, 2);
        let hay = &m.buf;
        for needle in [&b"refuse_udp\0"[..], b"filter\0", b"log\0", b"reject\0", TABLE.as_bytes()] {
            assert!(hay.windows(needle.len()).any(|w| w == needle), "{needle:?}");
        }
        // The IPv6 rule: one rule (the chain exists), ::1 as the one loopback address.
        let (m6, expect6) = udp_batch_v6();
        assert_eq!(expect6, 1);
        let hay6 = &m6.buf;
        let needles: [&[u8]; 4] =
            [b"refuse_udp\0", b"log\0", b"reject\0", &Ipv6Addr::LOCALHOST.octets()];
        for needle in needles {
            assert!(hay6.windows(needle.len()).any(|w| w == needle), "{needle:?}");
        }
        assert!(!hay6.windows(b"filter\0".len()).any(|w| w == b"filter\0"), "no new chain");
        let c = config_message();
        // nfgenmsg res_id carries the group big-endian.
        assert_eq!(&c.buf[NLMSG_HDRLEN + 2..NLMSG_HDRLEN + 4], &LOG_GROUP.to_be_bytes());
        assert_eq!(c.buf.len() % 4, 0);
    }

    /// Inner half of `udp_is_refused_and_logged_in_a_fresh_netns`.
    #[test]
    #[ignore = "run by udp_is_refused_and_logged_in_a_fresh_netns inside unshare -Urn"]
    fn inner_udp_refusal() {
        if !super::super::netfilter::inner_setup() {
            return;
        }
        super::super::netfilter::install_capture(18889).unwrap();
        install_udp_refusal().unwrap();
        let log = open_udp_log().unwrap();
        setsockopt(&log, sockopt::ReceiveTimeout, &TimeVal::new(5, 0)).unwrap();
        // Connected: the send fails at once (netfilter dropped it: EPERM), and the reject's
        // port unreachable makes the next call fail with ECONNREFUSED.
        let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
        s.connect("10.1.2.3:443").unwrap();
        let sent = s.send(b"quic?").unwrap_err();
        assert_eq!(sent.kind(), std::io::ErrorKind::PermissionDenied, "{sent}");
        s.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let e = s.recv(&mut [0u8; 16]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        let mut buf = vec![0u8; 65536];
        let n =
            nix::sys::socket::recv(log.as_raw_fd(), &mut buf, nix::sys::socket::MsgFlags::empty())
                .unwrap();
        let got = parse(&buf[..n]);
        assert_eq!(got.len(), 1, "{got:?}");
        let first = got[0].clone().unwrap();
        assert_eq!(first.dst, "10.1.2.3:443".parse().unwrap());
        assert_eq!(first.seq, Some(0));
        // Loopback UDP is left alone: a local server gets its datagram, nothing is logged.
        let srv = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let c = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        c.send_to(b"hi", srv.local_addr().unwrap()).unwrap();
        srv.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 4];
        let (_, from) = srv.recv_from(&mut b).unwrap();
        assert!(from.ip().is_loopback());
        // An unconnected sendto is logged too (seq 1: nothing in between was logged).
        let e = c.send_to(b"y", "192.0.2.9:9").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        let n =
            nix::sys::socket::recv(log.as_raw_fd(), &mut buf, nix::sys::socket::MsgFlags::empty())
                .unwrap();
        let got = parse(&buf[..n]);
        assert_eq!(
            got,
            vec![Ok(Logged {
                seq: Some(1),
                dst: "192.0.2.9:9".parse().unwrap(),
                src: c.local_addr().unwrap(),
            })]
        );
        // IPv6, where the IPv6 capture routes every address to `lo`: refused and logged the
        // same way (seq 2); [::1] is left alone.
        install_udp_refusal_v6().unwrap();
        super::super::netfilter::install_capture_v6(18889).unwrap();
        let c6 = std::net::UdpSocket::bind("[::]:0").unwrap();
        let e = c6.send_to(b"q", "[2001:db8::1]:443").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        let n =
            nix::sys::socket::recv(log.as_raw_fd(), &mut buf, nix::sys::socket::MsgFlags::empty())
                .unwrap();
        let got = parse(&buf[..n]);
        assert_eq!(got.len(), 1, "{got:?}");
        let first = got[0].clone().unwrap();
        assert_eq!((first.seq, first.dst), (Some(2), "[2001:db8::1]:443".parse().unwrap()));
        let srv6 = std::net::UdpSocket::bind("[::1]:0").unwrap();
        c6.send_to(b"hi", srv6.local_addr().unwrap()).unwrap();
        srv6.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let (_, from) = srv6.recv_from(&mut b).unwrap();
        assert!(from.ip().is_loopback());
    }

    #[test]
    fn udp_is_refused_and_logged_in_a_fresh_netns() {
        super::super::netfilter::run_in_fresh_netns("sys::nflog::tests::inner_udp_refusal");
    }
}
