//! The console's read pages: `/people`, one person's timeline `/people/{user_id}`, the
//! session drill-down `/sessions/{session}?user=`, and the admins' `/access-log`. Each reads
//! the store, fills a [`crate::review::render`] struct and renders it; a view of anyone
//! else's history is recorded ([`view::record_view`]) before the store is asked for it, and
//! takes one of the reader's read slots like an API read.

use super::view::{self, EVENT_READ};
use super::{SignedIn, html_resp, store_page};
use crate::review::reads::{Busy, Cursor, ReadPermit, export};
use crate::review::render::people::{OpenFlags, PeoplePage, PersonRow};
use crate::review::render::session::{EgressLine, FileMark, SessionPage, TranscriptLine};
use crate::review::render::svg::HourBucket;
use crate::review::render::timeline::{TimelineEvent, TimelineFilter, TimelinePage};
use crate::review::render::{self, DAY, HOUR, Section, SessionSpan};
use crate::review::server::AppState;
use crate::review::store::{EventOrder, EventQuery, PersonActivity, Store};
use crate::review::{
    Micros, Role, Source, StoredEvent, User, format_micros, now_micros, parse_rfc3339,
    transcript_files,
};
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use maud::html;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

type Resp = Response<Full<Bytes>>;

/// Rows on one timeline page (500 worst-case rows render under 200 KB; see the renderer's
/// test).
pub const TIMELINE_ROWS: usize = 200;
/// Rows one timeline request reads at most while filtering on the payload (decision, host,
/// repo, text) before it stops and links "older" from where it got to, so a rare match in a
/// long history costs several clicks, never an unbounded request.
pub const TIMELINE_SCAN: usize = 20_000;
/// Rows read per store page while scanning.
const SCAN_PAGE: u32 = 1_000;
/// Payload bytes per store page while scanning.
const SCAN_BYTES: u64 = 4 * 1024 * 1024;
/// Distinct Airlock sessions whose span is looked up for one timeline page.
const SPAN_SESSIONS: usize = 50;
/// Events one drill-down shows at most (its transcript and its egress rail together).
pub const SESSION_ROWS: u32 = 5_000;
/// Rows on one access-log page.
pub const ACCESS_ROWS: u32 = 200;

/// A read slot for a console page, or the 429 page.
pub(super) fn read_slot<S: Store>(st: &AppState<S>, who: &SignedIn) -> Result<ReadPermit, Resp> {
    st.reads.try_acquire(&who.user.id).map_err(|busy| {
        let text = match busy {
            Busy::User => "You have too many reads in progress; try again in a moment.",
            Busy::Server => "The review server is busy; try again in a moment.",
        };
        let mut r = view::error_page(who, StatusCode::TOO_MANY_REQUESTS, "Busy", text);
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        r
    })
}

/// Percent-decodes a path segment (RFC 3986 §2.1); `None` if it is malformed, not UTF-8 or
/// holds NUL.
pub fn decode_segment(raw: &str) -> Option<String> {
    let b = raw.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            if !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().filter(|s| !s.contains('\0') && s.len() <= 1024)
}

fn ok_page(markup: maud::Markup) -> Resp {
    html_resp(StatusCode::OK, markup)
}

