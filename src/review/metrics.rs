//! The review plane's operational metrics and their `GET /metrics` rendering (Prometheus text
//! exposition format 0.0.4, written by hand): ingest requests, items and latency, rejections by
//! code, flags by rule, store errors, connections, slot use and rate limiting.
//!
//! Labels come from closed sets (status codes, item statuses, limit names, slot kinds) or from
//! the rule packs' ids, never from a request: no email, user id, token, session, path or
//! payload ever reaches a metric. One process-wide registry ([`global`]) is what the server
//! records into and renders; other modules report through it too (e.g. read slots call
//! [`Metrics::slots`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Upper bounds (seconds) of the ingest latency histogram's buckets.
pub const LATENCY_BUCKETS: [f64; 14] =
    [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Distinct rule ids counted by name; the rest (only possible with huge admin rule packs) are
/// counted as `other`, so the exposition stays bounded.
const MAX_RULE_LABELS: usize = 512;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A counter map stays consistent even if a holder panicked.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Counters by label key.
#[derive(Debug)]
struct Family<K>(Mutex<BTreeMap<K, u64>>);

impl<K: Ord + Clone> Family<K> {
    const fn new() -> Self {
        Self(Mutex::new(BTreeMap::new()))
    }
    fn add(&self, k: K, n: u64) {
        *lock(&self.0).entry(k).or_insert(0) += n;
    }
    fn snapshot(&self) -> Vec<(K, u64)> {
        lock(&self.0).iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
    fn len(&self) -> usize {
        lock(&self.0).len()
    }
    fn contains(&self, k: &K) -> bool {
        lock(&self.0).contains_key(k)
    }
}

#[derive(Debug)]
struct Histogram {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    const fn new() -> Self {
        Self {
            buckets: [const { AtomicU64::new(0) }; LATENCY_BUCKETS.len()],
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        // Non-cumulative per bucket here; the rendering accumulates.
        if let Some(i) = LATENCY_BUCKETS.iter().position(|le| secs <= *le) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let micros = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.sum_micros.fetch_add(micros, Ordering::Relaxed);
    }
}

/// Slot use reported for one kind of slot (`ingest`, `read`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotUse {
    pub in_use: usize,
    pub limit: usize,
    pub per_user_limit: usize,
}

/// Where a rejection was answered: the whole request, or one item of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Request,
    Item,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Request => "request",
            Level::Item => "item",
        }
    }
}

/// The registry.
#[derive(Debug)]
pub struct Metrics {
    ingest_requests: Family<u16>,
    ingest_items: Family<&'static str>,
    ingest_latency: Histogram,
    rejections: Family<(Level, u16)>,
    flags: Family<String>,
    gate_steps: Family<&'static str>,
    store_errors: Family<&'static str>,
    rate_limited: Family<&'static str>,
    connections_open: AtomicU64,
    connections_accepted: AtomicU64,
    connections_limit: AtomicU64,
    accept_errors: AtomicU64,
    slots: Mutex<BTreeMap<&'static str, SlotUse>>,
}

static GLOBAL: Metrics = Metrics::new();

/// The process-wide registry the server records into and `GET /metrics` renders.
pub fn global() -> &'static Metrics {
    &GLOBAL
}

