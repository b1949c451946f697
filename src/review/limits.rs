//! Fairness and limits of the review plane (issue 13, point 5): the ingest slots with their
//! per-user share, the per-token and per-peer token buckets, the accept loop's backoff on
//! `EMFILE`, and the configuration ([`LimitsConfig`]) that `airlockd review`'s flags fill.
//!
//! Everything here is pure: time comes in as an [`Instant`] argument (the unit tests pass a
//! fake clock), and nothing sleeps or does I/O. The server ([`super::server`]) applies them;
//! docs/api.md ("Limits") and docs/review.md ("Fairness and limits") describe the answers.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Default global ingest slots (`--ingest-concurrency`).
pub const INGEST_CONCURRENCY: usize = 8;
/// Default ingest slots one user may hold (`--ingest-concurrency-per-user`).
pub const INGEST_CONCURRENCY_PER_USER: usize = 2;
/// Default time for a request's headers to arrive, and for a keep-alive connection to send its
/// next request (`--header-timeout`).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// Default time for an ingest body to arrive (`--body-timeout`).
pub const BODY_TIMEOUT: Duration = Duration::from_secs(60);
/// Default open connections (`--max-connections`); past it, new ones wait in the kernel's
/// accept queue.
pub const MAX_CONNECTIONS: usize = 1024;
/// Default per-token rate (`--rate-limit-per-token`, `--rate-limit-burst`): far above what
/// `airlock publish` sends (one batch of up to 1,000 lines at a time per host).
pub const TOKEN_RATE: Rate = Rate { per_sec: 50.0, burst: 100 };
/// Default rate of failed authentications per peer address (`--auth-failure-rate`,
/// `--auth-failure-burst`): a mistyped token costs nothing, a guessing loop gets one try a
/// second.
pub const AUTH_FAILURE_RATE: Rate = Rate { per_sec: 1.0, burst: 30 };
/// Keys one rate limiter tracks; past it, refilled buckets are forgotten first, and a new key
/// is refused while none can be.
pub const MAX_TRACKED_KEYS: usize = 65_536;

/// A token bucket's parameters: `burst` requests at once, refilled at `per_sec`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rate {
    pub per_sec: f64,
    pub burst: u32,
}

/// The server's limits, from `airlockd review`'s flags (defaults are the constants above).
#[derive(Debug, Clone, PartialEq)]
pub struct LimitsConfig {
    pub ingest_concurrency: usize,
    pub ingest_concurrency_per_user: usize,
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_connections: usize,
    pub token_rate: Rate,
    pub auth_failure_rate: Rate,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            ingest_concurrency: INGEST_CONCURRENCY,
            ingest_concurrency_per_user: INGEST_CONCURRENCY_PER_USER,
            header_timeout: HEADER_TIMEOUT,
            body_timeout: BODY_TIMEOUT,
            max_connections: MAX_CONNECTIONS,
            token_rate: TOKEN_RATE,
            auth_failure_rate: AUTH_FAILURE_RATE,
        }
    }
}

/// The per-user share actually enforced: at least 1, and at most `global - 1` so that one
/// member never holds every slot. A single global slot cannot be shared; then the share is
/// that slot (documented).
pub fn per_user_share(global: usize, per_user: usize) -> usize {
    let global = global.max(1);
    per_user.clamp(1, (global - 1).max(1))
}

/// Locks `m`, carrying on with the data if a holder panicked (counters stay usable; a panic
/// cannot leave these maps half-updated in a way that matters).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Which limit refused a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotRefusal {
    /// Every slot is in use.
    Global,
    /// This user already holds their share.
    PerUser,
}

#[derive(Debug, Default)]
struct SlotState {
    in_use: usize,
    by_user: HashMap<String, usize>,
}