/// `GET /people`: everyone a reviewer may see (a member: themself), with today's and the
/// week's counts, denied attempts, open flags by severity and the latest receipt.
pub async fn people<S: Store>(st: &AppState<S>, req: &Request<Incoming>) -> Result<Resp, Resp> {
    let who = view::require(st, req).await?;
    let users: Vec<User> = if who.user.role.can_review() {
        st.store.list_users().await.map_err(store_page)?
    } else {
        vec![who.user.clone()]
    };
    let _slot = read_slot(st, &who)?;
    if who.user.role.can_review() {
        view::record_view(st, &who, None, "people", json!({})).await?;
    }
    let now = now_micros();
    let today = now - now.rem_euclid(DAY);
    let week_start = today - 6 * DAY;
    let ids: Vec<String> = users.iter().map(|u| u.id.clone()).collect();
    let activity = st.store.person_activity(&ids, week_start).await.map_err(store_page)?;
    let mut activity: std::collections::HashMap<String, PersonActivity> =
        activity.into_iter().map(|a| (a.user_id.clone(), a)).collect();
    let mut rows: Vec<PersonRow> = users
        .iter()
        .map(|u| {
            let a = activity.remove(&u.id).unwrap_or_default();
            let mut open = OpenFlags::default();
            for (severity, n) in &a.open_flags {
                match severity.as_str() {
                    "critical" => open.critical += n,
                    "high" => open.high += n,
                    "medium" => open.medium += n,
                    _ => open.low += n,
                }
            }
            PersonRow {
                user_id: u.id.clone(),
                email: u.email.clone(),
                role: u.role.as_str().to_string(),
                events_today: a.daily[6].0,
                events_7d: a.daily.iter().map(|d| d.0).sum(),
                denied_7d: a.daily.iter().map(|d| d.1).sum(),
                open_flags: open,
                last_activity: a.last_received,
                daily: a.daily.map(|d| d.0),
            }
        })
        .collect();
    // Most recently active first; people who never published last, by email.
    rows.sort_by(|a, b| b.last_activity.cmp(&a.last_activity).then_with(|| a.email.cmp(&b.email)));
    Ok(ok_page(render::people::render(&PeoplePage {
        viewer: view::viewer(&who),
        now,
        people: rows,
    })))
}

/// A timeline request's filters, checked.
struct TimelineAsk {
    filter: TimelineFilter,
    source: Option<Source>,
    from: Option<Micros>,
    until: Option<Micros>,
    cursor: Option<Cursor>,
}

impl TimelineAsk {
    /// The store query of these filters over `user_id`'s events, oldest first by `ts` (the
    /// filters a store applies: source, type, session, time range).
    fn store_query(&self, user_id: &str) -> EventQuery {
        let f = &self.filter;
        EventQuery {
            user_id: Some(user_id.to_string()),
            source: self.source,
            any_session: (!f.session.is_empty()).then(|| f.session.clone()),
            kinds: if f.kind.is_empty() { Vec::new() } else { vec![f.kind.clone()] },
            ts_since: self.from,
            ts_until: self.until,
            order: EventOrder::Ts,
            ..EventQuery::default()
        }
    }
}

fn timeline_ask(who: &SignedIn, pairs: &[(String, String)]) -> Result<TimelineAsk, Resp> {
    let mut filter = TimelineFilter::default();
    let mut cursor = None;
    for (k, v) in pairs {
        let v = v.trim().to_string();
        match k.as_str() {
            "source" => filter.source = v,
            "type" => filter.kind = v,
            "decision" => filter.decision = v,
            "host" => filter.host = v,
            "repo" => filter.repo = v,
            "session" => filter.session = v,
            "from" => filter.from = v,
            "until" => filter.until = v,
            "q" => filter.q = v,
            "cursor" if !v.is_empty() => {
                cursor = Some(Cursor::parse(&v, EventOrder::Ts).ok_or_else(|| {
                    view::bad_request(
                        who,
                        "The cursor in this address is not one the console wrote.",
                    )
                })?);
            }
            // Unknown parameters are ignored: old bookmarks keep working.
            _ => {}
        }
    }
    let source = match filter.source.as_str() {
        "" => None,
        s => Some(
            s.parse::<Source>()
                .map_err(|_| view::bad_request(who, "Unknown source; pick one of the list."))?,
        ),
    };
    if !matches!(filter.decision.as_str(), "" | "allowed" | "denied") {
        return Err(view::bad_request(who, "The decision filter is allowed or denied."));
    }
    let time = |name: &str, v: &str| -> Result<Option<Micros>, Resp> {
        if v.is_empty() {
            return Ok(None);
        }
        parse_rfc3339(v).map(Some).ok_or_else(|| {
            view::bad_request(
                who,
                &format!("{name} must be an RFC 3339 time such as 2026-03-04T09:00:00Z."),
            )
        })
    };
    let from = time("From", &filter.from)?;
    let until = time("Until", &filter.until)?;
    for s in [&filter.kind, &filter.host, &filter.repo, &filter.session, &filter.q] {
        if s.len() > 1024 || s.contains('\0') {
            return Err(view::bad_request(who, "A filter is longer than 1 KiB or holds NUL."));
        }
    }
    Ok(TimelineAsk { filter, source, from, until, cursor })
}

