//! The Docker backend's host-side wall: an nftables rule in the **engine host's** network
//! namespace that drops every packet the host receives from a repo's internal bridge, set up
//! through netlink (no `nft` binary needed). `airlockd bridge-guard` runs it inside a
//! short-lived helper container (`--network host --cap-add NET_ADMIN`), since a docker-group
//! user has no root on the host; the equivalent of
//!
//! ```text
//! nft add table inet airlock-guard-BRIDGE
//! nft delete table inet airlock-guard-BRIDGE      # (in one batch: replaces an older copy)
//! nft add table inet airlock-guard-BRIDGE
//! nft add chain inet airlock-guard-BRIDGE input '{ type filter hook input priority 0; }'
//! nft add rule inet airlock-guard-BRIDGE input iifname "BRIDGE" drop
//! ```
//!
//! Docker 20.10's `--internal` network gives its bridge an address on the engine host and
//! routes the sandbox to it: every host service listening on 0.0.0.0 answered (measured,
//! docs/backends.md). `inhibit_ipv4` takes that address away; this rule is the second,
//! independent wall — it also holds for the bridge's IPv6 link-local address and for an
//! address someone adds to the bridge later. Only the **input** hook: traffic between the
//! sandbox and its proxy is bridged, and with `br_netfilter` loaded (Docker loads it) bridged
//! IPv4 passes the forward hook with the bridge as its input device — a forward rule would
//! cut the sandbox off its proxy.
//!
//! `nft --debug=netlink` for the rule (the name is compared over all of IFNAMSIZ, zero-padded):
//!
//! ```text
//! [ meta load iifname => reg 1 ]
//! [ cmp eq reg 1 0x2d6b6c61 0x61616161 0x61616161 0x00000000 ]
//! [ immediate reg 0 drop ]
//! ```
//!
//! Everything here uses nix's safe socket calls: no `unsafe`.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, bind, recv, send,
    setsockopt, sockopt,
};
use nix::sys::time::TimeVal;

use super::netfilter::{
    CaptureError, Msg, NFNL_MSG_BATCH_BEGIN, NFNL_MSG_BATCH_END, NFNL_SUBSYS_NFTABLES,
    NFPROTO_INET, NFT_CMP_EQ, NFT_MSG_NEWCHAIN, NFT_MSG_NEWRULE, NFT_MSG_NEWTABLE, NFTA_CHAIN_HOOK,
    NFTA_CHAIN_NAME, NFTA_CHAIN_TABLE, NFTA_CHAIN_TYPE, NFTA_HOOK_HOOKNUM, NFTA_HOOK_PRIORITY,
    NFTA_IMMEDIATE_DATA, NFTA_IMMEDIATE_DREG, NFTA_RULE_CHAIN, NFTA_RULE_EXPRESSIONS,
    NFTA_RULE_TABLE, NFTA_TABLE_NAME, NLM_F_ACK, NLM_F_APPEND, NLM_F_CREATE, NLM_F_REQUEST,
    NLMSG_ERROR, NLMSG_HDRLEN, batch_marker, cmp, expr, meta, nft_begin, transact, word,
};

/// The chain in each guard table.
pub const CHAIN: &str = "input";
/// `IFNAMSIZ` (include/uapi/linux/if.h): a device name is at most 15 bytes and a NUL.
const IFNAMSIZ: usize = 16;

const NFT_MSG_DELTABLE: u16 = 2;
const NFT_MSG_GETRULE: u16 = 7;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_DONE: u16 = 3;
const NF_INET_LOCAL_IN: u32 = 1;
const NFT_META_IIFNAME: u32 = 6;
const NFT_REG_VERDICT: u32 = 0;
const NFTA_DATA_VERDICT: u16 = 2;
const NFTA_VERDICT_CODE: u16 = 1;
/// `NFTA_DATA_VALUE` (nf_tables.h `enum nft_data_attributes`).
const NFTA_DATA_VALUE: u16 = 1;
/// `NF_DROP` (include/uapi/linux/netfilter.h).
const NF_DROP: u32 = 0;

