//! Bounded audit volume without losing count (issue 14): per-session rate limiting of
//! identical refusals. Within one interval (one second of the log's clock), the first
//! [`Volume::burst`] refusals with the same `(host, reason)` are written one by one; the rest
//! are remembered only by their `seq` and summarised in one `suppressed` line per key and
//! interval: `seqs` holds their exact `seq` values as inclusive `[from, to]` ranges and `count`
//! their number. Every attempt still gets its own `seq` (the review plane treats a suppressed
//! line's `seqs` as present, so its gap check stays quiet and burst counts stay exact).
//!
//! A summary is written when the next refusal of its key arrives in a later interval, when the
//! proxy's once-a-second [`Limiter::due`] finds its interval over, when it holds
//! [`MAX_RANGES_PER_LINE`] ranges (so the line stays under `MAX_LINE`), and by
//! [`Limiter::drain`] at session end and on shutdown. What is pending lives in memory only: a
//! writer killed with `SIGKILL` loses at most one interval's summaries, and the review plane
//! then sees exactly those `seq` values as a gap — the loss is visible, never silent.

use std::collections::HashMap;

use super::AuditLine;
use crate::policy::Reason;

/// Ranges one `suppressed` line carries at most: 32 ranges of two 20-digit numbers are
/// 1 376 bytes, which with every other field at its cap still fits `MAX_LINE` (the line has
/// no `url`, `addr` or byte counts).
pub const MAX_RANGES_PER_LINE: usize = 32;

/// Default `[audit] burst`: identical refusals written one by one per second.
pub const DEFAULT_BURST: u32 = 20;

/// The interval of the rate limit, in milliseconds of the log's clock.
pub const INTERVAL_MS: u64 = 1000;

/// Default `[audit] session_budget`: 1 GiB of audit lines per session.
pub const DEFAULT_SESSION_BUDGET: u64 = 1 << 30;

/// Default `[audit] min_free`: 256 MiB free on the log's file system.
pub const DEFAULT_MIN_FREE: u64 = 256 << 20;

/// The session's audit-volume settings (`[audit]`, managed and user layers only;
/// `config::audit_volume`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Volume {
    /// Identical refusals (same host and reason) written per second before the rest are
    /// summarised; `0` turns the rate limit off.
    pub burst: u32,
    /// Bytes of audit lines one session may write; past it the session is stopped.
    pub session_budget: u64,
    /// Bytes that must stay free on the log's file system; below it, no traffic.
    pub min_free: u64,
}

impl Default for Volume {
    fn default() -> Self {
        Self {
            burst: DEFAULT_BURST,
            session_budget: DEFAULT_SESSION_BUDGET,
            min_free: DEFAULT_MIN_FREE,
        }
    }
}

/// With `test-hooks`: a file whose content (a number of bytes) [`free_bytes`] reports instead
/// of the file system's free space, re-read at every check, so a test can drive the low-space
/// stop without filling a real file system (a tmpfs needs root; the sandbox suite also runs
/// unprivileged).
pub const TEST_FREE_BYTES_FILE_VAR: &str = "AIRLOCK_TEST_FREE_BYTES_FILE";

/// Bytes available to this user on the file system holding `dir` (`statvfs(3)`: `f_bavail`
/// blocks of `f_frsize` bytes — what a non-root writer can still use).
pub fn free_bytes(dir: &std::path::Path) -> std::io::Result<u64> {
    #[cfg(feature = "test-hooks")]
    if let Some(file) = std::env::var_os(TEST_FREE_BYTES_FILE_VAR)
        && let Ok(text) = std::fs::read_to_string(file)
        && let Ok(n) = text.trim().parse::<u64>()
    {
        return Ok(n);
    }
    let st = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    #[allow(clippy::useless_conversion)] // the field types differ between libcs
    let (avail, frsize) = (u64::from(st.blocks_available()), u64::from(st.fragment_size()));
    Ok(avail.saturating_mul(frsize))
}

/// What the caller does with a refusal's line.
#[derive(Debug, PartialEq)]
pub enum Verdict {
    /// Write the line; before it, write these summaries (an earlier interval's, now over).
    Write(Vec<AuditLine>),
    /// Do not write it: its `seq` is now held by a pending summary. The summaries, if any,
    /// are full ones that must be written now.
    Suppressed(Vec<AuditLine>),
}

#[derive(Debug)]
struct Key {
    /// `now_ms / INTERVAL_MS` of the interval `written` counts.
    interval: u64,
    written: u32,
    pending: Option<Pending>,
}

#[derive(Debug)]
struct Pending {
    /// The first suppressed attempt's line (its `ts`, `seq`, attribution, method, port,
    /// layer and policy head the summary).
    first: AuditLine,
    /// Sorted, disjoint, non-adjacent inclusive ranges.
    ranges: Vec<[u64; 2]>,
    count: u64,
}

