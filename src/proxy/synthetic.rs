//! Synthetic addresses (issue 14): the sandbox's resolver answers an allowed name with an
//! address from `198.18.0.0/15` (RFC 2544's benchmarking range, never routed on the internet,
//! RFC 6890) that this module assigns and remembers for the session. When such an address comes
//! back as a CONNECT target, a `Host`/absolute-form URL host or (later) a transparently captured
//! destination, [`SyntheticTable::map_back`] turns it into the name it stands for, so the policy,
//! the resolver and the address guard see the name — real resolution happens only then, on the
//! host, per connection.
//!
//! The table is per session, stable for its life (a name keeps its address) and bounded
//! ([`SyntheticTable::new`]'s capacity; past it the resolver answers SERVFAIL with reason
//! `dns_limit`). Each session starts at a random offset in the range, so two sessions rarely
//! share addresses; an address in the range that this session did not hand out is refused
//! whatever another session meant by it. A collision with another session's address can only
//! ever map to a name this session's own policy allowed, so it widens nothing.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;

use crate::policy::Host;

/// `198.18.0.0/15`: the first address and the range's size.
const BASE: u32 = u32::from_be_bytes([198, 18, 0, 0]);
const SIZE: u32 = 1 << 17;

/// Default capacity: distinct names one session may resolve.
pub const DEFAULT_CAPACITY: usize = 4096;

/// Whether `ip` lies in `198.18.0.0/15` (IPv4, or IPv4-mapped IPv6).
pub fn in_range(ip: IpAddr) -> bool {
    let v4 = match ip {
        IpAddr::V4(v4) => v4,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4,
            None => return false,
        },
    };
    u32::from(v4).wrapping_sub(BASE) < SIZE
}

/// The refusal's detail for an address of the range this session did not hand out.
pub const FOREIGN_DETAIL: &str = "198.18.0.0/15 is the sandbox's synthetic range and this \
    session's resolver never answered with this address; connect by name";

/// What a target host turned into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MapBack {
    /// Not a synthetic address: decide the host as it is.
    Unchanged(Host),
    /// A synthetic address of this session: the name it stands for.
    Name { name: Host, addr: Ipv4Addr },
    /// In the synthetic range but not handed out by this session: refuse.
    Foreign(Ipv4Addr),
}

/// The table is full; the name got no address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the session's synthetic address table is full ({0} names)")]
pub struct TableFull(pub usize);

#[derive(Debug, Default)]
struct Inner {
    by_name: HashMap<String, Ipv4Addr>,
    by_addr: HashMap<Ipv4Addr, String>,
    /// Offset of the next candidate from `BASE`.
    next: u32,
}

/// One session's name ↔ synthetic address table.
#[derive(Debug)]
pub struct SyntheticTable {
    inner: Mutex<Inner>,
    capacity: usize,
}

impl SyntheticTable {
    /// A table for at most `capacity` names, starting at a random offset (a fixed one if the
    /// system has no randomness: only the cross-session spread suffers).
    pub fn new(capacity: usize) -> Self {
        let mut b = [0u8; 4];
        let start = match getrandom::fill(&mut b) {
            Ok(()) => u32::from_le_bytes(b) % SIZE,
            Err(_) => 0,
        };
        Self::starting_at(capacity, start)
    }

    fn starting_at(capacity: usize, start: u32) -> Self {
        let capacity = capacity.min(SIZE as usize / 2);
        Self { inner: Mutex::new(Inner { next: start % SIZE, ..Inner::default() }), capacity }
    }

    /// The address of `name` (canonical, lowercase), assigning the next free one the first
    /// time. Addresses ending in `.0` or `.255` are skipped (some tools treat them as network
    /// or broadcast addresses).
    pub fn assign(&self, name: &str) -> Result<Ipv4Addr, TableFull> {
        let mut t = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(a) = t.by_name.get(name) {
            return Ok(*a);
        }
        if t.by_name.len() >= self.capacity {
            return Err(TableFull(self.capacity));
        }
        // At most half the range is ever used (capacity clamp), so a free candidate is found
        // within SIZE steps.
        for _ in 0..SIZE {
            let addr = Ipv4Addr::from(BASE + t.next);
            t.next = (t.next + 1) % SIZE;
            let last = addr.octets()[3];
            if last == 0 || last == 255 || t.by_addr.contains_key(&addr) {
                continue;
            }
            t.by_name.insert(name.to_owned(), addr);
            t.by_addr.insert(addr, name.to_owned());
            return Ok(addr);
        }
        Err(TableFull(self.capacity))
    }