const HINT: &str = " (the bridge guard needs CAP_NET_ADMIN in the engine host's network \
namespace — run it with `--network host --cap-add NET_ADMIN` as root in the container — and \
nf_tables with the inet family: CONFIG_NF_TABLES, CONFIG_NF_TABLES_INET)";

/// Why a bridge name is refused: it must be a device name the kernel could hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{0:?} is not a network device name (1 to 15 of the characters a-z A-Z 0-9 _ . -, as \
     Airlock names its bridges: alk-<key8>)"
)]
pub struct BadBridgeName(pub String);

/// Checks `name` as a device name (netdevice(7); `dev_valid_name` refuses `/`, `:`, white
/// space and more than 15 bytes — this is stricter, so a name is also safe in messages).
pub fn check_name(name: &str) -> Result<(), BadBridgeName> {
    let ok = !name.is_empty()
        && name.len() < IFNAMSIZ
        && name != "."
        && name != ".."
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok { Ok(()) } else { Err(BadBridgeName(name.to_owned())) }
}

/// The table that holds `bridge`'s rule.
pub fn table(bridge: &str) -> String {
    format!("airlock-guard-{bridge}")
}

/// `bridge` zero-padded to IFNAMSIZ, as the rule compares it.
fn padded(bridge: &str) -> [u8; IFNAMSIZ] {
    let mut name = [0u8; IFNAMSIZ];
    let n = bridge.len().min(IFNAMSIZ - 1);
    name[..n].copy_from_slice(&bridge.as_bytes()[..n]);
    name
}

/// The batch that (re)makes `bridge`'s table with its one rule, atomically: a table from an
/// earlier run is replaced, never doubled. Returns it with the number of messages that ask
/// for an ACK.
fn install_batch(bridge: &str) -> (Msg, u32) {
    let table = table(bridge);
    let mut m = Msg::default();
    let mut seq = 1;
    batch_marker(&mut m, NFNL_MSG_BATCH_BEGIN, seq);
    let create = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE;
    // add (no EXCL: an existing one is fine), delete, add: the `nft -f` idiom for "replace".
    for (msg, flags) in [
        (NFT_MSG_NEWTABLE, create),
        (NFT_MSG_DELTABLE, NLM_F_REQUEST | NLM_F_ACK),
        (NFT_MSG_NEWTABLE, create),
    ] {
        seq += 1;
        nft_begin(&mut m, msg, flags, seq, NFPROTO_INET);
        m.str(NFTA_TABLE_NAME, &table);
        m.end();
    }

    seq += 1;
    nft_begin(&mut m, NFT_MSG_NEWCHAIN, create, seq, NFPROTO_INET);
    m.str(NFTA_CHAIN_TABLE, &table);
    m.str(NFTA_CHAIN_NAME, CHAIN);
    m.nest(NFTA_CHAIN_HOOK, |m| {
        m.be32(NFTA_HOOK_HOOKNUM, NF_INET_LOCAL_IN);
        // NF_IP_PRI_FILTER: a drop in any base chain is final, whatever the priority.
        m.attr(NFTA_HOOK_PRIORITY, &0i32.to_be_bytes());
    });
    m.str(NFTA_CHAIN_TYPE, "filter");
    m.end();

    seq += 1;
    nft_begin(&mut m, NFT_MSG_NEWRULE, create | NLM_F_APPEND, seq, NFPROTO_INET);
    m.str(NFTA_RULE_TABLE, &table);
    m.str(NFTA_RULE_CHAIN, CHAIN);
    m.nest(NFTA_RULE_EXPRESSIONS, |m| {
        meta(m, NFT_META_IIFNAME);
        cmp(m, NFT_CMP_EQ, &padded(bridge));
        expr(m, "immediate", |m| {
            m.be32(NFTA_IMMEDIATE_DREG, NFT_REG_VERDICT);
            m.nest(NFTA_IMMEDIATE_DATA, |m| {
                m.nest(NFTA_DATA_VERDICT, |m| m.be32(NFTA_VERDICT_CODE, NF_DROP))
            });
        });
    });
    m.end();

    seq += 1;
    batch_marker(&mut m, NFNL_MSG_BATCH_END, seq);
    (m, 5)
}

