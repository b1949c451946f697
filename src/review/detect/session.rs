//! Session checks in bounded memory: [`SessionScan`] is fed a session's events one at a time
//! (their envelope only, never payloads) and keeps only what the checks need — the session's
//! span, a count and up to [`MAX_LINKED`] pks of events outside it, and each boot's `seq`
//! values as merged ranges. Past [`MAX_EVENTS`] events or [`MAX_RANGES`] ranges it stops
//! growing and raises `detect.incomplete` instead (docs/review.md, "Bounded session checks").
//!
//! A `suppressed` egress line (docs/audit-format.md, "Suppressed lines") stands for the
//! identical refusals its `seqs` ranges name: [`suppressed_seqs`] reads them, and the gap check
//! treats every one of those `seq` values as present.

use super::flag_id;
use crate::review::{Micros, NewFlag, Severity, Source, StoredEvent, format_micros};
use serde_json::Value;
use std::collections::BTreeMap;

/// Events of one session the checks read; past it the rest is not read and the session
/// gets a `detect.incomplete` flag (its gap check is skipped: unread events could fill gaps).
pub const MAX_EVENTS: u64 = 1_000_000;
/// `seq` ranges (over all boots) kept; a session this fragmented gets `detect.incomplete`.
pub const MAX_RANGES: usize = 100_000;
/// Events linked to one flag; the detail still counts all of them.
pub const MAX_LINKED: usize = 1000;

/// What the checks read of one event.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    pub pk: i64,
    pub source: Source,
    pub ts: Micros,
    pub seq: Option<i64>,
    pub boot: Option<String>,
    /// A `suppressed` line's `seqs` ([`suppressed_seqs`]): also present in its boot.
    pub covers: Vec<(i64, i64)>,
}

/// Ranges one `suppressed` line may name (the writer puts at most 32 in a line).
pub const MAX_SUPPRESSED_RANGES: usize = 64;

/// The `seqs` of a `suppressed` egress line's payload as inclusive `(from, to)` ranges, or
/// `None` when the payload has no valid `seqs` (not an array of at most
/// [`MAX_SUPPRESSED_RANGES`] `[from, to]` pairs with `1 <= from <= to`): such a line counts as
/// one ordinary event.
pub fn suppressed_seqs(payload: &Value) -> Option<Vec<(i64, i64)>> {
    let seqs = payload.get("seqs")?.as_array()?;
    if seqs.is_empty() || seqs.len() > MAX_SUPPRESSED_RANGES {
        return None;
    }
    seqs.iter()
        .map(|r| match r.as_array().map(Vec::as_slice) {
            Some([a, b]) => {
                let (a, b) = (a.as_i64()?, b.as_i64()?);
                (1 <= a && a <= b).then_some((a, b))
            }
            _ => None,
        })
        .collect()
}

/// How many attempts a `suppressed` line's ranges hold (each `seq` once: overlapping ranges
/// are not double-counted).
pub fn suppressed_count(ranges: &[(i64, i64)]) -> u64 {
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    let (mut total, mut next) = (0u64, i64::MIN);
    for (a, b) in sorted {
        let a = a.max(next);
        if a <= b {
            total = total.saturating_add(b.abs_diff(a) + 1);
            next = b.saturating_add(1);
        }
    }
    total
}

/// The running state of one session's checks (see the module header).
#[derive(Debug)]
pub struct SessionScan {
    user_id: String,
    session: String,
    span: Option<(Micros, Micros)>,
    seen: u64,
    outside: u64,
    outside_pks: Vec<i64>,
    /// Per boot: range start → (range end, pk of the event at the start).
    boots: BTreeMap<String, BTreeMap<i64, (i64, i64)>>,
    ranges: usize,
    incomplete: Vec<String>,
    stopped: bool,
}

impl SessionScan {
    pub fn new(user_id: &str, session: &str) -> Self {
        Self {
            user_id: user_id.to_string(),
            session: session.to_string(),
            span: None,
            seen: 0,
            outside: 0,
            outside_pks: Vec::new(),
            boots: BTreeMap::new(),
            ranges: 0,
            incomplete: Vec::new(),
            stopped: false,
        }
    }