/// Whether `host` is `want` or one of its subdomains (ASCII case-insensitive).
fn host_matches(host: &str, want: &str) -> bool {
    let (h, w) = (host.to_ascii_lowercase(), want.trim_end_matches('.').to_ascii_lowercase());
    h == w || h.ends_with(&format!(".{w}"))
}

/// The filters the store cannot apply (they read the payload), on one event.
fn payload_matches(f: &TimelineFilter, e: &StoredEvent, needle: &str) -> bool {
    if f.decision.is_empty() && f.host.is_empty() && f.repo.is_empty() && needle.is_empty() {
        return true;
    }
    let p: Value = serde_json::from_str(&e.payload).unwrap_or(Value::Null);
    let s = |k: &str| p.get(k).and_then(Value::as_str).unwrap_or("");
    if !f.decision.is_empty() {
        // A gate's step lines are neither allowed nor denied attempts.
        if e.source != Source::Egress || e.kind == "gate" {
            return false;
        }
        let allowed = p.get("allowed").and_then(Value::as_bool) == Some(true);
        if allowed != (f.decision == "allowed") {
            return false;
        }
    }
    if !f.host.is_empty() && !host_matches(s("host"), &f.host) {
        return false;
    }
    if !f.repo.is_empty() && s("repo") != f.repo && s("repo_path") != f.repo {
        return false;
    }
    if !needle.is_empty() {
        let hay = format!("{} {} {}", e.kind, e.id, e.payload).to_lowercase();
        // The payload is JSON text: also look for the needle as JSON would escape it.
        let escaped = serde_json::to_string(needle).unwrap_or_default();
        let escaped = escaped.trim_matches('"');
        if !hay.contains(needle) && !hay.contains(escaped) {
            return false;
        }
    }
    true
}

/// `GET /people/{user_id}`: one person's timeline, newest first.
pub async fn timeline<S: Store>(
    st: &AppState<S>,
    req: &Request<Incoming>,
    raw: &str,
) -> Result<Resp, Resp> {
    let who = view::require(st, req).await?;
    let Some(id) = decode_segment(raw) else {
        return Err(view::bad_request(&who, "This person's address is malformed."));
    };
    let target = view::person(st, &who, &id).await?;
    let pairs = view::query_pairs(&who, req)?;
    let ask = timeline_ask(&who, &pairs)?;
    let _slot = read_slot(st, &who)?;
    // Only the filters set: the access log shows the record cut to one line.
    let mut filters = serde_json::to_value(&ask.filter).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut filters {
        m.retain(|_, v| v.as_str() != Some(""));
    }
    view::record_view(st, &who, Some(&target), "timeline", json!({"filters": filters})).await?;
    let now = now_micros();
    let mut q = EventQuery {
        descending: true,
        after: ask.cursor.map(|c| c.pk),
        after_ts: ask.cursor.and_then(|c| c.ts),
        limit: SCAN_PAGE,
        max_bytes: Some(SCAN_BYTES),
        ..ask.store_query(&target.id)
    };
    let needle = ask.filter.q.to_lowercase();
    let mut shown: Vec<StoredEvent> = Vec::new();
    let mut scanned = 0usize;
    // Where the next page starts: after the last row shown, or the last row scanned when the
    // scan budget ran out first.
    let mut older: Option<Cursor> = None;
    'scan: loop {
        let page = st.store.query_event_page(&q).await.map_err(store_page)?;
        let more = page.truncated || page.events.len() == q.limit as usize;
        let Some(last) = page.events.last().map(|e| Cursor::after(e, EventOrder::Ts)) else {
            break;
        };
        for e in page.events {
            scanned += 1;
            if payload_matches(&ask.filter, &e, &needle) {
                shown.push(e);
                if shown.len() == TIMELINE_ROWS {
                    older = shown.last().map(|e| Cursor::after(e, EventOrder::Ts));
                    break 'scan;
                }
            }
        }
        if !more {
            break;
        }
        if scanned >= TIMELINE_SCAN {
            older = Some(last);
            break;
        }
        q.after = Some(last.pk);
        q.after_ts = last.ts;
    }
    let pks: Vec<i64> = shown.iter().map(|e| e.pk).collect();
    let flag_counts: BTreeMap<i64, u64> =
        st.store.event_flag_counts(&pks).await.map_err(store_page)?.into_iter().collect();
    let spans = session_spans(st, &target.id, &shown).await?;
    // The review log: which rows a checkpoint that clients witnessed covers. A store that
    // keeps no log (a test wrapper) shows no marks rather than failing the page.
    let leaves: BTreeMap<i64, u64> = st
        .store
        .log_leaves(&pks)
        .await
        .map(|l| l.into_iter().map(|l| (l.event_pk, l.index)).collect())
        .unwrap_or_default();
    let witnessed = st.store.log_witnessed().await.ok().flatten();
    let (chart_start, hours) = chart_window(ask.from, ask.until, now);
    let counts = st.store.hour_counts(&target.id, chart_start, hours).await.map_err(store_page)?;
    let mut buckets: Vec<HourBucket> = (0..hours)
        .map(|i| HourBucket { start: chart_start + i64::from(i) * HOUR, ..Default::default() })
        .collect();
    let small = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
    for c in counts {
        if let Some(b) = usize::try_from(c.hour).ok().and_then(|i| buckets.get_mut(i)) {
            b.allowed = small(c.allowed);
            b.denied = small(c.denied);
            b.transcript = small(c.transcript);
            b.flags = small(c.flags);
        }
    }
    let events = shown
        .into_iter()
        .map(|e| {
            let flags = flag_counts.get(&e.pk).copied().unwrap_or(0);
            let session = match e.source {
                Source::Claude | Source::Codex => e.airlock_session.clone(),
                _ => e.session.clone(),
            };
            TimelineEvent {
                pk: e.pk,
                source: e.source,
                kind: e.kind,
                ts: e.ts,
                received_at: e.received_at,
                span: session.and_then(|s| spans.get(&s).copied()),
                session: e.session,
                airlock_session: e.airlock_session,
                payload: e.payload,
                flags: u32::try_from(flags).unwrap_or(u32::MAX),
                leaf: leaves.get(&e.pk).copied(),
                witnessed_by: match (leaves.get(&e.pk), witnessed) {
                    (Some(i), Some((size, by))) if *i < size => by,
                    _ => 0,
                },
            }
        })
        .collect();
    Ok(ok_page(render::timeline::render(&TimelinePage {
        viewer: view::viewer(&who),
        user_id: target.id.clone(),
        email: target.email.clone(),
        filter: ask.filter,
        events,
        older: older.map(|c| c.encode()),
        hours: buckets,
    })))
}