/// Puts `bridge`'s drop rule in place in the **current** network namespace (replacing an
/// earlier copy). Needs CAP_NET_ADMIN there.
pub fn install(bridge: &str) -> Result<(), CaptureError> {
    let (batch, expect) = install_batch(bridge);
    transact(
        SockProtocol::NetlinkNetFilter,
        &batch,
        2,
        expect,
        "adding the bridge's nftables drop rule",
        HINT,
    )
}

/// Whether `bridge`'s drop rule is in the **current** network namespace: a dump of the guard
/// table's input chain holds a rule that names the bridge. Needs CAP_NET_ADMIN there (the
/// kernel refuses any nf_tables request without it).
pub fn present(bridge: &str) -> Result<bool, CaptureError> {
    let table = table(bridge);
    let mut m = Msg::default();
    nft_begin(&mut m, NFT_MSG_GETRULE, NLM_F_REQUEST | NLM_F_DUMP, 1, NFPROTO_INET);
    m.str(NFTA_RULE_TABLE, &table);
    m.str(NFTA_RULE_CHAIN, CHAIN);
    m.end();
    let what = "reading the bridge's nftables rules";
    let io = |e: nix::errno::Errno| CaptureError::Io { what, source: e.into() };
    let fd: OwnedFd = nix::sys::socket::socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkNetFilter,
    )
    .map_err(io)?;
    bind(fd.as_raw_fd(), &NetlinkAddr::new(0, 0)).map_err(io)?;
    setsockopt(&fd, sockopt::ReceiveTimeout, &TimeVal::new(5, 0)).map_err(io)?;
    send(fd.as_raw_fd(), &m.buf, MsgFlags::empty()).map_err(io)?;
    let rule_type = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWRULE;
    let mut found = false;
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = recv(fd.as_raw_fd(), &mut buf, MsgFlags::empty()).map_err(io)?;
        if n == 0 {
            return Ok(found);
        }
        let mut off = 0;
        while off + NLMSG_HDRLEN <= n {
            let len = u32::from_ne_bytes(word(&buf, off)) as usize;
            let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
            if len < NLMSG_HDRLEN || off + len > n {
                return Ok(found);
            }
            let body = &buf[off + NLMSG_HDRLEN..off + len];
            match ty {
                NLMSG_DONE => return Ok(found),
                NLMSG_ERROR if body.len() >= 4 => {
                    let code = i32::from_ne_bytes(word(body, 0));
                    match nix::errno::Errno::from_raw(-code) {
                        // No such table or chain: no rule.
                        nix::errno::Errno::ENOENT => return Ok(false),
                        _ if code == 0 => {}
                        errno => return Err(CaptureError::Refused { what, errno, hint: HINT }),
                    }
                }
                t if t == rule_type => found |= is_the_drop_rule(body, &table, bridge),
                _ => {}
            }
            off += len.next_multiple_of(4);
        }
    }
}

