//! `/people/{user_id}`: one person's timeline. Egress lines, transcript lines, session
//! start/end records and external and gate events interleaved by their own `ts` (newest
//! first), backdating marked by DESIGN §8's rule ([`super::backdated`]), a filter form whose
//! values live in the URL ([`TimelineFilter`] is the query string's shape), an "older" cursor
//! link, and the events-per-hour chart whose bars narrow the time range.

use super::layout::{Section, Viewer, page};
use super::svg::{self, HourBucket};
use super::{
    HOUR, Micros, SessionSpan, backdated, one_line, person_href, query, session_href, when,
};
use crate::review::{Source, transcript};
use maud::{Markup, html};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Characters of a row's summary at most (pages stay small: 500 rows under 200 KB).
const SUMMARY_MAX: usize = 100;

/// The timeline's filters, as the query string carries them (`?source=egress&decision=denied
/// &host=…&from=…`); an empty string is "any". The routes decode it with `serde_urlencoded`
/// (unknown parameters such as `cursor` are ignored here) and apply it to the store query.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TimelineFilter {
    /// `egress`, `session`, `claude`, `codex`, `external`, `gate`.
    pub source: String,
    /// The event `type` (`denied`, `user`, `deploy.approved`, …).
    #[serde(rename = "type")]
    pub kind: String,
    /// `allowed` or `denied` (egress lines).
    pub decision: String,
    /// Egress host (the name and its subdomains).
    pub host: String,
    /// The repo named in egress and session records.
    pub repo: String,
    /// Airlock session id.
    pub session: String,
    /// Time range on `ts`, RFC 3339: `from` inclusive, `until` exclusive.
    pub from: String,
    pub until: String,
    /// Free text, matched in the payload.
    pub q: String,
}

impl TimelineFilter {
    fn pairs(&self) -> [(&'static str, &str); 9] {
        [
            ("source", &self.source),
            ("type", &self.kind),
            ("decision", &self.decision),
            ("host", &self.host),
            ("repo", &self.repo),
            ("session", &self.session),
            ("from", &self.from),
            ("until", &self.until),
            ("q", &self.q),
        ]
    }

    /// The timeline URL of `user_id` with these filters (and a cursor, when paging).
    pub fn href(&self, user_id: &str, cursor: Option<&str>) -> String {
        let p = self.pairs();
        let all = p.iter().copied().chain(cursor.map(|c| ("cursor", c)));
        format!("{}{}", person_href(user_id), query(all))
    }

    /// The same filters narrowed to `[from, until)`.
    pub fn with_range(&self, from: Micros, until: Micros) -> Self {
        Self { from: when(from), until: when(until), ..self.clone() }
    }

    /// The console export of `user_id`'s events under the filters a store query applies
    /// (source, type, session, time range), in `format` (`jsonl` or `csv`).
    pub fn export_href(&self, user_id: &str, format: &str) -> String {
        let pairs = [
            ("user", user_id),
            ("format", format),
            ("source", &self.source),
            ("type", &self.kind),
            ("session", &self.session),
            ("from", &self.from),
            ("until", &self.until),
        ];
        format!("/export{}", query(pairs))
    }

    /// Whether any filter is set.
    pub fn is_empty(&self) -> bool {
        self.pairs().iter().all(|(_, v)| v.is_empty())
    }
}

/// One event of the timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineEvent {
    pub pk: i64,
    pub source: Source,
    /// The event `type`.
    pub kind: String,
    pub ts: Micros,
    pub received_at: Micros,
    /// The envelope `session` (an Airlock session for egress and session records, the
    /// agent's session id for transcript lines).
    pub session: Option<String>,
    /// Transcript lines: the Airlock session whose end record covered the line.
    pub airlock_session: Option<String>,
    /// The stored payload's JSON text.
    pub payload: String,
    /// Flags linked to this event.
    pub flags: u32,
    /// The span of the event's Airlock session, when known (for the backdating rule).
    pub span: Option<SessionSpan>,
    /// The event's leaf in the review log and, when a checkpoint that clients witnessed
    /// covers it, how many distinct clients witnessed the latest such checkpoint
    /// (docs/evidence.md).
    pub leaf: Option<u64>,
    pub witnessed_by: u64,
}