impl Pending {
    fn new(line: &AuditLine) -> Self {
        Self { first: line.clone(), ranges: vec![[line.seq, line.seq]], count: 1 }
    }

    /// Adds `seq` (attempts of concurrent tasks may arrive slightly out of order).
    fn add(&mut self, seq: u64) {
        let i = self.ranges.partition_point(|r| r[1] < seq);
        if i < self.ranges.len() && self.ranges[i][0] <= seq {
            return; // already held: a stamp is never reused, so this is not expected
        }
        self.count += 1;
        let joins_prev = i > 0 && self.ranges[i - 1][1] + 1 == seq;
        let joins_next = i < self.ranges.len() && seq + 1 == self.ranges[i][0];
        match (joins_prev, joins_next) {
            (true, true) => {
                self.ranges[i - 1][1] = self.ranges[i][1];
                self.ranges.remove(i);
            }
            (true, false) => self.ranges[i - 1][1] = seq,
            (false, true) => self.ranges[i][0] = seq,
            (false, false) => self.ranges.insert(i, [seq, seq]),
        }
        if self.first.seq > seq {
            self.first.seq = seq;
        }
    }

    /// The `suppressed` line: the first attempt's fields, `id` `<first id>-suppressed`,
    /// `duration_ms` 0, and `seqs`/`count`.
    fn into_line(self) -> AuditLine {
        let first = self.first;
        AuditLine {
            id: format!("{}-suppressed", first.id),
            duration_ms: Some(0),
            url: None,
            addr: None,
            bytes_sent: None,
            bytes_recv: None,
            status: None,
            seqs: Some(self.ranges),
            count: Some(self.count),
            ..first
        }
    }
}

/// One session's rate-limit state (see the module header).
#[derive(Debug)]
pub struct Limiter {
    pub(super) volume: Volume,
    /// Per (host, reason, phase): refusals under different phases are never summarized
    /// together, since a summary names the one phase its attempts were decided under.
    keys: HashMap<(String, Reason, Option<String>), Key>,
    /// Set once the session is stopped (`audit_budget`, `low_space`): every later attempt is
    /// refused and only counted, in one summary per interval with that reason.
    stopped: Option<(Reason, Option<Pending>)>,
}

impl Limiter {
    pub fn new(volume: Volume) -> Self {
        Self { volume, keys: HashMap::new(), stopped: None }
    }

    pub fn volume(&self) -> &Volume {
        &self.volume
    }

    /// Why the session was stopped, if it was.
    pub fn stopped(&self) -> Option<Reason> {
        self.stopped.as_ref().map(|s| s.0)
    }

    /// Stops the session for `reason`; false if it was already stopped.
    pub fn stop(&mut self, reason: Reason) -> bool {
        if self.stopped.is_some() {
            return false;
        }
        self.stopped = Some((reason, None));
        true
    }

    /// After a stop: holds `line`'s `seq` in the stop summary (the attempt is refused, never
    /// forwarded); a summary that is full is returned for writing now.
    pub fn absorb(&mut self, line: &AuditLine) -> Vec<AuditLine> {
        let Some((reason, pending)) = &mut self.stopped else { return Vec::new() };
        match pending {
            None => {
                let first = AuditLine {
                    host: String::new(),
                    allowed: false,
                    reason: Some(*reason),
                    layer: Some(crate::policy::LayerKind::None),
                    policy: None,
                    port: None,
                    ..line.clone()
                };
                *pending = Some(Pending::new(&first));
            }
            Some(p) => {
                p.add(line.seq);
                if p.ranges.len() >= MAX_RANGES_PER_LINE {
                    return pending.take().map(Pending::into_line).into_iter().collect();
                }
            }
        }
        Vec::new()
    }

    /// Whether `line` falls under the rate limit: a refusal with a reason, other than a
    /// settled interruption and other than a summary itself.
    pub fn applies(line: &AuditLine) -> bool {
        !line.allowed
            && line.seqs.is_none()
            && matches!(line.reason, Some(r) if r != Reason::Interrupted)
    }

    /// Decides a refusal's line at `now_ms` (the log's clock).
    pub fn admit(&mut self, line: &AuditLine, now_ms: u64) -> Verdict {
        let Some(reason) = line.reason else { return Verdict::Write(Vec::new()) };
        if self.volume.burst == 0 || !Self::applies(line) {
            return Verdict::Write(Vec::new());
        }
        let interval = now_ms / INTERVAL_MS;
        let key = self.keys.entry((line.host.clone(), reason, line.phase.clone())).or_insert(Key {
            interval,
            written: 0,
            pending: None,
        });
        let mut out = Vec::new();
        if key.interval != interval {
            out.extend(key.pending.take().map(Pending::into_line));
            key.interval = interval;
            key.written = 0;
        }
        if key.written < self.volume.burst {
            key.written += 1;
            return Verdict::Write(out);
        }
        match &mut key.pending {
            None => key.pending = Some(Pending::new(line)),
            Some(p) => {
                p.add(line.seq);
                if p.ranges.len() >= MAX_RANGES_PER_LINE {
                    out.extend(key.pending.take().map(Pending::into_line));
                }
            }
        }
        Verdict::Suppressed(out)
    }

