//! The host's own addresses for the address guard, kept current: one process-wide
//! [`HostAddrs`] cell that a watcher thread re-reads ([`super::local_addrs`], getifaddrs(3))
//! whenever the kernel announces an address change on an rtnetlink subscription
//! ([`crate::sys::rtnetlink`]), debounced. Every session's guard reads the cell per connection
//! attempt, so an address added after a session started (a VPN coming up, DHCP renewing) is
//! refused from the next attempt on, not from the next session on.
//!
//! The subscription is made before the first read, so no change between the two is missed.
//! Where netlink is unavailable (or the watcher's socket fails later) the cell says it is not
//! watched and each session start re-reads it ([`HostAddrs::refresh_unless_watched`]) — the
//! behaviour before the watcher existed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crate::policy::LocalAddrs;
use crate::sys::rtnetlink::{AddrNotices, Notice};

/// After a change, further notices within this much quiet are folded into one re-read (one
/// `ip addr add` sends one notice; an interface coming up sends a burst).
pub const DEBOUNCE: Duration = Duration::from_millis(50);
/// A burst longer than this still gets a re-read: a steady stream of notices must not keep
/// the set stale.
pub const MAX_DEBOUNCE: Duration = Duration::from_secs(1);

/// The current set of host addresses, shared by every session of the process.
#[derive(Debug, Default)]
pub struct HostAddrs {
    current: RwLock<Arc<LocalAddrs>>,
    /// A watcher keeps `current` up to date.
    watched: AtomicBool,
}

impl HostAddrs {
    /// A cell holding `addrs` that nothing updates (tests, and [`super::SessionProxy::new`]).
    pub fn fixed(addrs: LocalAddrs) -> Arc<Self> {
        Arc::new(Self { current: RwLock::new(Arc::new(addrs)), watched: AtomicBool::new(false) })
    }

    /// The set now (one read lock and an `Arc` clone: cheap per connection attempt).
    pub fn current(&self) -> Arc<LocalAddrs> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Replaces the set.
    pub fn publish(&self, addrs: LocalAddrs) {
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(addrs);
    }

    /// Whether a watcher keeps this cell current.
    pub fn is_watched(&self) -> bool {
        self.watched.load(Ordering::SeqCst)
    }

    /// Without a watcher: re-reads the set now (a session start). Blocking (getifaddrs).
    pub fn refresh_unless_watched(&self) {
        if !self.is_watched() {
            self.publish(super::local_addrs());
        }
    }
}

/// The process-wide cell, its watcher started on first use (in the caller's network
/// namespace: the daemon's and the standalone proxy's own). Blocking on first use.
pub fn watched() -> Arc<HostAddrs> {
    static CELL: OnceLock<Arc<HostAddrs>> = OnceLock::new();
    Arc::clone(CELL.get_or_init(start))
}

fn start() -> Arc<HostAddrs> {
    let notices = AddrNotices::open();
    // Subscribed first, read second: a change in between is announced on the socket.
    let cell = HostAddrs::fixed(super::local_addrs());
    match notices {
        Ok(notices) => {
            cell.watched.store(true, Ordering::SeqCst);
            let c = Arc::clone(&cell);
            let spawned = std::thread::Builder::new()
                .name("airlock-host-addrs".into())
                .spawn(move || watch(notices, &c));
            if let Err(e) = spawned {
                cell.watched.store(false, Ordering::SeqCst);
                tracing::warn!(
                    "cannot start the host-address watcher ({e}); host addresses are re-read \
                     at each session start instead"
                );
            }
        }
        Err(e) => tracing::warn!(
            "cannot subscribe to address changes (rtnetlink: {e}); host addresses are re-read \
             at each session start instead"
        ),
    }
    cell
}

/// The watcher thread: on each change, waits for quiet ([`DEBOUNCE`], at most
/// [`MAX_DEBOUNCE`]) and publishes a fresh read. Returns only when the socket fails.
fn watch(mut notices: AddrNotices, cell: &HostAddrs) {
    loop {
        match notices.next(None) {
            Ok(Notice::Changed) => {}
            Ok(_) => continue,
            Err(e) => return stop_watching(cell, &e),
        }
        let until = Instant::now() + MAX_DEBOUNCE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            match notices.next(Some(DEBOUNCE.min(left))) {
                Ok(Notice::Quiet) => break,
                Ok(_) => {}
                Err(e) => {
                    cell.publish(super::local_addrs());
                    return stop_watching(cell, &e);
                }
            }
        }
        let fresh = super::local_addrs();
        tracing::debug!(?fresh, "host addresses changed; the address guard uses the new set");
        cell.publish(fresh);
    }
}

fn stop_watching(cell: &HostAddrs, e: &std::io::Error) {
    cell.watched.store(false, Ordering::SeqCst);
    tracing::warn!(
        "the host-address watcher stopped (rtnetlink: {e}); host addresses are re-read at each \
         session start instead"
    );
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_cell_hands_out_snapshots_and_publish_replaces_them() {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().unwrap();
        let cell = HostAddrs::fixed(LocalAddrs::none());
        let before = cell.current();
        assert!(!before.contains(ip("93.184.216.34")));
        cell.publish(LocalAddrs::new(vec![ip("93.184.216.34")]));
        assert!(cell.current().contains(ip("93.184.216.34")));
        // A snapshot taken earlier is unchanged (an attempt decides on one set).
        assert!(!before.contains(ip("93.184.216.34")));
        // Not watched: a session start re-reads the real set.
        assert!(!cell.is_watched());
        cell.refresh_unless_watched();
        assert!(!cell.current().contains(ip("93.184.216.34")));
    }
}