/// A pool of slots (requests handled at once) with a per-user share; a slot is held by a
/// [`SlotGuard`] and returned when it drops (so also when a handler returns early or times out).
#[derive(Debug)]
pub struct Slots {
    global: usize,
    per_user: usize,
    state: Mutex<SlotState>,
}

impl Slots {
    /// `global` slots (at least 1), of which one user holds at most [`per_user_share`].
    pub fn new(global: usize, per_user: usize) -> Self {
        Self {
            global: global.max(1),
            per_user: per_user_share(global, per_user),
            state: Mutex::new(SlotState::default()),
        }
    }

    pub fn global_limit(&self) -> usize {
        self.global
    }

    pub fn per_user_limit(&self) -> usize {
        self.per_user
    }

    pub fn in_use(&self) -> usize {
        lock(&self.state).in_use
    }

    /// Takes a slot for `user` now, or says which limit is reached (never waits).
    pub fn try_acquire(&self, user: &str) -> Result<SlotGuard<'_>, SlotRefusal> {
        let mut st = lock(&self.state);
        let held = st.by_user.get(user).copied().unwrap_or(0);
        if held >= self.per_user {
            return Err(SlotRefusal::PerUser);
        }
        if st.in_use >= self.global {
            return Err(SlotRefusal::Global);
        }
        st.in_use += 1;
        *st.by_user.entry(user.to_string()).or_insert(0) += 1;
        Ok(SlotGuard { slots: self, user: user.to_string() })
    }

    fn release(&self, user: &str) {
        let mut st = lock(&self.state);
        st.in_use = st.in_use.saturating_sub(1);
        if let Some(n) = st.by_user.get_mut(user) {
            *n -= 1;
            if *n == 0 {
                st.by_user.remove(user);
            }
        }
    }
}

/// One held slot; dropping it returns the slot.
#[derive(Debug)]
pub struct SlotGuard<'a> {
    slots: &'a Slots,
    user: String,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.slots.release(&self.user);
    }
}

/// A token bucket: holds up to `burst` tokens, refilled continuously at `per_sec`.
#[derive(Debug, Clone, Copy)]
pub struct TokenBucket {
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn full(rate: Rate, now: Instant) -> Self {
        Self { tokens: f64::from(rate.burst.max(1)), last: now }
    }

    fn refill(&mut self, rate: Rate, now: Instant) {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * rate.per_sec).min(f64::from(rate.burst.max(1)));
        self.last = self.last.max(now);
    }

    /// Whether a token is there (without taking it); else how long until one is.
    pub fn check(&mut self, rate: Rate, now: Instant) -> Result<(), Duration> {
        self.refill(rate, now);
        if self.tokens >= 1.0 {
            Ok(())
        } else if rate.per_sec > 0.0 {
            Err(Duration::from_secs_f64(((1.0 - self.tokens) / rate.per_sec).min(86_400.0)))
        } else {
            Err(Duration::from_secs(86_400))
        }
    }

    /// Takes one token, or says how long until one is there.
    pub fn take(&mut self, rate: Rate, now: Instant) -> Result<(), Duration> {
        self.check(rate, now)?;
        self.tokens -= 1.0;
        Ok(())
    }

    /// Whether the bucket has refilled completely (it then equals a fresh one).
    pub fn is_full(&mut self, rate: Rate, now: Instant) -> bool {
        self.refill(rate, now);
        self.tokens >= f64::from(rate.burst.max(1))
    }
}

/// `Retry-After` in whole seconds (RFC 9110 §10.2.3: a non-negative integer), rounded up and
/// at least 1, for a wait of `wait`.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
    secs.max(1)
}

/// Token buckets by key (a token's hash, a peer's address), bounded to `max_keys`.
#[derive(Debug)]
pub struct RateLimiter<K> {
    rate: Rate,
    max_keys: usize,
    buckets: Mutex<HashMap<K, TokenBucket>>,
}

impl<K: Hash + Eq + Clone> RateLimiter<K> {
    pub fn new(rate: Rate) -> Self {
        Self::with_capacity(rate, MAX_TRACKED_KEYS)
    }