    /// Summaries whose interval is over at `now_ms`; keys with nothing pending and an old
    /// interval are forgotten (the map holds only recently refused keys).
    pub fn due(&mut self, now_ms: u64) -> Vec<AuditLine> {
        let interval = now_ms / INTERVAL_MS;
        let mut out = Vec::new();
        if let Some((_, pending)) = &mut self.stopped {
            out.extend(pending.take().map(Pending::into_line));
        }
        self.keys.retain(|_, k| {
            if k.interval == interval {
                return true;
            }
            out.extend(k.pending.take().map(Pending::into_line));
            false
        });
        out.sort_by_key(|l| l.seq);
        out
    }

    /// Every pending summary, now (session end, shutdown).
    pub fn drain(&mut self) -> Vec<AuditLine> {
        let mut out: Vec<AuditLine> =
            self.keys.drain().filter_map(|(_, k)| k.pending.map(Pending::into_line)).collect();
        if let Some((_, pending)) = &mut self.stopped {
            out.extend(pending.take().map(Pending::into_line));
        }
        out.sort_by_key(|l| l.seq);
        out
    }

    /// Puts summaries that could not be written back, so a later flush retries them.
    pub fn restore(&mut self, lines: Vec<AuditLine>, now_ms: u64) {
        for l in lines {
            let (Some(reason), Some(ranges), Some(count)) = (l.reason, l.seqs.clone(), l.count)
            else {
                continue;
            };
            if let Some((stop, pending)) = &mut self.stopped
                && *stop == reason
                && l.host.is_empty()
            {
                let first = AuditLine {
                    id: l.id.trim_end_matches("-suppressed").to_owned(),
                    seqs: None,
                    count: None,
                    ..l
                };
                match pending {
                    None => *pending = Some(Pending { first, ranges, count }),
                    Some(p) => ranges.iter().for_each(|&[a, b]| (a..=b).for_each(|s| p.add(s))),
                }
                continue;
            }
            let key = self.keys.entry((l.host.clone(), reason, l.phase.clone())).or_insert(Key {
                interval: now_ms / INTERVAL_MS,
                written: 0,
                pending: None,
            });
            let first = AuditLine {
                id: l.id.trim_end_matches("-suppressed").to_owned(),
                seqs: None,
                count: None,
                ..l
            };
            match &mut key.pending {
                None => key.pending = Some(Pending { first, ranges, count }),
                Some(p) => {
                    for [a, b] in ranges {
                        for s in a..=b {
                            p.add(s);
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::audit::format::tests::sample;

    fn refusal(host: &str, seq: u64) -> AuditLine {
        let mut l = sample();
        l.host = host.into();
        l.seq = seq;
        l.id = format!("p-{seq}");
        l.allowed = false;
        l.reason = Some(Reason::NotAllowed);
        l
    }

    fn worst_seqs() -> Option<Vec<[u64; 2]>> {
        Some(vec![[u64::MAX - 1, u64::MAX]; MAX_RANGES_PER_LINE])
    }

    fn held(lines: &[AuditLine]) -> u64 {
        lines.iter().map(|l| l.count.unwrap()).sum()
    }

    #[test]
    fn past_the_burst_identical_refusals_are_counted_exactly_in_one_line_per_interval() {
        let mut lim = Limiter::new(Volume { burst: 3, ..Volume::default() });
        let mut written = 0;
        let mut summaries = Vec::new();
        for seq in 1..=1000u64 {
            // 100 attempts per interval.
            let now = 5_000 + (seq - 1) * 10;
            match lim.admit(&refusal("flood.test", seq), now) {
                Verdict::Write(s) => {
                    written += 1;
                    summaries.extend(s);
                }
                Verdict::Suppressed(s) => summaries.extend(s),
            }
        }
        summaries.extend(lim.drain());
        assert_eq!(written, 30, "3 per interval, 10 intervals");
        assert_eq!(summaries.len(), 10, "one summary per interval");
        assert_eq!(written + held(&summaries), 1000);
        assert_eq!(summaries[0].seqs, Some(vec![[4, 100]]));
        assert_eq!(summaries[0].seq, 4);
        assert_eq!(summaries[0].id, "p-4-suppressed");
        assert_eq!(summaries[0].count, Some(97));
        // Every seq is held exactly once, by a written line or a summary.
        let mut seen = vec![false; 1001];
        for s in &summaries {
            for [a, b] in s.seqs.clone().unwrap() {
                for q in a..=b {
                    assert!(!seen[q as usize]);
                    seen[q as usize] = true;
                }
            }
        }
        assert_eq!(seen.iter().filter(|s| **s).count(), 970);
    }

    #[test]
    fn keys_are_host_reason_and_phase_and_other_lines_pass() {
        let mut lim = Limiter::new(Volume { burst: 1, ..Volume::default() });
        assert_eq!(lim.admit(&refusal("a.test", 1), 0), Verdict::Write(vec![]));
        assert_eq!(lim.admit(&refusal("b.test", 2), 0), Verdict::Write(vec![]));
        let mut other = refusal("a.test", 3);
        other.reason = Some(Reason::Blocked);
        assert_eq!(lim.admit(&other, 0), Verdict::Write(vec![]));
        let mut allowed = refusal("a.test", 4);
        allowed.allowed = true;
        allowed.reason = Some(Reason::Allowed);
        assert_eq!(lim.admit(&allowed, 0), Verdict::Write(vec![]));
        assert_eq!(lim.admit(&refusal("a.test", 5), 0), Verdict::Suppressed(vec![]));
        // Regression: refusals of one host before and after a phase switch were summarized in
        // one line naming only the first phase.
        let mut phased = refusal("a.test", 6);
        phased.phase = Some("build".into());
        assert_eq!(lim.admit(&phased, 0), Verdict::Write(vec![]));
        assert_eq!(lim.admit(&refusal("a.test", 7), 0), Verdict::Suppressed(vec![]));
        let off = &mut Limiter::new(Volume { burst: 0, ..Volume::default() });
        for s in 1..100 {
            assert_eq!(off.admit(&refusal("a.test", s), 0), Verdict::Write(vec![]));
        }
    }

    #[test]
    fn out_of_order_seqs_merge_and_a_full_summary_is_written_early() {
        let mut lim = Limiter::new(Volume { burst: 1, ..Volume::default() });
        assert!(matches!(lim.admit(&refusal("a.test", 1), 0), Verdict::Write(_)));
        for s in [5, 3, 4, 2] {
            assert_eq!(lim.admit(&refusal("a.test", s), 0), Verdict::Suppressed(vec![]));
        }
        let d = lim.drain();
        assert_eq!((d[0].seqs.clone(), d[0].count, d[0].seq), (Some(vec![[2, 5]]), Some(4), 2));

        assert!(matches!(lim.admit(&refusal("a.test", 100), 0), Verdict::Write(_)));
        let mut full = Vec::new();
        for k in 0..(MAX_RANGES_PER_LINE as u64 + 3) {
            if let Verdict::Suppressed(s) = lim.admit(&refusal("a.test", 200 + 2 * k), 0) {
                full.extend(s);
            }
        }
        assert_eq!(full.len(), 1);
        assert_eq!(full[0].seqs.as_ref().unwrap().len(), MAX_RANGES_PER_LINE);
        let rest = lim.drain();
        assert_eq!(held(&full) + held(&rest), MAX_RANGES_PER_LINE as u64 + 3);
        // The fullest summary still encodes under MAX_LINE with hostile fields at their caps.
        for s in ["\u{1}".repeat(10_000), "\"".repeat(10_000), "é".repeat(10_000)] {
            let worst = crate::audit::format::tests::worst(&s);
            let summary = Pending { first: worst, ranges: vec![], count: 0 }.into_line();
            let summary = AuditLine { seqs: worst_seqs(), count: Some(u64::MAX), ..summary };
            let bytes = crate::audit::encode_line(&summary).unwrap();
            assert!(bytes.len() <= crate::audit::MAX_LINE);
        }
    }

    #[test]
    fn due_flushes_ended_intervals_and_restore_keeps_counts() {
        let mut lim = Limiter::new(Volume { burst: 1, ..Volume::default() });
        lim.admit(&refusal("a.test", 1), 0);
        lim.admit(&refusal("a.test", 2), 0);
        lim.admit(&refusal("a.test", 3), 0);
        assert!(lim.due(999).is_empty());
        let due = lim.due(1000);
        assert_eq!(held(&due), 2);
        lim.restore(due, 1000);
        lim.admit(&refusal("a.test", 4), 1000);
        lim.admit(&refusal("a.test", 5), 1000);
        let d = lim.drain();
        assert_eq!((d.len(), held(&d)), (1, 3));
        assert_eq!(d[0].seqs, Some(vec![[2, 3], [5, 5]]));
        assert_eq!(d[0].id, "p-2-suppressed");
    }
}