    /// The session's own records' ids: the store looks their `ts` up before feeding.
    pub fn start_id(&self) -> String {
        format!("{}:start", self.session)
    }
    pub fn end_id(&self) -> String {
        format!("{}:end", self.session)
    }

    pub fn user_id(&self) -> &str {
        &self.user_id
    }
    pub fn session(&self) -> &str {
        &self.session
    }

    /// Sets the span from the `ts` of the session's start and end records (both must exist
    /// for the span check to run).
    pub fn set_span(&mut self, start: Option<Micros>, end: Option<Micros>) {
        self.span = start.zip(end);
    }

    /// Feeds one event (in `pk` order); returns false once the scan reads no more.
    pub fn feed(&mut self, row: SessionRow) -> bool {
        if self.stopped {
            return false;
        }
        if self.seen >= MAX_EVENTS {
            self.incomplete.push(format!(
                "the session has more than {MAX_EVENTS} events; checked the first {MAX_EVENTS} only"
            ));
            self.stopped = true;
            return false;
        }
        self.seen += 1;
        if let Some((start, end)) = self.span
            && row.source != Source::Session
            && (row.ts < start || row.ts > end)
        {
            self.outside += 1;
            if self.outside_pks.len() < MAX_LINKED {
                self.outside_pks.push(row.pk);
            }
        }
        if row.source == Source::Egress
            && let Some(seq) = row.seq
            && self.ranges <= MAX_RANGES
        {
            let boot = row.boot.unwrap_or_default();
            let ranges = self.boots.entry(boot).or_default();
            for (from, to) in std::iter::once((seq, seq)).chain(row.covers) {
                let (added, removed) = add_range(ranges, from, to, row.pk);
                self.ranges = (self.ranges + added).saturating_sub(removed);
            }
            if self.ranges > MAX_RANGES {
                self.incomplete.push(format!(
                    "the session's egress seq values form more than {MAX_RANGES} separate runs; \
                     gaps not checked"
                ));
                self.boots.clear();
            }
        }
        true
    }

    /// The flags: events outside the span, `seq` gaps per boot, and `detect.incomplete` if
    /// a cap was reached.
    pub fn finish(self) -> Vec<NewFlag> {
        let (user_id, session) = (self.user_id.as_str(), self.session.as_str());
        let mut flags = Vec::new();
        if let Some((start, end)) = self.span
            && self.outside > 0
        {
            flags.push(NewFlag {
                id: flag_id(&["timing.outside-session", user_id, session]),
                rule_id: "timing.outside-session".into(),
                title: "Events timestamped outside their session".into(),
                severity: Severity::Medium,
                user_id: user_id.to_string(),
                session: Some(session.to_string()),
                detail: format!(
                    "{} events have ts outside the session span {} – {}{}",
                    self.outside,
                    format_micros(start),
                    format_micros(end),
                    if (self.outside_pks.len() as u64) < self.outside {
                        format!(" (the first {MAX_LINKED} linked)")
                    } else {
                        String::new()
                    }
                ),
                event_pks: self.outside_pks,
            });
        }
        if self.incomplete.is_empty() {
            // Gaps per (session, boot): seq starts at 1 and increases by one per attempt.
            for (boot, ranges) in &self.boots {
                let mut missing: Vec<String> = Vec::new();
                let mut around = Vec::new();
                let mut expect = 1;
                for (&first, &(last, pk)) in ranges {
                    if first > expect {
                        missing.push(if first - 1 == expect {
                            expect.to_string()
                        } else {
                            format!("{expect}-{}", first - 1)
                        });
                        if around.len() < MAX_LINKED {
                            around.push(pk);
                        }
                    }
                    expect = last + 1;
                }
                if !missing.is_empty() {
                    flags.push(NewFlag {
                        id: flag_id(&["session.seq-gap", user_id, session, boot]),
                        rule_id: "session.seq-gap".into(),
                        title: "Gap in a session's egress sequence".into(),
                        severity: Severity::High,
                        user_id: user_id.to_string(),
                        session: Some(session.to_string()),
                        detail: format!("boot {boot:?}: missing seq {}", missing.join(", ")),
                        event_pks: around,
                    });
                }
            }
        } else {
            flags.push(incomplete(user_id, session, &self.incomplete.join("; ")));
        }
        flags
    }
}