    pub fn with_capacity(rate: Rate, max_keys: usize) -> Self {
        Self { rate, max_keys: max_keys.max(1), buckets: Mutex::new(HashMap::new()) }
    }

    pub fn rate(&self) -> Rate {
        self.rate
    }

    /// Whether `key` may go on (no token is taken); `Err` is the wait until it may.
    pub fn check(&self, key: &K, now: Instant) -> Result<(), Duration> {
        match lock(&self.buckets).get_mut(key) {
            Some(b) => b.check(self.rate, now),
            None => Ok(()),
        }
    }

    /// Takes one token for `key`; `Err` is the wait until one is there.
    pub fn take(&self, key: &K, now: Instant) -> Result<(), Duration> {
        let mut buckets = lock(&self.buckets);
        if let Some(b) = buckets.get_mut(key) {
            return b.take(self.rate, now);
        }
        if buckets.len() >= self.max_keys {
            // A refilled bucket is the same as none: forget those first.
            let rate = self.rate;
            buckets.retain(|_, b| !b.is_full(rate, now));
            if buckets.len() >= self.max_keys {
                // Every tracked key is active; refusing the newcomer keeps memory bounded
                // without resetting anyone's bucket.
                return Err(Duration::from_secs(1));
            }
        }
        let mut b = TokenBucket::full(self.rate, now);
        let r = b.take(self.rate, now);
        buckets.insert(key.clone(), b);
        r
    }

    /// Keys tracked now.
    pub fn tracked(&self) -> usize {
        lock(&self.buckets).len()
    }
}

/// The key a peer's failed authentications count against: its IPv4 address, or its IPv6 /64
/// (one host usually holds a whole /64, so counting single addresses would not slow it).
pub fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// First delay after a failed `accept`.
pub const ACCEPT_BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest delay between `accept` retries.
pub const ACCEPT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// A burst of `accept` failures ends after this long without one.
pub const ACCEPT_BURST_QUIET: Duration = Duration::from_secs(10);

/// What the accept loop does after a failed `accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackoffStep {
    /// How long to stop accepting (connections wait in the kernel's queue meanwhile).
    pub sleep: Duration,
    /// Whether this failure starts a burst (log it; the rest of the burst is not logged).
    pub log: bool,
}

#[derive(Debug, Clone, Copy)]
struct Burst {
    started: Instant,
    last_failure: Instant,
    failures: u64,
}

/// A finished burst of `accept` failures, reported once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BurstEnded {
    pub failures: u64,
    pub lasted: Duration,
}

/// Backoff of the accept loop when `accept` fails (`EMFILE`, `ENFILE`, `ENOBUFS`): the delay
/// doubles with each consecutive failure up to [`ACCEPT_BACKOFF_MAX`] and resets on success; a
/// burst (failures closer together than [`ACCEPT_BURST_QUIET`]) is logged once when it starts
/// and once when it has ended.
#[derive(Debug, Default)]
pub struct AcceptBackoff {
    delay: Option<Duration>,
    burst: Option<Burst>,
}

impl AcceptBackoff {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn on_error(&mut self, now: Instant) -> BackoffStep {
        let delay = match self.delay {
            None => ACCEPT_BACKOFF_MIN,
            Some(d) => (d * 2).min(ACCEPT_BACKOFF_MAX),
        };
        self.delay = Some(delay);
        let log = match &mut self.burst {
            Some(b) if now.saturating_duration_since(b.last_failure) < ACCEPT_BURST_QUIET => {
                b.last_failure = now;
                b.failures += 1;
                false
            }
            _ => {
                self.burst = Some(Burst { started: now, last_failure: now, failures: 1 });
                true
            }
        };
        BackoffStep { sleep: delay, log }
    }

