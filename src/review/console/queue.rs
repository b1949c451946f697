//! The flags queue: `GET /flags[?state=&cursor=]`, one flag's forms `POST /flags/{id}`
//! (`action` = acknowledge / resolve / dismiss / reopen with a required `note`, or `assign`
//! with `assignee`, an email; empty unassigns) and `POST /flags/bulk` (one state action and
//! note for every `flag` field). Every POST carries the session's `csrf`. Who may act is
//! [`crate::review::flag_rules::decide`], the same decision as the API's
//! (`POST /api/v1/flags/{id}`); the store appends the rows the API would.

use super::store_page;
use super::view;
use super::{SignedIn, auth, field, forbidden_csrf, html_resp, read_form, redirect, signed_in};
use crate::review::render::flags::{FlagRow, FlagsPage, HistoryRow};
use crate::review::render::{self, Section};
use crate::review::server::{AppState, FlagActError, allowed_flag_action, assignable};
use crate::review::store::{FlagAction, FlagAssignment, FlagQuery, Store};
use crate::review::{Flag, FlagState, User, now_micros};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use maud::html;
use serde_json::json;
use std::collections::HashMap;

type Resp = Response<Full<Bytes>>;

/// Flags on one queue page.
pub const QUEUE_ROWS: u32 = 100;
/// Flags one bulk form may name.
pub const BULK_MAX: usize = 500;
/// Longest note accepted (the API's cap).
const NOTE_MAX: usize = 16 * 1024;

/// `GET /flags`: the review queue (a member: their own flags, read only).
pub async fn get_flags<S: Store>(st: &AppState<S>, req: &Request<Incoming>) -> Result<Resp, Resp> {
    let who = view::require(st, req).await?;
    let pairs = view::query_pairs(&who, req)?;
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str()).unwrap_or("");
    let state_filter = get("state").to_string();
    let state = match state_filter.as_str() {
        "" => None,
        s => match s.parse::<FlagState>() {
            Ok(s) => Some(s),
            Err(_) => {
                return Err(view::bad_request(
                    &who,
                    "Unknown state; use the links above the queue.",
                ));
            }
        },
    };
    let after = match get("cursor") {
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
    let reviewer = who.user.role.can_review();
    let q = FlagQuery {
        user_id: (!reviewer).then(|| who.user.id.clone()),
        state,
        after,
        limit: QUEUE_ROWS,
        ..FlagQuery::default()
    };
    if reviewer {
        view::record_view(st, &who, None, "flags", json!({"state": state_filter})).await?;
    }
    // A read like the API's `GET /api/v1/flags`: it takes one of the reader's read slots.
    let _slot = super::pages::read_slot(st, &who)?;
    let flags = st.store.list_flags(&q).await.map_err(store_page)?;
    let users = st.store.list_users().await.map_err(store_page)?;
    let emails: HashMap<&str, &str> =
        users.iter().map(|u| (u.id.as_str(), u.email.as_str())).collect();
    let email = |id: &str| emails.get(id).map_or_else(|| id.to_string(), |e| e.to_string());
    let sole_reviewer = reviewer && users.iter().filter(|u| u.role.can_review()).count() <= 1;
    let older =
        flags.last().filter(|_| flags.len() == q.limit as usize).map(|(n, _)| n.to_string());
    let rows = flags.into_iter().map(|(_, f)| flag_row(f, &email)).collect();
    let page = FlagsPage {
        viewer: view::viewer(&who),
        now: now_micros(),
        sole_reviewer,
        state_filter,
        flags: rows,
        older,
    };
    Ok(html_resp(StatusCode::OK, render::flags::render(&page)))
}

fn flag_row(f: Flag, email: &dyn Fn(&str) -> String) -> FlagRow {
    let history = f
        .history
        .iter()
        .map(|h| HistoryRow {
            state: if h.assignment {
                match &h.assignee_email {
                    Some(a) => format!("assigned to {a}"),
                    None => "unassigned".to_string(),
                }
            } else {
                h.state.as_str().to_string()
            },
            actor: email(&h.actor),
            at: h.at,
            note: h.note.clone(),
            self_action: h.self_action,
        })
        .collect();
    FlagRow {
        user_email: email(&f.user_id),
        id: f.id,
        rule_id: f.rule_id,
        title: f.title,
        severity: f.severity,
        user_id: f.user_id,
        session: f.session,
        detail: f.detail,
        created_at: f.created_at,
        state: f.state,
        assignee: f.assignee_email,
        history,
    }
}