/// Item statuses counted by name (the rest as `other`).
const ITEM_STATUSES: [&str; 4] = ["created", "duplicate", "conflict", "rejected"];
/// The limits whose refusals are counted (`rate_limited_total{limit}`).
pub const LIMITS: [&str; 11] = [
    "token",
    "auth_failures",
    "ingest_global",
    "ingest_per_user",
    "read_global",
    "read_per_user",
    "login_per_address",
    "login_per_account",
    "gate_pending",
    "gate_wait_global",
    "gate_wait_per_user",
];
/// The steps of action gates counted (`gate_steps_total{step}`).
pub const GATE_STEPS: [&str; 5] = ["requested", "approved", "denied", "expired", "abandoned"];
const STORE_ERROR_KINDS: [&str; 2] = ["unavailable", "other"];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub const fn new() -> Self {
        Self {
            ingest_requests: Family::new(),
            ingest_items: Family::new(),
            ingest_latency: Histogram::new(),
            rejections: Family::new(),
            flags: Family::new(),
            gate_steps: Family::new(),
            store_errors: Family::new(),
            rate_limited: Family::new(),
            connections_open: AtomicU64::new(0),
            connections_accepted: AtomicU64::new(0),
            connections_limit: AtomicU64::new(0),
            accept_errors: AtomicU64::new(0),
            slots: Mutex::new(BTreeMap::new()),
        }
    }

    /// One answered `POST /api/v1/events`, with its status and time from arrival to answer.
    pub fn ingest_request(&self, status: u16, took: Duration) {
        self.ingest_requests.add(status, 1);
        self.ingest_latency.observe(took);
    }

    /// One batch item's outcome (`status` as in the 207 body; its `code` for a rejection).
    pub fn ingest_item(&self, status: &str, code: u16) {
        let label = ITEM_STATUSES.into_iter().find(|s| *s == status).unwrap_or("other");
        self.ingest_items.add(label, 1);
        if code >= 400 {
            self.rejections.add((Level::Item, code), 1);
        }
    }

    /// Any response answered with a 4xx or 5xx status (other statuses are ignored).
    pub fn response(&self, status: u16) {
        if status >= 400 {
            self.rejections.add((Level::Request, status), 1);
        }
    }

    /// A flag raised by detection (a re-detection of a stored flag counts again).
    pub fn flag_raised(&self, rule_id: &str) {
        let key = rule_id.to_string();
        if self.flags.contains(&key) || self.flags.len() < MAX_RULE_LABELS {
            self.flags.add(key, 1);
        } else {
            self.flags.add("other".to_string(), 1);
        }
    }

    /// One step of an action gate on this server ([`GATE_STEPS`]; anything else is ignored).
    pub fn gate_step(&self, step: &str) {
        if let Some(s) = GATE_STEPS.into_iter().find(|s| *s == step) {
            self.gate_steps.add(s, 1);
        }
    }

    /// A store error answered as 503 (`unavailable` or `other`).
    pub fn store_error(&self, unavailable: bool) {
        self.store_errors.add(if unavailable { "unavailable" } else { "other" }, 1);
    }

    /// A request refused by one of [`LIMITS`].
    pub fn rate_limited(&self, limit: &'static str) {
        self.rate_limited.add(limit, 1);
    }

    /// A connection was accepted; the guard counts it open until dropped.
    pub fn connection_opened(&self) -> ConnectionGuard<'_> {
        self.connections_accepted.fetch_add(1, Ordering::Relaxed);
        self.connections_open.fetch_add(1, Ordering::Relaxed);
        ConnectionGuard(self)
    }

    pub fn set_connection_limit(&self, n: usize) {
        self.connections_limit.store(n as u64, Ordering::Relaxed);
    }

    pub fn accept_error(&self) {
        self.accept_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Reports the use of one kind of slot (`ingest`; `read` for the read slots). The latest
    /// report per kind is rendered.
    pub fn slots(&self, kind: &'static str, use_: SlotUse) {
        lock(&self.slots).insert(kind, use_);
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(4096);
        let mut w = Writer(&mut out);

        w.head(
            "airlock_review_ingest_requests_total",
            "counter",
            "Ingest requests (POST /api/v1/events) answered, by HTTP status.",
        );
        for (code, n) in self.ingest_requests.snapshot() {
            w.sample("airlock_review_ingest_requests_total", &[("code", &code.to_string())], n);
        }

        w.head(
            "airlock_review_ingest_items_total",
            "counter",
            "Batch items by outcome (created, duplicate, conflict, rejected).",
        );
        let items: BTreeMap<&str, u64> = self.ingest_items.snapshot().into_iter().collect();
        for status in ITEM_STATUSES.into_iter().chain(["other"]) {
            let n = items.get(status).copied().unwrap_or(0);
            if n > 0 || status != "other" {
                w.sample("airlock_review_ingest_items_total", &[("status", status)], n);
            }
        }

        let h = &self.ingest_latency;
        w.head(
            "airlock_review_ingest_duration_seconds",
            "histogram",
            "Time from an ingest request's arrival to its answer.",
        );
        let mut cumulative = 0;
        for (i, le) in LATENCY_BUCKETS.iter().enumerate() {
            cumulative += h.buckets[i].load(Ordering::Relaxed);
            w.sample(
                "airlock_review_ingest_duration_seconds_bucket",
                &[("le", &format_float(*le))],
                cumulative,
            );
        }
        let count = h.count.load(Ordering::Relaxed);
        // `count` is read after the buckets, so `+Inf` (= count) is never below a bucket.
        w.sample("airlock_review_ingest_duration_seconds_bucket", &[("le", "+Inf")], count);
        let sum = h.sum_micros.load(Ordering::Relaxed) as f64 / 1e6;
        w.sample_f("airlock_review_ingest_duration_seconds_sum", &[], sum);
        w.sample("airlock_review_ingest_duration_seconds_count", &[], count);

        w.head(
            "airlock_review_rejections_total",
            "counter",
            "Answers with a 4xx/5xx code: whole requests (any endpoint) and single batch items.",
        );
        for ((level, code), n) in self.rejections.snapshot() {
            w.sample(
                "airlock_review_rejections_total",
                &[("level", level.as_str()), ("code", &code.to_string())],
                n,
            );
        }

        w.head(
            "airlock_review_flags_raised_total",
            "counter",
            "Flags raised by detection, by rule id.",
        );
        for (rule, n) in self.flags.snapshot() {
            w.sample("airlock_review_flags_raised_total", &[("rule", &rule)], n);
        }

        w.head(
            "airlock_review_gate_steps_total",
            "counter",
            "Action-gate steps this server recorded (opened, decided, expired, abandoned).",
        );
        let steps: BTreeMap<&str, u64> = self.gate_steps.snapshot().into_iter().collect();
        for step in GATE_STEPS {
            let n = steps.get(step).copied().unwrap_or(0);
            w.sample("airlock_review_gate_steps_total", &[("step", step)], n);
        }

        w.head(
            "airlock_review_store_errors_total",
            "counter",
            "Store errors answered 503 (unavailable: connection or lock; other: anything else).",
        );
        let errs: BTreeMap<&str, u64> = self.store_errors.snapshot().into_iter().collect();
        for kind in STORE_ERROR_KINDS {
            let n = errs.get(kind).copied().unwrap_or(0);
            w.sample("airlock_review_store_errors_total", &[("kind", kind)], n);
        }

        w.head(
            "airlock_review_rate_limited_total",
            "counter",
            "Requests answered 429, by the limit that refused them.",
        );
        let limited: BTreeMap<&str, u64> = self.rate_limited.snapshot().into_iter().collect();
        for limit in LIMITS {
            let n = limited.get(limit).copied().unwrap_or(0);
            w.sample("airlock_review_rate_limited_total", &[("limit", limit)], n);
        }

        let gauge = |w: &mut Writer<'_>, name: &str, help: &str, v: &AtomicU64, kind: &str| {
            w.head(name, kind, help);
            w.sample(name, &[], v.load(Ordering::Relaxed));
        };
        gauge(
            &mut w,
            "airlock_review_connections_open",
            "Connections open now.",
            &self.connections_open,
            "gauge",
        );
        gauge(
            &mut w,
            "airlock_review_connections_limit",
            "Connections served at once (--max-connections); more wait in the accept queue.",
            &self.connections_limit,
            "gauge",
        );
        gauge(
            &mut w,
            "airlock_review_connections_accepted_total",
            "Connections accepted.",
            &self.connections_accepted,
            "counter",
        );
        gauge(
            &mut w,
            "airlock_review_accept_errors_total",
            "Failed accept calls (EMFILE, ENFILE, ...), each followed by a backoff.",
            &self.accept_errors,
            "counter",
        );

        let slots: Vec<(&str, SlotUse)> = lock(&self.slots).iter().map(|(k, v)| (*k, *v)).collect();
        w.head("airlock_review_slots_in_use", "gauge", "Request slots held now, by kind.");
        for (kind, u) in &slots {
            w.sample("airlock_review_slots_in_use", &[("kind", kind)], u.in_use as u64);
        }
        w.head(
            "airlock_review_slots_limit",
            "gauge",
            "Request slots available, by kind, overall (global) and to one user (per_user).",
        );
        for (kind, u) in &slots {
            w.sample(
                "airlock_review_slots_limit",
                &[("kind", kind), ("scope", "global")],
                u.limit as u64,
            );
            w.sample(
                "airlock_review_slots_limit",
                &[("kind", kind), ("scope", "per_user")],
                u.per_user_limit as u64,
            );
        }
        out
    }
}