    /// After a successful `accept`: the delay resets; a burst quiet for long enough ends and
    /// is returned (once) for the log.
    pub fn on_success(&mut self, now: Instant) -> Option<BurstEnded> {
        self.delay = None;
        let b = self.burst?;
        if now.saturating_duration_since(b.last_failure) < ACCEPT_BURST_QUIET {
            return None;
        }
        self.burst = None;
        Some(BurstEnded {
            failures: b.failures,
            lasted: b.last_failure.saturating_duration_since(b.started),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    /// A fake clock: instants at fixed offsets from one base.
    struct Clock(Instant);
    impl Clock {
        fn new() -> Self {
            Self(Instant::now())
        }
        fn at(&self, ms: u64) -> Instant {
            self.0 + Duration::from_millis(ms)
        }
    }

    #[test]
    fn per_user_share_never_holds_every_slot() {
        assert_eq!(per_user_share(8, 2), 2);
        assert_eq!(per_user_share(8, 8), 7);
        assert_eq!(per_user_share(8, 100), 7);
        assert_eq!(per_user_share(2, 2), 1);
        assert_eq!(per_user_share(8, 0), 1);
        // A single slot cannot be shared (documented clamp).
        assert_eq!(per_user_share(1, 2), 1);
        assert_eq!(per_user_share(0, 2), 1);
    }

    #[test]
    fn slots_enforce_the_per_user_share_and_the_global_limit() {
        let s = Slots::new(3, 2);
        let a1 = s.try_acquire("a").unwrap();
        let a2 = s.try_acquire("a").unwrap();
        assert_eq!(s.try_acquire("a").unwrap_err(), SlotRefusal::PerUser);
        let b1 = s.try_acquire("b").unwrap();
        assert_eq!(s.in_use(), 3);
        assert_eq!(s.try_acquire("c").unwrap_err(), SlotRefusal::Global);
        assert_eq!(s.try_acquire("b").unwrap_err(), SlotRefusal::Global);
        // The per-user refusal wins when both apply: it is the one the user can act on.
        assert_eq!(s.try_acquire("a").unwrap_err(), SlotRefusal::PerUser);
        drop(a1);
        assert_eq!(s.in_use(), 2);
        let c1 = s.try_acquire("c").unwrap();
        drop((a2, b1, c1));
        assert_eq!(s.in_use(), 0);
        assert!(lock(&s.state).by_user.is_empty(), "released users are forgotten");
        let again = s.try_acquire("a").unwrap();
        drop(again);
    }

    #[test]
    fn one_user_cannot_take_every_slot_even_when_configured_to() {
        let s = Slots::new(8, 8);
        let held: Vec<_> = (0..7).map(|_| s.try_acquire("greedy").unwrap()).collect();
        assert_eq!(s.try_acquire("greedy").unwrap_err(), SlotRefusal::PerUser);
        assert!(s.try_acquire("other").is_ok());
        drop(held);
    }

    #[test]
    fn token_bucket_allows_the_burst_then_the_rate() {
        let c = Clock::new();
        let rate = Rate { per_sec: 2.0, burst: 3 };
        let mut b = TokenBucket::full(rate, c.at(0));
        for _ in 0..3 {
            b.take(rate, c.at(0)).unwrap();
        }
        let wait = b.take(rate, c.at(0)).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert_eq!(b.take(rate, c.at(250)).unwrap_err(), Duration::from_millis(250));
        b.take(rate, c.at(500)).unwrap();
        assert!(b.take(rate, c.at(500)).is_err());
        // Refill is capped at the burst.
        assert!(b.is_full(rate, c.at(60_000)));
        for _ in 0..3 {
            b.take(rate, c.at(60_000)).unwrap();
        }
        assert!(b.take(rate, c.at(60_000)).is_err());
        // A clock that goes backwards neither refills nor panics.
        assert!(b.take(rate, c.at(1_000)).is_err());
    }

    #[test]
    fn check_does_not_take_a_token() {
        let c = Clock::new();
        let rate = Rate { per_sec: 1.0, burst: 1 };
        let mut b = TokenBucket::full(rate, c.at(0));
        b.check(rate, c.at(0)).unwrap();
        b.check(rate, c.at(0)).unwrap();
        b.take(rate, c.at(0)).unwrap();
        assert_eq!(b.check(rate, c.at(0)).unwrap_err(), Duration::from_secs(1));
    }

    #[test]
    fn retry_after_is_whole_seconds_rounded_up() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1000)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(10)), 10);
    }

    #[test]
    fn rate_limiter_keys_are_independent() {
        let c = Clock::new();
        let l = RateLimiter::new(Rate { per_sec: 0.5, burst: 2 });
        l.take(&"a", c.at(0)).unwrap();
        l.take(&"a", c.at(0)).unwrap();
        assert_eq!(l.take(&"a", c.at(0)).unwrap_err(), Duration::from_secs(2));
        assert!(l.check(&"a", c.at(0)).is_err());
        l.check(&"b", c.at(0)).unwrap();
        l.take(&"b", c.at(0)).unwrap();
        l.take(&"a", c.at(2_000)).unwrap();
    }

    #[test]
    fn rate_limiter_memory_is_bounded() {
        let c = Clock::new();
        let rate = Rate { per_sec: 1.0, burst: 2 };
        let l = RateLimiter::with_capacity(rate, 3);
        for k in 0..3 {
            l.take(&k, c.at(0)).unwrap();
        }
        // Every bucket is in use: a fourth key is refused, nobody's bucket is reset.
        assert!(l.take(&3, c.at(0)).is_err());
        assert_eq!(l.tracked(), 3);
        // Once they have refilled, they are forgotten to make room.
        l.take(&3, c.at(5_000)).unwrap();
        assert_eq!(l.tracked(), 1);
    }

    #[test]
    fn ipv6_peers_count_per_slash_64() {
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        let other: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(peer_key(a), peer_key(b));
        assert_ne!(peer_key(a), peer_key(other));
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(peer_key(mapped), "192.0.2.7".parse::<IpAddr>().unwrap());
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(peer_key(v4), v4);
    }

    #[test]
    fn accept_backoff_grows_resets_and_logs_once_per_burst() {
        let c = Clock::new();
        let mut b = AcceptBackoff::new();
        let first = b.on_error(c.at(0));
        assert_eq!(first, BackoffStep { sleep: ACCEPT_BACKOFF_MIN, log: true });
        let mut t = 0;
        let mut sleeps = vec![first.sleep];
        for _ in 0..10 {
            t += 100;
            let s = b.on_error(c.at(t));
            assert!(!s.log, "only the first failure of a burst is logged");
            sleeps.push(s.sleep);
        }
        assert!(sleeps.windows(2).all(|w| w[1] >= w[0]), "{sleeps:?}");
        assert_eq!(sleeps[1], ACCEPT_BACKOFF_MIN * 2);
        assert_eq!(*sleeps.last().unwrap(), ACCEPT_BACKOFF_MAX);
        // A success inside the burst resets the delay but does not end the burst.
        assert_eq!(b.on_success(c.at(t + 10)), None);
        let s = b.on_error(c.at(t + 20));
        assert_eq!(s, BackoffStep { sleep: ACCEPT_BACKOFF_MIN, log: false });
        t += 20;
        // Quiet for long enough: the next success reports the burst, once.
        let quiet = t + ACCEPT_BURST_QUIET.as_millis() as u64;
        let ended = b.on_success(c.at(quiet)).unwrap();
        assert_eq!(ended.failures, 12);
        assert_eq!(ended.lasted, Duration::from_millis(t));
        assert_eq!(b.on_success(c.at(quiet + 1)), None);
        // A later failure starts (and logs) a new burst.
        assert!(b.on_error(c.at(quiet + 2)).log);
    }
}