/// A form's action, checked.
enum Act {
    State(FlagState),
    /// `None`: unassign.
    Assign(Option<String>),
}

fn state_action(action: &str) -> Option<FlagState> {
    match action {
        "acknowledge" => Some(FlagState::Acknowledged),
        "resolve" => Some(FlagState::Resolved),
        "dismiss" => Some(FlagState::Dismissed),
        "reopen" => Some(FlagState::Open),
        _ => None,
    }
}

/// The page telling what was wrong with a flag form, inside the frame.
fn refused(who: &SignedIn, status: StatusCode, text: &str) -> Resp {
    let body = html! { p role="alert" { (text) } p { a href="/flags" { "Back to the queue" } } };
    html_resp(status, render::page("Not done", &view::viewer(who), Section::Flags, body))
}

fn act_error(who: &SignedIn, id: &str, e: FlagActError) -> Resp {
    match e {
        FlagActError::NoFlag => {
            refused(who, StatusCode::NOT_FOUND, &format!("There is no flag {id}."))
        }
        FlagActError::Refused(r) => refused(who, StatusCode::FORBIDDEN, &r.to_string()),
        FlagActError::NotAssignable(m) => refused(who, StatusCode::BAD_REQUEST, &m),
        FlagActError::Store(e) => store_page(e),
    }
}

/// The note of a form: required with a state action, at most 16 KiB, no NUL.
fn note_of(fields: &[(String, String)], required: bool) -> Result<Option<&str>, &'static str> {
    match field(fields, "note").map(str::trim) {
        Some(n) if n.len() > NOTE_MAX || n.contains('\0') => {
            Err("The note is longer than 16 KiB or holds a NUL character.")
        }
        Some(n) if !n.is_empty() => Ok(Some(n)),
        _ if required => Err("A note is required: say why, for whoever reads the history."),
        _ => Ok(None),
    }
}

/// The signed-in reviewer of a flag POST with a matching `csrf`, or the answer.
async fn poster<S: Store>(
    st: &AppState<S>,
    cookies: &[String],
    fields: &[(String, String)],
) -> Result<SignedIn, Resp> {
    let Some(csrf) = field(fields, "csrf") else { return Err(forbidden_csrf()) };
    let who = match signed_in(st, cookies).await? {
        Some(w) => w,
        None => return Err(redirect("/login")),
    };
    if !auth::ct_eq(csrf, &who.csrf) {
        return Err(forbidden_csrf());
    }
    if !who.user.role.can_review() {
        return Err(refused(
            &who,
            StatusCode::FORBIDDEN,
            "Only reviewers and admins act on flags.",
        ));
    }
    Ok(who)
}

/// Takes one action on flag `id` as `who`; `Ok(())` when the row was appended.
async fn apply<S: Store>(
    st: &AppState<S>,
    who: &SignedIn,
    id: &str,
    act: &Act,
    note: Option<&str>,
    override_requested: bool,
) -> Result<(), FlagActError> {
    let self_action = allowed_flag_action(st, &who.user, id, override_requested).await?;
    // PostgreSQL re-checks the actor inside its flag functions from this secret: the
    // console session's id, as a token would be for the API.
    let secret: &str = &who.session;
    let appended = match act {
        Act::State(state) => {
            let a = FlagAction {
                flag_id: id,
                state: *state,
                note,
                actor: &who.user.id,
                self_action,
                secret,
                at: now_micros(),
            };
            st.store.append_flag_state(&a).await
        }
        Act::Assign(email) => {
            let assignee: Option<User> = match email {
                Some(e) => Some(assignable(st, e).await?),
                None => None,
            };
            let a = FlagAssignment {
                flag_id: id,
                assignee: assignee.as_ref().map(|u| u.id.as_str()),
                note,
                actor: &who.user.id,
                self_action,
                secret,
                at: now_micros(),
            };
            st.store.assign_flag(&a).await
        }
    };
    match appended {
        Ok(true) => Ok(()),
        Ok(false) => Err(FlagActError::NoFlag),
        Err(e) => Err(FlagActError::Store(e)),
    }
}