/// Whether a dumped rule (`body`: nfgenmsg and attributes) is the guard's: in `table`, with a
/// `cmp` whose data is exactly the padded bridge name (the NLA header of a 16-byte
/// `NFTA_DATA_VALUE` before it, so the table's own name, which ends in the bridge's, cannot
/// stand in for it) and an `immediate` drop verdict.
fn is_the_drop_rule(body: &[u8], table: &str, bridge: &str) -> bool {
    let mut value = Vec::with_capacity(4 + IFNAMSIZ);
    value.extend_from_slice(&((4 + IFNAMSIZ) as u16).to_ne_bytes());
    value.extend_from_slice(&NFTA_DATA_VALUE.to_ne_bytes());
    value.extend_from_slice(&padded(bridge));
    let mut verdict = Vec::with_capacity(8);
    verdict.extend_from_slice(&8u16.to_ne_bytes());
    verdict.extend_from_slice(&NFTA_VERDICT_CODE.to_ne_bytes());
    verdict.extend_from_slice(&NF_DROP.to_be_bytes());
    let mut table_attr = table.as_bytes().to_vec();
    table_attr.push(0);
    contains(body, &table_attr)
        && contains(body, &value)
        && contains(body, b"immediate\0")
        && contains(body, &verdict)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The attributes after a message's nfgenmsg, as (type, payload) pairs.
    fn messages(buf: &[u8]) -> Vec<(u16, Vec<u8>)> {
        let mut out = Vec::new();
        let mut off = 0;
        while off + NLMSG_HDRLEN <= buf.len() {
            let len = u32::from_ne_bytes(word(buf, off)) as usize;
            let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
            out.push((ty, buf[off + NLMSG_HDRLEN..off + len].to_vec()));
            off += len.next_multiple_of(4);
        }
        out
    }

    #[test]
    fn the_batch_replaces_the_table_then_drops_input_from_the_bridge_alone() {
        let (m, expect) = install_batch("alk-0123abcd");
        let msgs = messages(&m.buf);
        let nft = |t: u16| (NFNL_SUBSYS_NFTABLES << 8) | t;
        let types: Vec<u16> = msgs.iter().map(|(t, _)| *t).collect();
        assert_eq!(
            types,
            [
                NFNL_MSG_BATCH_BEGIN,
                nft(NFT_MSG_NEWTABLE),
                nft(NFT_MSG_DELTABLE),
                nft(NFT_MSG_NEWTABLE),
                nft(NFT_MSG_NEWCHAIN),
                nft(NFT_MSG_NEWRULE),
                NFNL_MSG_BATCH_END
            ]
        );
        assert_eq!(expect, 5, "every message between the markers asks for an ACK");
        let rule = &msgs[5].1;
        assert!(contains(rule, b"airlock-guard-alk-0123abcd\0"));
        // The name compared over all 16 bytes: "alk-0123abc" (a prefix) must not match.
        assert!(contains(rule, b"alk-0123abcd\0\0\0\0"));
        assert!(contains(rule, b"immediate\0"));
        // What the dump check looks for is in the batch's rule, and a name that only the
        // table carries (a longer bridge) is not mistaken for it.
        assert!(is_the_drop_rule(rule, "airlock-guard-alk-0123abcd", "alk-0123abcd"));
        assert!(!is_the_drop_rule(rule, "airlock-guard-alk-0123abcd", "alk-0123abc"));
        let (long, _) = install_batch("alk-0123abcdefg");
        let long_rule = &messages(&long.buf)[5].1;
        assert!(is_the_drop_rule(long_rule, "airlock-guard-alk-0123abcdefg", "alk-0123abcdefg"));
        let mut no_rule = b"airlock-guard-alk-0123abcdefg\0".to_vec();
        no_rule.extend_from_slice(&padded("alk-0123abcdefg"));
        assert!(!is_the_drop_rule(&no_rule, "airlock-guard-alk-0123abcdefg", "alk-0123abcdefg"));
        let chain = &msgs[4].1;
        assert!(contains(chain, b"filter\0"));
        assert!(contains(chain, &NF_INET_LOCAL_IN.to_be_bytes()), "the input hook");
    }

    #[test]
    fn only_device_names_are_accepted() {
        assert_eq!(check_name("alk-0123abcd"), Ok(()));
        assert_eq!(check_name("docker0"), Ok(()));
        for bad in ["", ".", "..", "a/b", "a b", "eth0:1", "sixteen-bytes-xx", "-1\n"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}