/// A `detect.incomplete` flag for `session`: a check could not run in full.
pub fn incomplete(user_id: &str, session: &str, why: &str) -> NewFlag {
    NewFlag {
        id: flag_id(&["detect.incomplete", user_id, session]),
        rule_id: "detect.incomplete".into(),
        title: "Detection incomplete for a session".into(),
        severity: Severity::Medium,
        user_id: user_id.to_string(),
        session: Some(session.to_string()),
        detail: why.to_string(),
        event_pks: Vec::new(),
    }
}

/// Adds `[from, to]` to a boot's merged ranges (merging every range it overlaps or touches);
/// returns (ranges added, ranges removed): `(0, 0)` when already held.
fn add_range(
    ranges: &mut BTreeMap<i64, (i64, i64)>,
    from: i64,
    to: i64,
    pk: i64,
) -> (usize, usize) {
    let (mut lo, mut hi, mut keep) = (from, to, pk);
    let mut removed = 0;
    if let Some((&a, &(b, p))) = ranges.range(..from).next_back()
        && b >= from.saturating_sub(1)
    {
        if b >= to {
            return (0, 0);
        }
        (lo, hi, keep) = (a, b.max(to), p);
        ranges.remove(&a);
        removed += 1;
    }
    if removed == 0
        && let Some(&(b, _)) = ranges.get(&from)
        && b >= to
    {
        return (0, 0);
    }
    // Every range starting inside or just after `[lo, hi]` joins it.
    while let Some((a, b, p)) =
        ranges.range(from..=hi.saturating_add(1)).next().map(|(&a, &(b, p))| (a, b, p))
    {
        ranges.remove(&a);
        removed += 1;
        if a == lo {
            keep = p;
        }
        hi = hi.max(b);
    }
    ranges.insert(lo, (hi, keep));
    (1, removed)
}

/// A stored egress event's `suppressed` ranges (empty for every other event).
pub fn covers_of(source: Source, payload: &str) -> Vec<(i64, i64)> {
    if source != Source::Egress || !payload.contains("\"seqs\"") {
        return Vec::new();
    }
    serde_json::from_str::<Value>(payload)
        .ok()
        .and_then(|v| suppressed_seqs(&v))
        .unwrap_or_default()
}

