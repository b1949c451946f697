//! Action gates in the console (docs/console.md "/gates"): `GET /gates[?cursor=&decided=]`
//! — the pending queue (a member: their own gates only) with each requester's recent
//! timeline, then the recently decided gates — and one gate's decision form,
//! `POST /gates/{id}` (`csrf`, `digest`, `note`, `password` for a `high` gate, `override`,
//! `action=approve|deny`). A decision goes through [`gate_api::decide`], the API's own path:
//! the self-approval rule, the step-up, and the store's "still pending, same digest" append,
//! with the console session id as the credential PostgreSQL re-checks.
//!
//! A page that shows someone else's gates and timeline is a read of their history: it is
//! recorded (`airlock.review.read`, `what: "gates"`) before their events are read.

use super::view;
use super::{
    SignedIn, auth, field, forbidden_csrf, html_resp, read_form, redirect, signed_in, store_page,
};
use crate::review::gate_api::{self, DecideError, DecideInput};
use crate::review::gates::{self, GateQuery, GateState, Verdict};
use crate::review::render::gates::{GatesPage, Notice, PendingGate, RecentEvent};
use crate::review::render::timeline::{TimelineEvent, summary};
use crate::review::render::{self, Section, path_segment};
use crate::review::server::AppState;
use crate::review::store::{EventOrder, EventQuery, Store, StoreError};
use crate::review::{Source, User, format_micros, limits, now_micros};
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use maud::html;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use zeroize::Zeroizing;

type Resp = Response<Full<Bytes>>;

/// Pending gates on one page (the oldest; a cursor pages on).
pub const PENDING_ROWS: u32 = 50;
/// Decided, expired and abandoned gates shown below the queue.
pub const DECIDED_ROWS: u32 = 50;
/// Recent events shown per requester.
pub const RECENT_ROWS: u32 = 10;
/// Payload bytes read per requester's recent events.
const RECENT_BYTES: u64 = 512 * 1024;
/// Longest note accepted (the API's cap).
const NOTE_MAX: usize = 16 * 1024;

/// `GET /gates`: the queue.
pub async fn get_gates<S: Store>(st: &AppState<S>, req: &Request<Incoming>) -> Result<Resp, Resp> {
    let who = view::require(st, req).await?;
    let pairs = view::query_pairs(&who, req)?;
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str()).unwrap_or("");
    let cursor = match get("cursor") {
        "" => None,
        c => match c.parse::<i64>() {
            Ok(n) => Some(n),
            Err(_) => {
                return Err(view::bad_request(
                    &who,
                    "The cursor in this address is not one the console wrote.",
                ));
            }
        },
    };
    // The confirmation after a decision names the gate; what it says is read from the store,
    // so a crafted link cannot claim a decision nobody made.
    let notice = match get("decided") {
        id if gates::is_id(id) => decided_notice(st, &who, id).await?,
        _ => None,
    };
    let body = build(st, &who, cursor, notice).await?;
    Ok(html_resp(StatusCode::OK, body))
}

async fn decided_notice<S: Store>(
    st: &AppState<S>,
    who: &SignedIn,
    id: &str,
) -> Result<Option<Notice>, Resp> {
    let g = st.store.get_gate(id).await.map_err(store_page)?;
    Ok(g.filter(|g| gates::visible(&who.user, g) && g.decision.is_some())
        .map(|g| Notice::Decided(Box::new(g))))
}