impl TimelineEvent {
    /// The Airlock session this event belongs to, for the drill-down link.
    pub fn airlock_session(&self) -> Option<&str> {
        match self.source {
            Source::Claude | Source::Codex => self.airlock_session.as_deref(),
            _ => self.session.as_deref(),
        }
    }

    /// Whether an egress attempt was refused; `None` for other events, and for an action
    /// gate's step lines (type `gate`), which are not attempts.
    fn denied(&self, p: &Value) -> Option<bool> {
        (self.source == Source::Egress && self.kind != "gate")
            .then(|| p.get("allowed").and_then(Value::as_bool) != Some(true))
    }
}

/// The page's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelinePage {
    pub viewer: Viewer,
    pub user_id: String,
    pub email: String,
    pub filter: TimelineFilter,
    /// One page of events (any order: shown newest first by `ts`).
    pub events: Vec<TimelineEvent>,
    /// The store cursor for the next, older page; `None` on the last page.
    pub older: Option<String>,
    /// The chart's hours, oldest first (see [`buckets`]).
    pub hours: Vec<HourBucket>,
}

/// Hour buckets over `[start, start + hours h)` counted from `events` (the routes may count
/// them in the store instead and fill [`TimelinePage::hours`] themselves).
pub fn buckets(events: &[TimelineEvent], start: Micros, hours: usize) -> Vec<HourBucket> {
    let mut out: Vec<HourBucket> = (0..hours)
        .map(|i| HourBucket { start: start + i as Micros * HOUR, ..Default::default() })
        .collect();
    for e in events {
        if e.ts < start {
            continue;
        }
        let Some(b) = usize::try_from((e.ts - start) / HOUR).ok().and_then(|i| out.get_mut(i))
        else {
            continue;
        };
        let p: Value = serde_json::from_str(&e.payload).unwrap_or(Value::Null);
        match (e.source, e.denied(&p)) {
            (_, Some(true)) => b.denied += 1,
            (_, Some(false)) => b.allowed += 1,
            (Source::Claude | Source::Codex, _) => b.transcript += 1,
            _ => {}
        }
        b.flags += e.flags;
    }
    out
}

/// What one event says, in one line.
pub fn summary(e: &TimelineEvent, p: &Value) -> String {
    let s = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or("");
    let text = match e.source {
        Source::Egress => {
            let mut t = format!("{} {}", s("method"), s("host"));
            if let Some(port) = p.get("port").and_then(Value::as_u64) {
                t.push_str(&format!(":{port}"));
            }
            if !s("path").is_empty() {
                t.push_str(&format!(" {}", s("path")));
            }
            if let Some(st) = p.get("status").and_then(Value::as_u64) {
                t.push_str(&format!(" → {st}"));
            }
            if !s("reason").is_empty() && s("reason") != "allowed" {
                t.push_str(&format!(" ({})", s("reason")));
            }
            t
        }
        Source::Session => match e.kind.as_str() {
            "start" => {
                let cmd = p.get("command").map(command_line).unwrap_or_default();
                format!("session start: {cmd}")
            }
            "end" => match p.get("exit_status").and_then(Value::as_i64) {
                Some(n) => format!("session end: exit {n}"),
                None => format!("session end: {}", s("end_reason")),
            },
            "transcript.file" => format!("transcript file {}", s("file")),
            _ => compact(p),
        },
        Source::Claude | Source::Codex => {
            let v = transcript::view(e.source, p);
            let what = v.command.first().or(v.text.first()).cloned().unwrap_or_default();
            if v.tool.is_empty() { what } else { format!("[{}] {what}", v.tool.join(", ")) }
        }
        Source::Gate => gate_step(p).unwrap_or_else(|| compact(p)),
        Source::External => compact(p),
    };
    one_line(&text, SUMMARY_MAX)
}

/// A server-written `gate.*` event as one line: its step, what the gate holds, who decided.
fn gate_step(p: &Value) -> Option<String> {
    let s = |k: &str| p.get(k).and_then(Value::as_str);
    let port = p.get("port").and_then(Value::as_u64).and_then(|n| u16::try_from(n).ok());
    let target = crate::gate::target_text(
        s("kind").unwrap_or("external"),
        s("method"),
        s("host"),
        port,
        s("request"),
    );
    let mut t = format!("{}: {target}", s("step")?);
    if let Some(by) = s("by_email") {
        t.push_str(&format!(" (by {by})"));
    }
    Some(t)
}