/// The checks over a session already in memory (tests; the stores stream instead).
pub fn check_all(user_id: &str, session: &str, events: &[StoredEvent]) -> Vec<NewFlag> {
    let mut scan = SessionScan::new(user_id, session);
    let find =
        |id: &str| events.iter().find(|e| e.source == Source::Session && e.id == id).map(|e| e.ts);
    scan.set_span(find(&scan.start_id()), find(&scan.end_id()));
    for e in events {
        if !scan.feed(SessionRow {
            pk: e.pk,
            source: e.source,
            ts: e.ts,
            seq: e.seq,
            boot: e.boot.clone(),
            covers: covers_of(e.source, &e.payload),
        }) {
            break;
        }
    }
    scan.finish()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn egress(pk: i64, seq: i64) -> SessionRow {
        SessionRow {
            pk,
            source: Source::Egress,
            ts: 5,
            seq: Some(seq),
            boot: Some("b".into()),
            covers: vec![],
        }
    }

    #[test]
    fn a_suppressed_lines_seqs_are_present_and_a_missing_one_still_shows() {
        let mut s = SessionScan::new("u", "s");
        s.feed(egress(1, 1));
        s.feed(SessionRow { covers: vec![(3, 500), (502, 502)], ..egress(2, 3) });
        s.feed(egress(3, 2));
        s.feed(egress(4, 503));
        assert_eq!(s.ranges, 2, "{:?}", s.boots);
        let flags = s.finish();
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert!(flags[0].detail.ends_with("missing seq 501"), "{}", flags[0].detail);

        let mut s = SessionScan::new("u", "s");
        for (pk, seq) in [(1, 1), (2, 2), (3, 501)] {
            s.feed(egress(pk, seq));
        }
        s.feed(SessionRow { covers: vec![(3, 500)], ..egress(4, 3) });
        assert_eq!(s.ranges, 1, "{:?}", s.boots);
        assert!(s.finish().is_empty());
    }

    #[test]
    fn add_range_merges_everything_it_touches() {
        let mut r = BTreeMap::new();
        for (a, b) in [(1, 1), (5, 6), (9, 9), (20, 30)] {
            assert_eq!(add_range(&mut r, a, b, a), (1, 0));
        }
        assert_eq!(add_range(&mut r, 21, 25, 99), (0, 0));
        assert_eq!(add_range(&mut r, 2, 8, 2), (1, 3));
        assert_eq!(r.iter().map(|(&a, &(b, _))| (a, b)).collect::<Vec<_>>(), [(1, 9), (20, 30)]);
        assert_eq!(add_range(&mut r, 10, 19, 10), (1, 2));
        assert_eq!(r.iter().map(|(&a, &(b, p))| (a, b, p)).collect::<Vec<_>>(), [(1, 30, 1)]);
    }

    #[test]
    fn suppressed_seqs_are_validated_and_counted_once() {
        let v = |s: &str| serde_json::from_str::<Value>(s).unwrap();
        assert_eq!(suppressed_seqs(&v(r#"{"seqs":[[3,5],[9,9]]}"#)), Some(vec![(3, 5), (9, 9)]));
        for bad in [
            r#"{"seqs":[[5,3]]}"#,
            r#"{"seqs":[[0,3]]}"#,
            r#"{"seqs":[]}"#,
            r#"{"seqs":[[1]]}"#,
            r#"{"seqs":"x"}"#,
            "{}",
        ] {
            assert_eq!(suppressed_seqs(&v(bad)), None, "{bad}");
        }
        let many =
            format!(r#"{{"seqs":[{}]}}"#, vec!["[1,1]"; MAX_SUPPRESSED_RANGES + 1].join(","));
        assert_eq!(suppressed_seqs(&v(&many)), None);
        assert_eq!(suppressed_count(&[(3, 5), (9, 9)]), 4);
        assert_eq!(suppressed_count(&[(3, 5), (4, 9)]), 7);
    }

    #[test]
    fn seq_ranges_merge_in_any_order_and_gaps_name_the_event_after_them() {
        let mut s = SessionScan::new("u", "s");
        for (pk, seq) in [(1, 5), (2, 1), (3, 3), (4, 2), (5, 9), (6, 4), (7, 7), (8, 5)] {
            assert!(s.feed(egress(pk, seq)));
        }
        // {1..5} {7} {9}: two runs besides the first.
        assert_eq!(s.ranges, 3);
        let flags = s.finish();
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert!(flags[0].detail.ends_with("missing seq 6, 8"), "{}", flags[0].detail);
        assert_eq!(flags[0].event_pks, vec![7, 5]);
    }

    #[test]
    fn too_many_runs_raise_detect_incomplete_instead_of_growing() {
        let mut s = SessionScan::new("u", "s");
        for k in 0..(MAX_RANGES as i64 + 5) {
            s.feed(egress(k, 2 * k + 1));
        }
        assert!(s.boots.is_empty(), "the ranges were dropped, not kept growing");
        let flags = s.finish();
        assert_eq!(flags.len(), 1, "{flags:?}");
        assert_eq!(flags[0].rule_id, "detect.incomplete");
        assert!(flags[0].detail.contains("separate runs"), "{}", flags[0].detail);
    }

    #[test]
    fn outside_span_links_at_most_max_linked_and_counts_all() {
        let mut s = SessionScan::new("u", "s");
        s.set_span(Some(100), Some(200));
        for pk in 0..(MAX_LINKED as i64 + 10) {
            s.feed(SessionRow {
                pk,
                source: Source::Claude,
                ts: 50,
                seq: None,
                boot: None,
                covers: vec![],
            });
        }
        let flags = s.finish();
        assert_eq!(flags[0].event_pks.len(), MAX_LINKED);
        assert!(flags[0].detail.starts_with(&format!("{} events", MAX_LINKED + 10)));
    }
}