/// `POST /flags/{id}`: one flag's action or assignment form.
pub async fn post_flag<S: Store>(
    st: &AppState<S>,
    req: Request<Incoming>,
    id: &str,
) -> Result<Resp, Resp> {
    let (cookies, fields) = read_form(st, req).await?;
    let who = poster(st, &cookies, &fields).await?;
    let action = field(&fields, "action").unwrap_or("");
    let act = match (state_action(action), action) {
        (Some(s), _) => Act::State(s),
        (None, "assign") => match field(&fields, "assignee").map(str::trim) {
            None | Some("") => Act::Assign(None),
            Some(e) if e.len() > 1024 || e.contains('\0') => {
                return Err(refused(
                    &who,
                    StatusCode::BAD_REQUEST,
                    "That assignee is not an email.",
                ));
            }
            Some(e) => Act::Assign(Some(e.to_string())),
        },
        _ => {
            return Err(refused(
                &who,
                StatusCode::BAD_REQUEST,
                "Pick an action: acknowledge, resolve, dismiss, reopen, or assign.",
            ));
        }
    };
    let note = match note_of(&fields, matches!(act, Act::State(_))) {
        Ok(n) => n,
        Err(m) => return Err(refused(&who, StatusCode::BAD_REQUEST, m)),
    };
    let override_requested = field(&fields, "override") == Some("true");
    match apply(st, &who, id, &act, note, override_requested).await {
        Ok(()) => Ok(redirect("/flags")),
        Err(e) => Err(act_error(&who, id, e)),
    }
}

/// `POST /flags/bulk`: one state action with its note on every selected flag. Each flag is
/// decided on its own (a refused one does not stop the others); the answer lists what was
/// done and what was refused, and why.
pub async fn post_bulk<S: Store>(st: &AppState<S>, req: Request<Incoming>) -> Result<Resp, Resp> {
    let (cookies, fields) = read_form(st, req).await?;
    let who = poster(st, &cookies, &fields).await?;
    let Some(state) = state_action(field(&fields, "action").unwrap_or("")) else {
        return Err(refused(
            &who,
            StatusCode::BAD_REQUEST,
            "Pick a bulk action: acknowledge, resolve, dismiss or reopen.",
        ));
    };
    let note = match note_of(&fields, true) {
        Ok(n) => n,
        Err(m) => return Err(refused(&who, StatusCode::BAD_REQUEST, m)),
    };
    // Each flag once, in the form's order (a flag named twice is not acted on twice).
    let mut seen = std::collections::HashSet::new();
    let ids: Vec<&str> = fields
        .iter()
        .filter(|(k, _)| k == "flag")
        .map(|(_, v)| v.as_str())
        .filter(|v| seen.insert(*v))
        .collect();
    if ids.is_empty() {
        return Err(refused(&who, StatusCode::BAD_REQUEST, "Select at least one flag."));
    }
    if ids.len() > BULK_MAX {
        return Err(refused(
            &who,
            StatusCode::BAD_REQUEST,
            &format!("At most {BULK_MAX} flags at once; select fewer."),
        ));
    }
    let act = Act::State(state);
    let mut done = Vec::new();
    let mut not_done = Vec::new();
    for id in ids {
        match apply(st, &who, id, &act, note, false).await {
            Ok(()) => done.push(id),
            Err(FlagActError::Store(e)) => return Err(store_page(e)),
            Err(FlagActError::NoFlag) => not_done.push((id, "no such flag".to_string())),
            Err(FlagActError::Refused(r)) => not_done.push((id, r.to_string())),
            Err(FlagActError::NotAssignable(m)) => not_done.push((id, m)),
        }
    }
    if not_done.is_empty() {
        return Ok(redirect("/flags"));
    }
    let body = html! {
        p { (done.len()) " flag(s) set to " (state.as_str()) "." }
        p role="alert" { (not_done.len()) " flag(s) not changed:" }
        ul { @for (id, why) in &not_done { li { code { (id) } ": " (why) } } }
        p { a href="/flags" { "Back to the queue" } }
    };
    Ok(html_resp(
        StatusCode::OK,
        render::page("Bulk action", &view::viewer(&who), Section::Flags, body),
    ))
}