/// Reads and renders the page (also the answer to a refused form, with its `notice`).
async fn build<S: Store>(
    st: &AppState<S>,
    who: &SignedIn,
    cursor: Option<i64>,
    notice: Option<Notice>,
) -> Result<maud::Markup, Resp> {
    let _slot = super::pages::read_slot(st, who)?;
    let reviewer = who.user.role.can_review();
    let scope = (!reviewer).then(|| who.user.id.clone());
    let mut pending = st
        .store
        .list_gates(&GateQuery {
            user_id: scope.clone(),
            state: Some(GateState::Pending),
            after: cursor,
            ascending: true,
            limit: PENDING_ROWS + 1,
            ..GateQuery::default()
        })
        .await
        .map_err(store_page)?;
    let more_pending = (pending.len() > PENDING_ROWS as usize)
        .then(|| {
            pending.truncate(PENDING_ROWS as usize);
            pending.last().map(|g| g.n)
        })
        .flatten();
    // The newest of each ended state, merged by when they ended.
    let mut decided = Vec::new();
    for state in [GateState::Approved, GateState::Denied, GateState::Expired, GateState::Abandoned]
    {
        let q = GateQuery {
            user_id: scope.clone(),
            state: Some(state),
            ascending: false,
            limit: DECIDED_ROWS,
            ..GateQuery::default()
        };
        decided.extend(st.store.list_gates(&q).await.map_err(store_page)?);
    }
    decided.sort_by_key(|g| std::cmp::Reverse((render::gates::ended_at(g), g.n)));
    decided.truncate(DECIDED_ROWS as usize);

    let users = if reviewer {
        st.store.list_users().await.map_err(store_page)?
    } else {
        vec![who.user.clone()]
    };
    let sole_reviewer = reviewer && users.iter().filter(|u| u.role.can_review()).count() <= 1;

    // Everyone else whose gates (and, when pending, recent timeline) the page shows: the
    // read is recorded before their events are asked for.
    let mut others: BTreeMap<&str, &str> = BTreeMap::new();
    for g in pending.iter().chain(&decided) {
        if g.gate.user_id != who.user.id {
            others.insert(&g.gate.user_id, &g.user_email);
        }
    }
    if !others.is_empty() {
        let by_id: HashMap<&str, &User> = users.iter().map(|u| (u.id.as_str(), u)).collect();
        let single = match others.keys().next() {
            Some(id) if others.len() == 1 => by_id.get(id).copied(),
            _ => None,
        };
        let ids: Vec<&str> = others.keys().copied().collect();
        let emails: Vec<&str> = others.values().copied().collect();
        let shown: Vec<&str> = pending.iter().map(|g| g.gate.id.as_str()).collect();
        let details = json!({"target_users": ids, "target_emails": emails, "pending": shown});
        view::record_view(st, who, single, "gates", details).await?;
    }

    let mut recent: HashMap<String, Vec<RecentEvent>> = HashMap::new();
    for g in &pending {
        let uid = &g.gate.user_id;
        if !recent.contains_key(uid) {
            let events = recent_events(st, uid).await.map_err(store_page)?;
            recent.insert(uid.clone(), events);
        }
    }
    let pending = pending
        .into_iter()
        .map(|gate| {
            let recent = recent.get(&gate.gate.user_id).cloned().unwrap_or_default();
            PendingGate { gate, recent }
        })
        .collect();
    Ok(render::gates::render(&GatesPage {
        viewer: view::viewer(who),
        now: now_micros(),
        sole_reviewer,
        notice,
        pending,
        more_pending,
        paged: cursor.is_some(),
        decided,
    }))
}

/// `user_id`'s last [`RECENT_ROWS`] events by `ts`, newest first, as compact rows.
async fn recent_events<S: Store>(
    st: &AppState<S>,
    user_id: &str,
) -> Result<Vec<RecentEvent>, StoreError> {
    let q = EventQuery {
        user_id: Some(user_id.to_string()),
        order: EventOrder::Ts,
        descending: true,
        limit: RECENT_ROWS,
        max_bytes: Some(RECENT_BYTES),
        ..EventQuery::default()
    };
    let page = st.store.query_event_page(&q).await?;
    Ok(page
        .events
        .into_iter()
        .map(|e| {
            let p: Value = serde_json::from_str(&e.payload).unwrap_or(Value::Null);
            let session = match e.source {
                Source::Claude | Source::Codex | Source::Gate => e.airlock_session.clone(),
                _ => e.session.clone(),
            };
            let t = TimelineEvent {
                pk: e.pk,
                source: e.source,
                kind: e.kind.clone(),
                ts: e.ts,
                received_at: e.received_at,
                session: e.session,
                airlock_session: e.airlock_session,
                payload: e.payload,
                flags: 0,
                span: None,
                leaf: None,
                witnessed_by: 0,
            };
            RecentEvent {
                ts: t.ts,
                source: t.source,
                summary: summary(&t, &p),
                kind: t.kind,
                session,
            }
        })
        .collect())
}

/// A refused decision, inside the frame, with the way back.
fn refused(who: &SignedIn, status: StatusCode, title: &str, text: &str) -> Resp {
    let body = html! { p role="alert" { (text) } p { a href="/gates" { "Back to the gates" } } };
    html_resp(status, render::page(title, &view::viewer(who), Section::Gates, body))
}

