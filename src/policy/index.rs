//! Match indexes whose cost does not grow with the number of entries.
//!
//! - [`NameIndex`]: a hash map keyed by the entry's canonical name. A lookup walks the target's
//!   suffixes (`a.b.example.com`, `b.example.com`, `example.com`, `com`): O(labels) hash probes.
//! - [`PrefixIndex`]: one hash map per prefix length present, keyed by the masked address; a
//!   lookup probes each length present, longest first: at most 33 (IPv4) or 129 (IPv6) probes.
//!
//! Each bucket is pre-sorted so the first rule that covers the port is the most specific:
//! `=name` before `name`, an explicit port before `:*` before no port, then file order.

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;

use super::entry::{EntryKind, NameMatch, PortSpec, port_covers};

/// Index of an entry in the policy's rule table.
pub(crate) type RuleId = u32;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Rule {
    pub how: NameMatch,
    pub port: PortSpec,
    pub kind: EntryKind,
    pub id: RuleId,
}

fn port_rank(p: PortSpec) -> u8 {
    match p {
        PortSpec::Port(_) => 0,
        PortSpec::Any => 1,
        PortSpec::Default => 2,
    }
}

/// `=name` first (it only ever meets `name` at the full-name key); `name` and `*.name` are equally
/// specific at a suffix key, so the port decides, then file order.
fn sort_key(r: &Rule) -> (bool, u8, RuleId) {
    (r.how != NameMatch::Exact, port_rank(r.port), r.id)
}

#[derive(Debug, Default)]
pub(crate) struct NameIndex {
    map: HashMap<Box<str>, Vec<Rule>>,
}

impl NameIndex {
    pub fn insert(&mut self, name: &str, rule: Rule) {
        let bucket = self.map.entry(name.into()).or_default();
        bucket.push(rule);
    }

    /// Sort every bucket once all rules are in.
    pub fn finish(&mut self) {
        self.map.values_mut().for_each(|b| b.sort_by_key(sort_key));
    }

    /// The most specific rule covering `(name, port)`: the full name first (`=name`, `name`),
    /// then each shorter suffix (`name`, `*.name`).
    pub fn find(&self, name: &str, port: u16) -> Option<Rule> {
        let mut suffix = name;
        let mut full = true;
        loop {
            if let Some(bucket) = self.map.get(suffix) {
                let hit = bucket.iter().find(|r| {
                    let name_ok = match r.how {
                        NameMatch::Exact => full,
                        NameMatch::Tree => true,
                        NameMatch::Subdomains => !full,
                    };
                    name_ok && port_covers(r.port, r.kind, port)
                });
                if let Some(r) = hit {
                    return Some(*r);
                }
            }
            match suffix.split_once('.') {
                Some((_, rest)) => {
                    suffix = rest;
                    full = false;
                }
                None => return None,
            }
        }
    }
}

#[derive(Debug, Default)]
pub(crate) struct PrefixIndex {
    /// Longest prefix first.
    v4: Vec<(u8, HashMap<u32, Vec<Rule>>)>,
    v6: Vec<(u8, HashMap<u128, Vec<Rule>>)>,
}

fn mask32(a: u32, len: u8) -> u32 {
    if len == 0 { 0 } else { a & (u32::MAX << (32 - u32::from(len))) }
}

fn mask128(a: u128, len: u8) -> u128 {
    if len == 0 { 0 } else { a & (u128::MAX << (128 - u32::from(len))) }
}

fn bucket_for<K: std::hash::Hash + Eq>(
    levels: &mut Vec<(u8, HashMap<K, Vec<Rule>>)>,
    len: u8,
) -> &mut HashMap<K, Vec<Rule>> {
    let pos = match levels.binary_search_by(|(l, _)| len.cmp(l)) {
        Ok(pos) => pos,
        Err(pos) => {
            levels.insert(pos, (len, HashMap::new()));
            pos
        }
    };
    &mut levels[pos].1
}

impl PrefixIndex {
    pub fn insert(&mut self, net: IpNet, rule: Rule) {
        let len = net.prefix_len();
        let bucket = match net {
            IpNet::V4(n) => {
                bucket_for(&mut self.v4, len).entry(mask32(u32::from(n.addr()), len)).or_default()
            }
            IpNet::V6(n) => {
                bucket_for(&mut self.v6, len).entry(mask128(u128::from(n.addr()), len)).or_default()
            }
        };
        bucket.push(rule);
    }

    /// Sort every bucket once all rules are in.
    pub fn finish(&mut self) {
        for (_, m) in &mut self.v4 {
            m.values_mut().for_each(|b| b.sort_by_key(sort_key));
        }
        for (_, m) in &mut self.v6 {
            m.values_mut().for_each(|b| b.sort_by_key(sort_key));
        }
    }

    /// The most specific rule whose range contains `ip` and whose port covers `port`.
    pub fn find(&self, ip: IpAddr, port: u16) -> Option<Rule> {
        self.find_by(ip, |r| port_covers(r.port, r.kind, port))
    }

    /// The most specific rule whose range contains `ip`, whatever its port.
    pub fn find_any_port(&self, ip: IpAddr) -> Option<Rule> {
        self.find_by(ip, |_| true)
    }

    fn find_by(&self, ip: IpAddr, ok: impl Fn(&Rule) -> bool) -> Option<Rule> {
        let pick = |bucket: &Vec<Rule>| bucket.iter().find(|r| ok(r)).copied();
        match ip {
            IpAddr::V4(a) => {
                let a = u32::from(a);
                self.v4.iter().find_map(|(len, m)| m.get(&mask32(a, *len)).and_then(pick))
            }
            IpAddr::V6(a) => {
                let a = u128::from(a);
                self.v6.iter().find_map(|(len, m)| m.get(&mask128(a, *len)).and_then(pick))
            }
        }
    }
}