/// The chart's hours: the asked range when both ends are given and it spans at most a week
/// (hourly bars), otherwise the 24 hours up to `until` (or now).
fn chart_window(from: Option<Micros>, until: Option<Micros>, now: Micros) -> (Micros, u32) {
    if let (Some(f), Some(u)) = (from, until)
        && u > f
        && u - f <= 7 * DAY
    {
        let hours = (u - f + HOUR - 1) / HOUR;
        return (f, u32::try_from(hours).unwrap_or(24));
    }
    let end = until.unwrap_or(now);
    // Whole hours, the current one included.
    let end = end - end.rem_euclid(HOUR) + HOUR;
    (end - 24 * HOUR, 24)
}

/// The spans of the Airlock sessions of `events` (their start and end records' `ts`).
async fn session_spans<S: Store>(
    st: &AppState<S>,
    user_id: &str,
    events: &[StoredEvent],
) -> Result<BTreeMap<String, SessionSpan>, Resp> {
    let sessions: BTreeSet<&str> = events
        .iter()
        .filter_map(|e| match e.source {
            Source::Claude | Source::Codex => e.airlock_session.as_deref(),
            _ => e.session.as_deref(),
        })
        .take(SPAN_SESSIONS)
        .collect();
    let mut out = BTreeMap::new();
    for s in sessions {
        let q = EventQuery {
            user_id: Some(user_id.to_string()),
            source: Some(Source::Session),
            session: Some(s.to_string()),
            kinds: vec!["start".into(), "end".into()],
            limit: 10,
            ..EventQuery::default()
        };
        let page = st.store.query_event_page(&q).await.map_err(store_page)?;
        let originals = || page.events.iter().filter(|e| e.conflict_of.is_none());
        let start = originals().find(|e| e.kind == "start").map(|e| e.ts);
        let end = originals().find(|e| e.kind == "end").map(|e| e.ts);
        if let Some(start) = start {
            out.insert(s.to_string(), SessionSpan { start, end });
        }
    }
    Ok(out)
}