/// Counts one open connection until dropped.
#[derive(Debug)]
pub struct ConnectionGuard<'a>(&'a Metrics);

impl Drop for ConnectionGuard<'_> {
    fn drop(&mut self) {
        // Saturating: never wraps below zero even if a guard were dropped twice.
        let _ = self
            .0
            .connections_open
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| Some(n.saturating_sub(1)));
    }
}

/// A float as the exposition format writes it (`0.005`, `1`, `+Inf`).
fn format_float(v: f64) -> String {
    if v.is_infinite() {
        if v > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else if v.is_nan() {
        "NaN".into()
    } else {
        format!("{v}")
    }
}

/// Escapes a label value: backslash, double quote and line feed (format 0.0.4).
fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

struct Writer<'a>(&'a mut String);

impl Writer<'_> {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        // Writing to a String cannot fail.
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }
    fn labels(&mut self, labels: &[(&str, &str)]) {
        if labels.is_empty() {
            return;
        }
        self.0.push('{');
        for (i, (k, v)) in labels.iter().enumerate() {
            if i > 0 {
                self.0.push(',');
            }
            let _ = write!(self.0, "{k}=\"{}\"", escape_label(v));
        }
        self.0.push('}');
    }
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: u64) {
        self.0.push_str(name);
        self.labels(labels);
        let _ = writeln!(self.0, " {v}");
    }
    fn sample_f(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.0.push_str(name);
        self.labels(labels);
        let _ = writeln!(self.0, " {}", format_float(v));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn counters_and_labels_render_in_the_exposition_format() {
        let m = Metrics::new();
        m.ingest_request(200, Duration::from_millis(3));
        m.ingest_request(207, Duration::from_millis(30));
        m.ingest_request(429, Duration::from_micros(10));
        m.response(429);
        m.response(200);
        m.ingest_item("created", 201);
        m.ingest_item("created", 201);
        m.ingest_item("rejected", 403);
        m.ingest_item("something-new", 200);
        m.flag_raised("secret.github-token");
        m.store_error(true);
        m.rate_limited("token");
        m.set_connection_limit(32);
        let guard = m.connection_opened();
        m.slots("ingest", SlotUse { in_use: 1, limit: 8, per_user_limit: 2 });
        let t = m.render();
        assert_eq!(sample(&t, "airlock_review_ingest_requests_total{code=\"200\"}"), Some(1.0));
        assert_eq!(sample(&t, "airlock_review_ingest_items_total{status=\"created\"}"), Some(2.0));
        assert_eq!(
            sample(&t, "airlock_review_ingest_items_total{status=\"duplicate\"}"),
            Some(0.0)
        );
        assert_eq!(sample(&t, "airlock_review_ingest_items_total{status=\"other\"}"), Some(1.0));
        assert_eq!(
            sample(&t, "airlock_review_rejections_total{level=\"item\",code=\"403\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(&t, "airlock_review_rejections_total{level=\"request\",code=\"429\"}"),
            Some(1.0)
        );
        assert!(!t.contains("code=\"200\"}") || !t.contains("level=\"request\",code=\"200\""));
        assert_eq!(
            sample(&t, "airlock_review_flags_raised_total{rule=\"secret.github-token\"}"),
            Some(1.0)
        );
        assert_eq!(
            sample(&t, "airlock_review_store_errors_total{kind=\"unavailable\"}"),
            Some(1.0)
        );
        assert_eq!(sample(&t, "airlock_review_rate_limited_total{limit=\"token\"}"), Some(1.0));
        assert_eq!(
            sample(&t, "airlock_review_rate_limited_total{limit=\"auth_failures\"}"),
            Some(0.0)
        );
        assert_eq!(sample(&t, "airlock_review_connections_open"), Some(1.0));
        drop(guard);
        assert_eq!(sample(&m.render(), "airlock_review_connections_open"), Some(0.0));
        assert_eq!(sample(&t, "airlock_review_connections_limit"), Some(32.0));
        assert_eq!(sample(&t, "airlock_review_slots_in_use{kind=\"ingest\"}"), Some(1.0));
        assert_eq!(
            sample(&t, "airlock_review_slots_limit{kind=\"ingest\",scope=\"per_user\"}"),
            Some(2.0)
        );
        // Every sample's family is declared before it.
        let mut declared = std::collections::HashSet::new();
        for l in t.lines() {
            if let Some(rest) = l.strip_prefix("# TYPE ") {
                declared.insert(rest.split(' ').next().unwrap().to_string());
            } else if !l.starts_with('#') {
                let name = l.split(['{', ' ']).next().unwrap();
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s).filter(|f| declared.contains(*f)))
                    .unwrap_or(name);
                assert!(declared.contains(family), "undeclared sample {l}");
            }
        }
    }

    #[test]
    fn the_histogram_is_cumulative_and_ends_at_the_count() {
        let m = Metrics::new();
        for ms in [0, 2, 2, 40, 700, 120_000] {
            m.ingest_request(200, Duration::from_millis(ms));
        }
        let t = m.render();
        let b = |le: &str| {
            sample(&t, &format!("airlock_review_ingest_duration_seconds_bucket{{le=\"{le}\"}}"))
                .unwrap()
        };
        assert_eq!(b("0.001"), 1.0);
        assert_eq!(b("0.005"), 3.0);
        assert_eq!(b("0.05"), 4.0);
        assert_eq!(b("1"), 5.0);
        assert_eq!(b("60"), 5.0);
        assert_eq!(b("+Inf"), 6.0);
        assert_eq!(sample(&t, "airlock_review_ingest_duration_seconds_count"), Some(6.0));
        let sum = sample(&t, "airlock_review_ingest_duration_seconds_sum").unwrap();
        assert!((sum - 120.744).abs() < 1e-6, "{sum}");
    }

    #[test]
    fn label_values_are_escaped_and_rule_labels_are_bounded() {
        let m = Metrics::new();
        m.flag_raised("a\"b\\c\nd");
        let t = m.render();
        assert!(t.contains(r#"rule="a\"b\\c\nd""#), "{t}");
        for i in 0..(MAX_RULE_LABELS + 10) {
            m.flag_raised(&format!("rule-{i}"));
        }
        let t = m.render();
        let n = t.lines().filter(|l| l.starts_with("airlock_review_flags_raised_total{")).count();
        assert_eq!(n, MAX_RULE_LABELS + 1, "bounded, plus `other`");
        assert_eq!(sample(&t, "airlock_review_flags_raised_total{rule=\"other\"}"), Some(11.0));
    }
}
