//! What every signed-in console page shares: the signed-in check that sends a stranger to
//! `/login` ([`require`]), the frame's [`Viewer`], the one read-scoping rule for a person named
//! in a URL ([`person`], the API's rule: a member gets 403 for anyone else, existing or not; a
//! reviewer 404 for an unknown id), and the record of a view of someone else's history
//! ([`record_view`]) that is written before anything is shown.

use super::{SignedIn, cookie_headers, html_resp, redirect, signed_in, store_page};
use crate::review::render::{self, Section, Viewer};
use crate::review::server::AppState;
use crate::review::store::Store;
use crate::review::{User, now_micros};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use maud::html;
use serde_json::Value;

type Resp = Response<Full<Bytes>>;

/// The event type of a console or API read of someone else's history (DESIGN §8).
pub const EVENT_READ: &str = "airlock.review.read";

/// The signed-in user of a page request, or the answer to give: 303 to `/login` without a
/// live session, the store's error page when it cannot tell.
pub async fn require<S: Store>(
    st: &AppState<S>,
    req: &Request<Incoming>,
) -> Result<SignedIn, Resp> {
    match signed_in(st, &cookie_headers(req)).await? {
        Some(who) => Ok(who),
        None => Err(redirect("/login")),
    }
}

/// The frame's view of the signed-in user.
pub fn viewer(who: &SignedIn) -> Viewer {
    Viewer {
        user_id: who.user.id.clone(),
        email: who.user.email.clone(),
        role: who.user.role,
        csrf: who.csrf.clone(),
    }
}

/// An error page inside the console's frame.
pub fn error_page(who: &SignedIn, status: StatusCode, title: &str, text: &str) -> Resp {
    let body = html! { p role="alert" { (text) } p { a href="/people" { "Back to people" } } };
    html_resp(status, render::page(title, &viewer(who), Section::Other, body))
}

/// A 400 page saying what was wrong with the address or form.
pub fn bad_request(who: &SignedIn, text: &str) -> Resp {
    error_page(who, StatusCode::BAD_REQUEST, "Bad request", text)
}

/// The 403 a member gets for another person's page: the same whether that person exists or
/// not, naming nobody.
pub fn forbidden(who: &SignedIn) -> Resp {
    error_page(
        who,
        StatusCode::FORBIDDEN,
        "Not yours to see",
        "Members see only their own history. Ask a reviewer if you need this page.",
    )
}

/// The person a page's URL names (an id or an email), under the read-scoping rule: a member
/// may name only themself (403 before any lookup, so the answer tells nothing about who
/// exists); a reviewer or admin anyone, 404 when nobody has that id.
pub async fn person<S: Store>(st: &AppState<S>, who: &SignedIn, raw: &str) -> Result<User, Resp> {
    if raw == who.user.id || raw.eq_ignore_ascii_case(&who.user.email) {
        return Ok(who.user.clone());
    }
    if !who.user.role.can_review() {
        return Err(forbidden(who));
    }
    let found = if raw.contains('@') {
        st.store.user_by_email(raw).await
    } else {
        st.store.user_by_id(raw).await
    };
    match found {
        Ok(Some(u)) => Ok(u),
        Ok(None) => Err(error_page(
            who,
            StatusCode::NOT_FOUND,
            "No such person",
            "Nobody in this review plane has that id.",
        )),
        Err(e) => Err(store_page(e)),
    }
}

/// Records that `who` viewed `what` of `target`'s history through the console, in the
/// reader's own history (`airlock.review.read`, `via: "console"`), unless it is their own.
/// `details` (an object) is merged in. Called before the page is built: if the record cannot
/// be written, nothing is shown.
pub async fn record_view<S: Store>(
    st: &AppState<S>,
    who: &SignedIn,
    target: Option<&User>,
    what: &str,
    details: Value,
) -> Result<(), Resp> {
    if target.is_some_and(|t| t.id == who.user.id) {
        return Ok(());
    }
    let mut payload = serde_json::json!({
        "reader": who.user.id,
        "reader_email": who.user.email,
        "what": what,
        "via": "console",
        "target_user": target.map(|t| t.id.clone()),
        "target_email": target.map(|t| t.email.clone()),
    });
    if let (Some(obj), Value::Object(extra)) = (payload.as_object_mut(), details) {
        for (k, v) in extra {
            obj.entry(k).or_insert(v);
        }
    }
    let now = now_micros();
    let ev = crate::review::server::reserved_event("review-read", EVENT_READ, &payload, now);
    st.store.insert_events(&who.user.id, now, &[ev]).await.map(|_| ()).map_err(store_page)
}

/// The decoded query string of a page request; a malformed one is a 400 page.
pub fn query_pairs(who: &SignedIn, req: &Request<Incoming>) -> Result<Vec<(String, String)>, Resp> {
    serde_urlencoded::from_str(req.uri().query().unwrap_or("")).map_err(|_| {
        error_page(
            who,
            StatusCode::BAD_REQUEST,
            "Bad address",
            "The query string of this address is not valid; open the page from the console's own links.",
        )
    })
}