/// `GET /sessions/{session}?user=`: one Airlock session drilled down (`user`: whose; the
/// viewer's own when left out).
pub async fn session<S: Store>(
    st: &AppState<S>,
    req: &Request<Incoming>,
    raw: &str,
) -> Result<Resp, Resp> {
    let who = view::require(st, req).await?;
    let Some(session) = decode_segment(raw) else {
        return Err(view::bad_request(&who, "This session's address is malformed."));
    };
    let pairs = view::query_pairs(&who, req)?;
    let wanted = pairs.iter().find(|(k, _)| k == "user").map(|(_, v)| v.as_str()).unwrap_or("");
    let target =
        if wanted.is_empty() { who.user.clone() } else { view::person(st, &who, wanted).await? };
    let _slot = read_slot(st, &who)?;
    view::record_view(st, &who, Some(&target), "session", json!({"session": session})).await?;
    let q = EventQuery {
        user_id: Some(target.id.clone()),
        any_session: Some(session.clone()),
        order: EventOrder::Ts,
        limit: SESSION_ROWS,
        max_bytes: Some(32 * 1024 * 1024),
        ..EventQuery::default()
    };
    let page = st.store.query_event_page(&q).await.map_err(store_page)?;
    let items = st
        .store
        .session_transcript_items(&target.id, &session, transcript_files::MAX_FILES + 1)
        .await
        .map_err(store_page)?;
    if page.events.is_empty() && items.end_record.is_none() && items.published.is_empty() {
        return Err(view::error_page(
            &who,
            StatusCode::NOT_FOUND,
            "No such session",
            "Nothing has been published for this session.",
        ));
    }
    let report = transcript_files::compare(&target.id, &session, &items);
    let names: Vec<String> = report.transcripts.iter().map(|f| f.file.clone()).collect();
    let counts =
        st.store.transcript_line_counts(&target.id, &session, &names).await.map_err(store_page)?;
    let report = transcript_files::with_lines(report, &counts);
    let mut p = SessionPage {
        viewer: view::viewer(&who),
        session: session.clone(),
        user_id: target.id.clone(),
        email: target.email.clone(),
        start: None,
        end: items.end_record.clone(),
        transcript: Vec::new(),
        egress: Vec::new(),
        files: report
            .transcripts
            .into_iter()
            .map(|f| FileMark { file: f.file, state: f.state, lines: f.lines })
            .collect(),
        record_pks: Vec::new(),
        cut_at: (page.truncated || page.events.len() == q.limit as usize)
            .then_some(page.events.len()),
    };
    for e in page.events.into_iter().filter(|e| e.conflict_of.is_none()) {
        if e.source == Source::Session {
            p.record_pks.push(e.pk);
        }
        match e.source {
            Source::Session if e.kind == "start" && p.start.is_none() => p.start = Some(e.payload),
            Source::Session if e.kind == "end" && p.end.is_none() => p.end = Some(e.payload),
            Source::Claude | Source::Codex => p.transcript.push(TranscriptLine {
                pk: e.pk,
                source: e.source,
                ts: e.ts,
                file: e.file,
                offset: e.offset,
                payload: e.payload,
            }),
            Source::Egress => p.egress.push(EgressLine { pk: e.pk, ts: e.ts, payload: e.payload }),
            _ => {}
        }
    }
    Ok(ok_page(render::session::render(&p)))
}