/// What each [`DecideError`] tells the person who sent the form.
fn decide_error(who: &SignedIn, id: &str, e: DecideError) -> Resp {
    let not_decided = "Not decided";
    match e {
        DecideError::NoGate => refused(
            who,
            StatusCode::NOT_FOUND,
            "No such gate",
            &format!("There is no gate {id} you may see; nothing was decided."),
        ),
        DecideError::NotPending(g) => {
            let state = g.state(now_micros());
            let by = match &g.decision {
                Some(d) => match &d.actor_email {
                    Some(e) => format!(" by {e} at {}", format_micros(d.at)),
                    None => format!(" at {}", format_micros(d.at)),
                },
                None => format!(" (its deadline was {})", format_micros(g.deadline)),
            };
            refused(
                who,
                StatusCode::CONFLICT,
                not_decided,
                &format!(
                    "Gate {id} is {}{by} already: it is no longer pending, so nothing was decided.",
                    state.as_str()
                ),
            )
        }
        DecideError::Digest(g) => refused(
            who,
            StatusCode::CONFLICT,
            not_decided,
            &format!(
                "Gate {id} holds action {}, not the one on the page you decided from: nothing was \
                 decided. Reload the gates and read what it holds before deciding.",
                g.gate.digest
            ),
        ),
        DecideError::Refused(r) => {
            refused(who, StatusCode::FORBIDDEN, not_decided, &format!("Refused: {r}."))
        }
        DecideError::StepUpRequired => refused(
            who,
            StatusCode::FORBIDDEN,
            not_decided,
            "This gate is high severity: a decision needs your password again. Type it in the \
             gate's \"your password, again\" field.",
        ),
        DecideError::StepUpFailed { has_password: true } => refused(
            who,
            StatusCode::FORBIDDEN,
            not_decided,
            "The password is wrong: nothing was decided. (Wrong passwords count against your \
             account's sign-in limit.)",
        ),
        DecideError::StepUpFailed { has_password: false } => refused(
            who,
            StatusCode::FORBIDDEN,
            not_decided,
            "You have no console password, so you cannot decide high-severity gates; ask an \
             admin for an invite (airlockd admin user invite).",
        ),
        DecideError::StepUpLimited(wait) => {
            let secs = limits::retry_after_secs(wait);
            let mut r = refused(
                who,
                StatusCode::TOO_MANY_REQUESTS,
                "Too many attempts",
                &format!(
                    "Too many wrong passwords for this account; wait {secs} seconds and try again."
                ),
            );
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
            r
        }
        DecideError::Store(StoreError::Forbidden(m)) => {
            refused(who, StatusCode::FORBIDDEN, not_decided, &format!("The store refused: {m}."))
        }
        DecideError::Store(e) => store_page(e),
    }
}

/// `POST /gates/{id}`: one gate's decision form.
pub async fn post_gate<S: Store>(
    st: &AppState<S>,
    req: Request<Incoming>,
    id: &str,
) -> Result<Resp, Resp> {
    let (cookies, fields) = read_form(st, req).await?;
    let Some(csrf) = field(&fields, "csrf") else { return Err(forbidden_csrf()) };
    let who = match signed_in(st, &cookies).await? {
        Some(w) => w,
        None => return Err(redirect("/login")),
    };
    if !auth::ct_eq(csrf, &who.csrf) {
        return Err(forbidden_csrf());
    }
    let bad = |text: &str| refused(&who, StatusCode::BAD_REQUEST, "Not decided", text);
    let verdict = match field(&fields, "action") {
        Some("approve") => Verdict::Approve,
        Some("deny") => Verdict::Deny,
        _ => return Err(bad("Pick Approve or Deny.")),
    };
    // The decision is bound to the action the page showed: no digest, no decision.
    let digest = match field(&fields, "digest").map(str::trim) {
        Some(d) if !d.is_empty() && d.len() <= 128 && !d.contains('\0') => d.to_string(),
        _ => {
            return Err(bad(
                "The form carries no digest of the action, so nothing was decided; reload the \
                 gates and decide from the page.",
            ));
        }
    };
    let note = match field(&fields, "note").map(str::trim) {
        Some(n) if n.len() > NOTE_MAX || n.contains('\0') => {
            return Err(bad("The note is longer than 16 KiB or holds a NUL character."));
        }
        Some(n) if !n.is_empty() => n.to_string(),
        _ => {
            // Re-shown with the queue, so the reviewer sees the gate again and can go on.
            let text = "Not decided: a note is required. Say why you approve or deny, for \
                        whoever reads the record.";
            let page = build(st, &who, None, Some(Notice::Problem(text.into()))).await?;
            return Err(html_resp(StatusCode::BAD_REQUEST, page));
        }
    };
    let password =
        field(&fields, "password").filter(|p| !p.is_empty()).map(|p| Zeroizing::new(p.to_string()));
    let input = DecideInput {
        verdict,
        note: Some(note),
        digest: Some(digest),
        password,
        override_requested: field(&fields, "override") == Some("true"),
        // PostgreSQL re-checks the actor from this secret inside `airlock_gate_decide`: the
        // console session's id, as a token would be for the API.
        secret: &who.session,
    };
    match gate_api::decide(st, &who.user, id, input).await {
        Ok(g) => Ok(redirect(&format!("/gates?decided={}", path_segment(&g.gate.id)))),
        Err(e) => Err(decide_error(&who, id, e)),
    }
}