/// A command as recorded (an argv array or a string), space-joined.
pub fn command_line(v: &Value) -> String {
    match v {
        Value::Array(a) => a
            .iter()
            .map(|x| x.as_str().map_or_else(|| x.to_string(), str::to_string))
            .collect::<Vec<_>>()
            .join(" "),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn compact(p: &Value) -> String {
    let t = p.to_string();
    one_line(&t, SUMMARY_MAX)
}

pub fn render(p: &TimelinePage) -> Markup {
    let mut events: Vec<&TimelineEvent> = p.events.iter().collect();
    events.sort_by_key(|e| std::cmp::Reverse((e.ts, e.pk)));
    let bar_href =
        |from: Micros, until: Micros| p.filter.with_range(from, until).href(&p.user_id, None);
    let payload_filters = !(p.filter.decision.is_empty()
        && p.filter.host.is_empty()
        && p.filter.repo.is_empty()
        && p.filter.q.is_empty());
    let body = html! {
        (filter_form(p))
        p.export {
            "Export: "
            a href=(p.filter.export_href(&p.user_id, "jsonl")) { "JSONL" }
            " · "
            a href=(p.filter.export_href(&p.user_id, "csv")) { "CSV" }
            span.mut {
                " (every export is recorded; CSV is for spreadsheets and cannot be verified later"
                @if payload_filters { "; decision, host, repo and text filters are not applied to exports" }
                ")"
            }
        }
        @if !p.hours.is_empty() {
            section aria-label="Events per hour" {
                (svg::hour_chart(&p.hours, &bar_href))
                p.legend.mut {
                    span { svg width="10" height="10" { rect.al width="10" height="10" {} } " egress allowed" }
                    span { svg width="10" height="10" { rect.de width="10" height="10" {} } " egress denied" }
                    span { svg width="10" height="10" { rect.tr width="10" height="10" {} } " transcript lines" }
                    span { svg width="10" height="10" { rect.fl width="10" height="10" {} } " flags" }
                }
            }
        }
        @if events.is_empty() {
            p.mut { "No events match." }
        } @else {
            p.mut { "⚠ marks a backdated event: its " code { "ts" } " is more than 5 minutes after the server received it, or outside its session's span." }
            table.tl {
                thead { tr { th scope="col" { "Time (ts)" } th scope="col" { "Source, type" } th scope="col" { "What" } th scope="col" { "Session" } } }
                tbody {
                    @for (i, e) in events.iter().enumerate() {
                        (row(p, e, i.checked_sub(1).and_then(|j| events[j].airlock_session())))
                    }
                }
            }
        }
        @if let Some(c) = &p.older {
            p { a rel="next" href=(p.filter.href(&p.user_id, Some(c))) { "Older events →" } }
        }
    };
    page(&format!("Timeline of {}", p.email), &p.viewer, Section::People, body)
}

/// One row, kept small (a page of 500 rows stays under 200 KB): the session link is written
/// only where the session changes from the row above.
fn row(p: &TimelinePage, e: &TimelineEvent, prev_session: Option<&str>) -> Markup {
    let v: Value = serde_json::from_str(&e.payload).unwrap_or(Value::Null);
    let back = backdated(e.ts, e.received_at, e.span);
    let denied = e.denied(&v) == Some(true);
    html! {
        tr.no[denied] {
            td {
                (when(e.ts))
                @if let Some(b) = back { " " abbr.b title=(b.short()) { "⚠" } }
                @if let (Some(leaf), true) = (e.leaf, e.witnessed_by > 0) {
                    " " abbr.w title=(format!(
                        "in the review log at leaf {leaf}, under a checkpoint {} client{} witnessed",
                        e.witnessed_by, if e.witnessed_by == 1 { "" } else { "s" }
                    )) { "✓" }
                }
            }
            td { (e.source.as_str()) " " (one_line(&e.kind, 64)) }
            td {
                @if e.flags > 0 { abbr.b title="flagged" { "⚑" } " " }
                (summary(e, &v))
            }
            td {
                @match e.airlock_session() {
                    Some(s) if prev_session == Some(s) => span.mut title="same session" { "″" },
                    Some(s) => a href=(session_href(s, &p.user_id)) { (one_line(s, 12)) },
                    None => {},
                }
            }
        }
    }
}

fn filter_form(p: &TimelinePage) -> Markup {
    let f = &p.filter;
    let text = |name: &str, label: &str, value: &str, hint: &str| {
        html! { label { (label) input type="text" name=(name) value=(value) placeholder=(hint); } }
    };
    html! {
        form.filters method="get" action=(person_href(&p.user_id)) {
            label { "Source"
                select name="source" {
                    option value="" selected[f.source.is_empty()] { "any" }
                    @for s in Source::ALL {
                        option value=(s.as_str()) selected[f.source == s.as_str()] { (s.as_str()) }
                    }
                }
            }
            (text("type", "Type", &f.kind, "denied, user, …"))
            label { "Decision"
                select name="decision" {
                    option value="" selected[f.decision.is_empty()] { "any" }
                    option value="allowed" selected[f.decision == "allowed"] { "allowed" }
                    option value="denied" selected[f.decision == "denied"] { "denied" }
                }
            }
            (text("host", "Host", &f.host, "example.com"))
            (text("repo", "Repo", &f.repo, ""))
            (text("session", "Session", &f.session, ""))
            (text("from", "From (ts)", &f.from, "2026-03-04T09:00:00Z"))
            (text("until", "Until (ts)", &f.until, "2026-03-04T10:00:00Z"))
            (text("q", "Text", &f.q, "free text"))
            button type="submit" { "Filter" }
            @if !f.is_empty() { a href=(person_href(&p.user_id)) { "clear" } }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::review::Role;
    use crate::review::render::testutil::{XSS, assert_inert, assert_no_urls, viewer};
    use crate::review::render::{BACKDATE_SLACK, DAY};

    const T0: Micros = 1_772_614_800_000_000; // 2026-03-04T09:00:00Z

    fn ev(pk: i64, source: Source, kind: &str, ts: Micros, payload: Value) -> TimelineEvent {
        TimelineEvent {
            pk,
            source,
            kind: kind.into(),
            ts,
            received_at: ts + 1_000_000,
            session: Some("s-7f3a".into()),
            airlock_session: Some("s-7f3a".into()),
            payload: payload.to_string(),
            flags: 0,
            leaf: None,
            witnessed_by: 0,
            span: None,
        }
    }

    #[test]
    fn gate_steps_read_as_one_line() {
        let step = |p: Value| summary(&ev(9, Source::Gate, "gate.approved", T0, p.clone()), &p);
        let p = serde_json::json!({"step": "approved", "request": "deploy\nv2", "by_email": "r@x"});
        assert_eq!(step(p), "approved: deploy v2 (by r@x)");
        let p = serde_json::json!({"step": "requested", "kind": "egress", "method": "CONNECT",
            "host": "api.pay.test", "port": 443});
        assert_eq!(step(p), "requested: CONNECT api.pay.test:443");
        let p = serde_json::json!({"x": 1});
        assert_eq!(step(p.clone()), p.to_string(), "anything else stays raw");
    }

    fn sample() -> Vec<TimelineEvent> {
        vec![
            ev(
                1,
                Source::Session,
                "start",
                T0,
                serde_json::json!({"command": ["claude", "--resume"]}),
            ),
            ev(
                2,
                Source::Egress,
                "denied",
                T0 + 3 * HOUR,
                serde_json::json!({"method": "CONNECT", "host": "pastebin.com", "port": 443, "allowed": false, "reason": "not_allowed"}),
            ),
            ev(
                3,
                Source::Claude,
                "user",
                T0 + 60_000_000,
                serde_json::json!({"type": "user", "message": {"role": "user", "content": "why does it flake?"}}),
            ),
            ev(
                4,
                Source::Egress,
                "connect",
                T0 + 2 * HOUR,
                serde_json::json!({"method": "CONNECT", "host": "api.anthropic.com", "port": 443, "allowed": true, "reason": "allowed"}),
            ),
            ev(
                5,
                Source::External,
                "deploy.approved",
                T0 + 4 * HOUR,
                serde_json::json!({"by": "ci"}),
            ),
        ]
    }

    fn page_of(events: Vec<TimelineEvent>, filter: TimelineFilter) -> TimelinePage {
        let hours = buckets(&events, T0, 24);
        TimelinePage {
            viewer: viewer(Role::Reviewer),
            user_id: "u-ana".into(),
            email: "ana@example.test".into(),
            filter,
            events,
            older: Some("17".into()),
            hours,
        }
    }

    #[test]
    fn events_interleave_by_ts_newest_first_with_summaries() {
        let html = render(&page_of(sample(), TimelineFilter::default())).into_string();
        let pos = |s: &str| html.find(s).unwrap_or_else(|| panic!("{s} missing"));
        assert!(pos("deploy.approved") < pos("pastebin.com"));
        assert!(pos("pastebin.com") < pos("api.anthropic.com"));
        assert!(pos("api.anthropic.com") < pos("why does it flake?"));
        assert!(pos("why does it flake?") < pos("session start: claude --resume"));
        assert!(html.contains("CONNECT pastebin.com:443 (not_allowed)"));
        assert!(html.contains(r#"<tr class="no">"#), "denied rows are marked");
        assert_eq!(
            html.matches(r#"<a href="/sessions/s-7f3a?user=u-ana">s-7f3a</a>"#).count(),
            1,
            "linked where the session changes"
        );
        assert_eq!(html.matches("title=\"same session\"").count(), 4);
        assert!(html.contains(r#"<a rel="next" href="/people/u-ana?cursor=17">"#));
        assert!(html.contains("Timeline of ana@example.test"));
        assert!(html.contains(r#"<a href="/export?user=u-ana&amp;format=csv">CSV</a>"#));
        assert_no_urls(&html);
    }

    #[test]
    fn backdated_events_are_marked() {
        let mut late = ev(9, Source::External, "x", T0 + HOUR, serde_json::json!({}));
        late.received_at = T0 + HOUR - BACKDATE_SLACK - 1;
        let mut outside =
            ev(10, Source::Egress, "connect", T0 - DAY, serde_json::json!({"allowed": true}));
        outside.span = Some(SessionSpan { start: T0, end: Some(T0 + HOUR) });
        outside.received_at = T0;
        let fine = ev(11, Source::Egress, "connect", T0 + 1, serde_json::json!({"allowed": true}));
        let html =
            render(&page_of(vec![late, outside, fine], TimelineFilter::default())).into_string();
        assert_eq!(html.matches(r#"<abbr class="b""#).count(), 2);
        assert!(html.contains(r#"title="ts more than 5 minutes after receipt""#));
        assert!(html.contains(r#"title="ts outside its session""#));
    }

    #[test]
    fn rows_under_a_witnessed_checkpoint_are_marked() {
        let mut covered = ev(1, Source::External, "x", T0, serde_json::json!({}));
        covered.leaf = Some(41);
        covered.witnessed_by = 2;
        // In the log, but no witnessed checkpoint covers it yet: no mark.
        let mut sequenced = ev(2, Source::External, "x", T0 + 1, serde_json::json!({}));
        sequenced.leaf = Some(42);
        let plain = ev(3, Source::External, "x", T0 + 2, serde_json::json!({}));
        let html = render(&page_of(vec![covered, sequenced, plain], TimelineFilter::default()))
            .into_string();
        assert_eq!(html.matches(r#"<abbr class="w""#).count(), 1, "{html}");
        assert!(html.contains(
            r#"title="in the review log at leaf 41, under a checkpoint 2 clients witnessed""#
        ));
    }

    #[test]
    fn gate_steps_are_charted_as_neither_allowed_nor_denied() {
        let step = ev(
            1,
            Source::Egress,
            "gate",
            T0 + 1,
            serde_json::json!({"method": "GATE", "allowed": false}),
        );
        let denied = ev(2, Source::Egress, "denied", T0 + 2, serde_json::json!({"allowed": false}));
        let b = buckets(&[step, denied], T0, 1);
        assert_eq!((b[0].allowed, b[0].denied), (0, 1));
    }

    #[test]
    fn filters_are_kept_in_form_links_and_chart() {
        let f = TimelineFilter {
            source: "egress".into(),
            decision: "denied".into(),
            host: "a b&c".into(),
            q: "x=1#y".into(),
            ..Default::default()
        };
        let html = render(&page_of(sample(), f.clone())).into_string();
        assert!(html.contains(r#"<option value="egress" selected>egress</option>"#));
        assert!(html.contains(r#"<option value="denied" selected>denied</option>"#));
        assert!(html.contains(r#"name="host" value="a b&amp;c""#));
        assert!(html.contains("/people/u-ana?source=egress&amp;decision=denied&amp;host=a%20b%26c&amp;q=x%3D1%23y&amp;cursor=17"));
        // A bar narrows the range and keeps the other filters.
        assert!(html.contains("/people/u-ana?source=egress&amp;decision=denied&amp;host=a%20b%26c&amp;from=2026-03-04T09%3A00%3A00.000Z&amp;until=2026-03-04T10%3A00%3A00.000Z&amp;q=x%3D1%23y"));
        // And it round-trips through the query decoder the routes use.
        let href = f.href("u", Some("c"));
        let back: TimelineFilter =
            serde_urlencoded::from_str(href.split_once('?').unwrap().1).unwrap();
        assert_eq!(back, f);
    }

    #[test]
    fn buckets_split_allowed_denied_transcript_and_flags() {
        let mut ev = sample();
        ev[1].flags = 2;
        let b = buckets(&ev, T0, 24);
        assert_eq!(b.len(), 24);
        assert_eq!(
            (b[0].transcript, b[0].allowed, b[0].denied),
            (1, 0, 0),
            "session start not counted"
        );
        assert_eq!(b[2].allowed, 1);
        assert_eq!((b[3].denied, b[3].flags), (1, 2));
        assert_eq!(b[4].total(), 0, "external events are not in the three series");
    }

    #[test]
    fn hostile_payloads_hosts_and_ids_render_inert() {
        let mut events = Vec::new();
        for (i, x) in XSS.iter().enumerate() {
            let i = i as i64;
            let mut e = ev(
                i * 4,
                Source::Egress,
                x,
                T0 + i,
                serde_json::json!({"method": x, "host": x, "path": x, "allowed": false, "reason": x}),
            );
            e.session = Some((*x).into());
            events.push(e);
            events.push(ev(i * 4 + 1, Source::Claude, x, T0 + i, serde_json::json!({"type": "assistant", "message": {"content": [{"type": "tool_use", "name": x, "input": {"command": x}}]}})));
            events.push(ev(i * 4 + 2, Source::External, x, T0 + i, serde_json::json!({"note": x})));
            events.push(ev(
                i * 4 + 3,
                Source::Session,
                "start",
                T0 + i,
                serde_json::json!({"command": [x]}),
            ));
        }
        let f = TimelineFilter {
            host: XSS[1].into(),
            q: XSS[3].into(),
            from: XSS[2].into(),
            ..Default::default()
        };
        let mut p = page_of(events, f);
        p.user_id = XSS[6].into();
        p.email = XSS[0].into();
        p.older = Some(XSS[1].into());
        let html = render(&p).into_string();
        assert_inert(&html);
        assert!(html.contains("/sessions/javascript%3Aalert%281%29?user="));
        assert!(!html.contains("<img"));
        // A URL the data holds appears as escaped text only, never as a link.
        assert!(
            html.contains("https://evil.example/?q=&lt;b&gt; https://evil.example/?q=&lt;b&gt;")
        );
        assert!(html.contains("/sessions/https%3A%2F%2Fevil.example%2F%3Fq%3D%3Cb%3E?user="));
    }

    #[test]
    fn five_hundred_rows_stay_under_200_kb() {
        // Worst cases at once: long hosts, every row denied, flagged and backdated.
        let big = "x".repeat(100_000);
        let events: Vec<_> = (0..500)
            .map(|i| {
                let mut e = ev(i, Source::Egress, "denied", T0 + i * 60_000_000, serde_json::json!({"method": "CONNECT", "host": format!("h{i}.{big}"), "port": 443, "allowed": false, "reason": "not_allowed"}));
                // Sessions change every 5 rows (each is linked where it changes).
                e.session = Some(format!("{:08}-61c3-4f08-8e5d-2a9c4b71e6f3", i / 5));
                e.span = Some(SessionSpan { start: T0 + DAY, end: None });
                e.flags = 1;
                e
            })
            .collect();
        let mut p = page_of(events, TimelineFilter::default());
        p.hours = buckets(&p.events, T0, 24);
        let html = render(&p).into_string();
        assert_eq!(html.matches("<tr").count(), 501);
        let i = html.find("<tbody>").unwrap();
        eprintln!("500 rows: {} bytes", html.len());
        assert!(
            html.len() < 200_000,
            "{} bytes; chart {} bytes; a row: {}",
            html.len(),
            html.find("</svg>").unwrap(),
            &html[i..i + 900]
        );
    }
}