/// `GET /access-log` (admins): every recorded read of someone else's history, API and
/// console, newest first.
pub async fn access_log<S: Store>(st: &AppState<S>, req: &Request<Incoming>) -> Result<Resp, Resp> {
    let who = view::require(st, req).await?;
    if who.user.role != Role::Admin {
        return Err(view::error_page(
            &who,
            StatusCode::FORBIDDEN,
            "Admins only",
            "The access log is shown to admins.",
        ));
    }
    let pairs = view::query_pairs(&who, req)?;
    let cursor = match pairs.iter().find(|(k, _)| k == "cursor").map(|(_, v)| v.as_str()) {
        None | Some("") => None,
        Some(c) => match Cursor::parse(c, EventOrder::Ts) {
            Some(c) => Some(c),
            None => {
                return Err(view::bad_request(
                    &who,
                    "The cursor in this address is not one the console wrote.",
                ));
            }
        },
    };
    let _slot = read_slot(st, &who)?;
    let q = EventQuery {
        source: Some(Source::External),
        kinds: vec![EVENT_READ.into(), "airlock.review.export".into()],
        order: EventOrder::Ts,
        descending: true,
        after: cursor.map(|c| c.pk),
        after_ts: cursor.and_then(|c| c.ts),
        limit: ACCESS_ROWS,
        max_bytes: Some(8 * 1024 * 1024),
        ..EventQuery::default()
    };
    let page = st.store.query_event_page(&q).await.map_err(store_page)?;
    let more = page.truncated || page.events.len() == q.limit as usize;
    let older = page.events.last().filter(|_| more).map(|e| Cursor::after(e, EventOrder::Ts));
    // API read records name the person read by id only: shown by email, like the console's.
    let users = st.store.list_users().await.map_err(store_page)?;
    let emails: BTreeMap<&str, &str> =
        users.iter().map(|u| (u.id.as_str(), u.email.as_str())).collect();
    let rows: Vec<AccessRow> = page
        .events
        .iter()
        .map(AccessRow::of)
        .map(|mut r| {
            if let Some(email) =
                r.target_id.as_deref().filter(|id| *id == r.target).and_then(|id| emails.get(id))
            {
                r.target = (*email).to_string();
            }
            if r.reader == r.reader_id
                && let Some(email) = emails.get(r.reader_id.as_str())
            {
                r.reader = (*email).to_string();
            }
            r
        })
        .collect();
    Ok(ok_page(render_access_log(&view::viewer(&who), &rows, older.map(|c| c.encode()))))
}

/// One read record as the access log shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessRow {
    pub at: Micros,
    pub reader_id: String,
    pub reader: String,
    pub what: String,
    pub via: String,
    pub target_id: Option<String>,
    pub target: String,
    pub detail: String,
}

impl AccessRow {
    fn of(e: &StoredEvent) -> Self {
        let p: Value = serde_json::from_str(&e.payload).unwrap_or(Value::Null);
        let s = |k: &str| p.get(k).and_then(Value::as_str).map(str::to_string);
        let what = if e.kind == "airlock.review.export" {
            "export".to_string()
        } else {
            s("what").unwrap_or_else(|| "events".into())
        };
        let mut detail = serde_json::Map::new();
        if let Some(obj) = p.as_object() {
            for (k, v) in obj {
                let shown = !matches!(
                    k.as_str(),
                    "reader" | "reader_email" | "what" | "via" | "target_user" | "target_email"
                );
                if shown && !v.is_null() {
                    detail.insert(k.clone(), v.clone());
                }
            }
        }
        let target_id = s("target_user");
        Self {
            at: e.ts,
            reader_id: e.user_id.clone(),
            reader: s("reader_email").unwrap_or_else(|| e.user_id.clone()),
            what,
            via: s("via").unwrap_or_else(|| "api".into()),
            target: s("target_email")
                .or_else(|| target_id.clone())
                .unwrap_or_else(|| "everyone".into()),
            target_id,
            detail: render::one_line(&Value::Object(detail).to_string(), 200),
        }
    }
}

/// The access-log page.
pub fn render_access_log(
    viewer: &render::Viewer,
    rows: &[AccessRow],
    older: Option<String>,
) -> maud::Markup {
    let body = html! {
        p.mut { "Every read of someone else's history or flags, through the API or this console, and every export. Newest first." }
        @if rows.is_empty() {
            p.mut { "No reads recorded yet." }
        } @else {
            table.access {
                thead { tr {
                    th scope="col" { "When" } th scope="col" { "Reader" } th scope="col" { "What" }
                    th scope="col" { "Via" } th scope="col" { "Whose" } th scope="col" { "Details" }
                } }
                tbody {
                    @for r in rows {
                        tr {
                            td { (render::when(r.at)) }
                            td { a href=(render::person_href(&r.reader_id)) { (r.reader) } }
                            td { (r.what) }
                            td { (r.via) }
                            td {
                                @match &r.target_id {
                                    Some(id) => a href=(render::person_href(id)) { (r.target) },
                                    None => span.mut { (r.target) },
                                }
                            }
                            td { code { (r.detail) } }
                        }
                    }
                }
            }
        }
        @if let Some(c) = older {
            p { a rel="next" href={ "/access-log" (render::query([("cursor", c.as_str())])) } { "Older reads →" } }
        }
    };
    render::page("Access log", viewer, Section::AccessLog, body)
}

