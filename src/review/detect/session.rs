//! Session checks in bounded memory: [`SessionScan`] is fed a session's events one at a time
//! (their envelope only, never payloads) and keeps only what the checks need — the session's
//! span, a count and up to [`MAX_LINKED`] pks of events outside it, and each boot's `seq`
//! values as merged ranges. Past [`MAX_EVENTS`] events or [`MAX_RANGES`] ranges it stops
//! growing and raises `detect.incomplete` instead (docs/review.md, "Bounded session checks").

use super::flag_id;
use crate::review::{Micros, NewFlag, Severity, Source, StoredEvent, format_micros};
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
            self.ranges = self.ranges + add_seq(ranges, seq, row.pk) - 1;
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

/// Adds `seq` to a boot's merged ranges; returns how many ranges there are now minus before,
/// plus one (0: two ranges merged, 1: extended or already held, 2: a new range).
fn add_seq(ranges: &mut BTreeMap<i64, (i64, i64)>, seq: i64, pk: i64) -> usize {
    let below = ranges.range(..=seq).next_back().map(|(&a, &(b, p))| (a, b, p));
    if let Some((_, b, _)) = below
        && b >= seq
    {
        return 1;
    }
    let above = seq.checked_add(1).and_then(|n| ranges.get(&n).copied());
    match (below.filter(|&(_, b, _)| b.checked_add(1) == Some(seq)), above) {
        (Some((a, _, p)), Some((end, _))) => {
            ranges.remove(&(seq + 1));
            ranges.insert(a, (end, p));
            0
        }
        (Some((a, _, p)), None) => {
            ranges.insert(a, (seq, p));
            1
        }
        (None, Some((end, _))) => {
            ranges.remove(&(seq + 1));
            ranges.insert(seq, (end, pk));
            1
        }
        (None, None) => {
            ranges.insert(seq, (seq, pk));
            2
        }
    }
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
        SessionRow { pk, source: Source::Egress, ts: 5, seq: Some(seq), boot: Some("b".into()) }
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
            s.feed(SessionRow { pk, source: Source::Claude, ts: 50, seq: None, boot: None });
        }
        let flags = s.finish();
        assert_eq!(flags[0].event_pks.len(), MAX_LINKED);
        assert!(flags[0].detail.starts_with(&format!("{} events", MAX_LINKED + 10)));
    }
}