    /// The name a synthetic address of this session stands for.
    pub fn name_of(&self, addr: Ipv4Addr) -> Option<String> {
        let t = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        t.by_addr.get(&addr).cloned()
    }

    /// The lookup the proxy calls where it parses a target (and transparent capture will
    /// call with the original destination).
    pub fn map_back(&self, host: Host) -> MapBack {
        let Host::Ip(ip) = host else { return MapBack::Unchanged(host) };
        if !in_range(ip) {
            return MapBack::Unchanged(host);
        }
        let v4 = match ip {
            IpAddr::V4(v4) => v4,
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => v4,
                None => return MapBack::Unchanged(host),
            },
        };
        match self.name_of(v4) {
            Some(name) => MapBack::Name { name: Host::Name(name), addr: v4 },
            None => MapBack::Foreign(v4),
        }
    }

    /// [`Self::map_back`] for a target: the host to decide, or the foreign synthetic address
    /// to refuse (with [`FOREIGN_DETAIL`]).
    pub fn target(&self, host: Host) -> Result<Host, Ipv4Addr> {
        match self.map_back(host) {
            MapBack::Unchanged(h) | MapBack::Name { name: h, .. } => Ok(h),
            MapBack::Foreign(a) => Err(a),
        }
    }

    pub fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner).by_name.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Default for SyntheticTable {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_range_is_198_18_slash_15() {
        for (ip, inside) in [
            ("198.18.0.0", true),
            ("198.19.255.255", true),
            ("198.17.255.255", false),
            ("198.20.0.0", false),
            ("::ffff:198.18.3.4", true),
            ("2001:db8::1", false),
        ] {
            assert_eq!(in_range(ip.parse().unwrap()), inside, "{ip}");
        }
    }

    #[test]
    fn names_keep_their_address_and_map_back() {
        let t = SyntheticTable::new(8);
        let a = t.assign("a.test").unwrap();
        let b = t.assign("b.test").unwrap();
        assert_ne!(a, b);
        assert_eq!(t.assign("a.test").unwrap(), a);
        assert!(in_range(IpAddr::V4(a)) && in_range(IpAddr::V4(b)));
        assert_eq!(
            t.map_back(Host::Ip(IpAddr::V4(a))),
            MapBack::Name { name: Host::Name("a.test".into()), addr: a }
        );
        let mapped: IpAddr = format!("::ffff:{b}").parse().unwrap();
        assert!(matches!(t.map_back(Host::Ip(mapped)), MapBack::Name { .. }));
        let name = Host::Name("c.test".into());
        assert_eq!(t.map_back(name.clone()), MapBack::Unchanged(name));
        let real = Host::Ip("127.0.0.1".parse().unwrap());
        assert_eq!(t.map_back(real.clone()), MapBack::Unchanged(real));
    }

    #[test]
    fn another_sessions_address_is_foreign() {
        let mine = SyntheticTable::starting_at(8, 0);
        let theirs = SyntheticTable::starting_at(8, 1000);
        mine.assign("a.test").unwrap();
        let other = theirs.assign("a.test").unwrap();
        assert_eq!(mine.map_back(Host::Ip(IpAddr::V4(other))), MapBack::Foreign(other));
    }

    #[test]
    fn the_table_is_bounded_and_skips_dot_0_and_dot_255() {
        let t = SyntheticTable::starting_at(3, 254);
        let got: Vec<_> = ["a", "b", "c"].iter().map(|n| t.assign(n).unwrap()).collect();
        assert_eq!(
            got.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
            ["198.18.0.254", "198.18.1.1", "198.18.1.2"]
        );
        assert_eq!(t.assign("d"), Err(TableFull(3)));
        assert_eq!(t.assign("a").unwrap(), got[0], "a known name still answers when full");
        // Wrapping at the end of the range.
        let w = SyntheticTable::starting_at(2, SIZE - 2);
        assert_eq!(w.assign("x").unwrap().to_string(), "198.19.255.254");
        assert_eq!(w.assign("y").unwrap().to_string(), "198.18.0.1");
    }
}