/// `GET /export?user=&format=jsonl|csv&source=&type=&session=&from=&until=`: the console's
/// export buttons. The events of one person a store query selects (the timeline's decision,
/// host, repo and text filters read payloads and are not applied), streamed in constant
/// memory like `GET /api/v1/export`; every export is recorded first (`airlock.review.export`,
/// `via: "console"`), one's own included: it is a bulk copy of the evidence. JSONL starts
/// with the API's header line (the query and the export time); CSV is for spreadsheets.
pub async fn export<S: Store>(
    st: std::sync::Arc<AppState<S>>,
    req: Request<Incoming>,
) -> Result<Response<export::ExportBody>, Resp> {
    let who = view::require(&st, &req).await?;
    let pairs = view::query_pairs(&who, &req)?;
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.trim()).unwrap_or("");
    let format = match get("format") {
        "" | "jsonl" => export::Format::Jsonl,
        "csv" => export::Format::Csv,
        _ => return Err(view::bad_request(&who, "The export format is jsonl or csv.")),
    };
    let target = match get("user") {
        "" => who.user.clone(),
        u => view::person(&st, &who, u).await?,
    };
    let ask = timeline_ask(&who, &pairs)?;
    let slot = read_slot(&st, &who)?;
    let now = now_micros();
    let query = json!({
        "user": target.id, "source": ask.source, "type": ask.filter.kind,
        "session": ask.filter.session, "ts_since": ask.from.map(format_micros),
        "ts_until": ask.until.map(format_micros), "order": "ts",
    });
    let payload = json!({
        "reader": who.user.id, "reader_email": who.user.email, "what": "export",
        "via": "console", "target_user": target.id, "target_email": target.email,
        "format": if format == export::Format::Csv { "csv" } else { "jsonl" }, "query": query,
    });
    let ev = crate::review::server::reserved_event(
        "review-read",
        "airlock.review.export",
        &payload,
        now,
    );
    st.store.insert_events(&who.user.id, now, &[ev]).await.map_err(store_page)?;
    let q = ask.store_query(&target.id);
    // A JSONL export carries the review log's proofs like the API's, so `airlock verify`
    // checks it the same way (docs/evidence.md).
    let (log_header, log) = match format {
        export::Format::Jsonl => {
            crate::review::log::export_part(&st, &q).await.map_err(store_page)?
        }
        export::Format::Csv => (Value::Null, None),
    };
    let header = match format {
        export::Format::Csv => export::csv_header(),
        export::Format::Jsonl => {
            let mut h = serde_json::to_vec(&json!({"export": {
                "query": query, "exported_at": format_micros(now), "by": who.user.id,
                "format": 1, "via": "console", "log": log_header,
            }}))
            .unwrap_or_default();
            h.push(b'\n');
            h
        }
    };
    let body = export::start_as(
        std::sync::Arc::clone(&st),
        |s: &AppState<S>| &s.store,
        q,
        format,
        false,
        header,
        slot,
        log.map(|l| (l, (|s: &AppState<S>| &s.log) as export::HubOf<AppState<S>>)),
    );
    let (content_type, ext) = match format {
        export::Format::Csv => ("text/csv; charset=utf-8", "csv"),
        export::Format::Jsonl => ("application/x-ndjson", "jsonl"),
    };
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    // The file name is built from the export time only: nothing stored goes into a header.
    let name = format!("attachment; filename=\"airlock-export-{}.{ext}\"", now / 1_000_000);
    if let Ok(v) = HeaderValue::from_str(&name) {
        h.insert(header::CONTENT_DISPOSITION, v);
    }
    super::add_security_headers(&mut r);
    Ok(r)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn segments_decode_or_are_refused() {
        assert_eq!(decode_segment("u%2F..%2Fx").as_deref(), Some("u/../x"));
        assert_eq!(decode_segment("a%20b").as_deref(), Some("a b"));
        assert_eq!(decode_segment("%C3%A9").as_deref(), Some("é"));
        for bad in ["%", "%2", "%zz", "%00", "%FF", "a%G1"] {
            assert_eq!(decode_segment(bad), None, "{bad}");
        }
    }

    #[test]
    fn hosts_match_themselves_and_subdomains_only() {
        assert!(host_matches("api.github.com", "github.com"));
        assert!(host_matches("GitHub.com", "github.com."));
        assert!(!host_matches("evilgithub.com", "github.com"));
        assert!(!host_matches("github.com.evil", "github.com"));
    }

    #[test]
    fn chart_window_is_the_range_or_the_last_24_hours() {
        let now = 100 * DAY + 90 * 60 * 1_000_000;
        assert_eq!(chart_window(None, None, now), (100 * DAY + 2 * HOUR - 24 * HOUR, 24));
        assert_eq!(chart_window(Some(DAY), Some(DAY + 3 * HOUR), now), (DAY, 3));
        assert_eq!(chart_window(Some(DAY), Some(DAY + HOUR + 1), now), (DAY, 2));
        // A range over a week falls back to the day before `until`.
        assert_eq!(chart_window(Some(0), Some(10 * DAY), now), (9 * DAY + HOUR, 24));
    }

    fn ev(source: Source, payload: Value) -> StoredEvent {
        StoredEvent {
            pk: 1,
            user_id: "u".into(),
            source,
            id: "e1".into(),
            kind: "connect".into(),
            ts: 0,
            session: None,
            seq: None,
            boot: None,
            received_at: 0,
            payload: payload.to_string(),
            conflict_of: None,
            airlock_session: None,
            file: None,
            offset: None,
        }
    }

    #[test]
    fn payload_filters_read_the_parsed_line() {
        let allowed =
            ev(Source::Egress, json!({"host": "api.x.test", "allowed": true, "repo": "r"}));
        let denied = ev(Source::Egress, json!({"host": "paste.test", "allowed": false}));
        let chat = ev(Source::Claude, json!({"message": "Ünïcode \"quoted\""}));
        let f = |d: &str, h: &str, r: &str| TimelineFilter {
            decision: d.into(),
            host: h.into(),
            repo: r.into(),
            ..TimelineFilter::default()
        };
        assert!(payload_matches(&f("allowed", "", ""), &allowed, ""));
        assert!(!payload_matches(&f("allowed", "", ""), &denied, ""));
        assert!(payload_matches(&f("denied", "", ""), &denied, ""));
        assert!(!payload_matches(&f("denied", "", ""), &chat, ""), "not an egress line");
        assert!(payload_matches(&f("", "x.test", "r"), &allowed, ""));
        assert!(!payload_matches(&f("", "x.test", "other"), &allowed, ""));
        let none = TimelineFilter::default();
        assert!(payload_matches(&none, &chat, "ünïcode"));
        assert!(payload_matches(&none, &chat, "\"quoted\""), "matched through JSON escaping");
        assert!(!payload_matches(&none, &chat, "absent"));
    }

    #[test]
    fn access_rows_name_reader_target_and_details() {
        let mut e = ev(
            Source::External,
            json!({"reader": "u-r", "reader_email": "rev@x.test", "what": "timeline",
                   "via": "console", "target_user": "u-a", "target_email": "ana@x.test",
                   "filters": {"host": "<b>"}}),
        );
        e.kind = EVENT_READ.into();
        e.user_id = "u-r".into();
        let r = AccessRow::of(&e);
        assert_eq!(
            (r.reader.as_str(), r.what.as_str(), r.via.as_str()),
            ("rev@x.test", "timeline", "console")
        );
        assert_eq!((r.target.as_str(), r.target_id.as_deref()), ("ana@x.test", Some("u-a")));
        assert!(r.detail.contains("filters"));
        let html = render_access_log(
            &crate::review::render::testutil::viewer(Role::Admin),
            &[r],
            Some("t1_2".into()),
        )
        .into_string();
        crate::review::render::testutil::assert_inert(&html);
        assert!(html.contains("&lt;b&gt;"));
        assert!(html.contains(r#"href="/access-log?cursor=t1_2""#));
        let api = AccessRow::of(&ev(Source::External, json!({"what": "events"})));
        assert_eq!((api.via.as_str(), api.target.as_str()), ("api", "everyone"));
    }

    #[test]
    fn format_of_the_access_time_is_rfc3339() {
        assert_eq!(render::when(0), format_micros(0));
    }
}
