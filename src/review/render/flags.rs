//! `/flags`: the review queue. Severity, rule, person, session and age per flag; its state
//! history with actors; per flag an action form (acknowledge / resolve / dismiss / reopen
//! with a required note) and an assignment form (an email), each carrying `csrf`; bulk-action
//! checkboxes bound to one bulk form (HTML `form=` attribute: forms cannot nest). The
//! self-action rule of docs/api.md is mirrored: nobody is offered actions on a flag raised on
//! their own history unless they are the sole reviewer/admin, or an admin ticking `override`.
//! The server enforces the rule; the page only avoids offering what would be refused.
//!
//! Keyboard: each row's `a.open` link is the row's focus target (Tab order is the table's);
//! the embedded script ([`super::layout::JS`]) adds `j`/`k` and `Enter`.

use super::layout::{Section, Viewer, csrf_field, page};
use super::{Micros, age, one_line, path_segment, person_href, query, session_href, when};
use crate::review::{FlagState, Role, Severity};
use maud::{Markup, html};

/// Where the bulk form posts (fields: `csrf`, `action`, `note`, `flag` once per flag).
pub const BULK_PATH: &str = "/flags/bulk";

/// Where one flag's forms post (fields: `csrf`, `action`, `note`, `override`, `assignee`).
pub fn action_href(flag_id: &str) -> String {
    format!("/flags/{}", path_segment(flag_id))
}

/// The actions a note goes with, as the API names them.
pub const ACTIONS: [&str; 4] = ["acknowledge", "resolve", "dismiss", "reopen"];

/// One appended state of a flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRow {
    /// `acknowledged`, `resolved`, `dismissed`, `open`, or `assigned`.
    pub state: String,
    /// Who (their email, or the user id when unknown).
    pub actor: String,
    pub at: Micros,
    pub note: Option<String>,
    /// An action on a flag raised on the actor's own history (allowed as sole
    /// reviewer/admin or by an admin's override).
    pub self_action: bool,
}

/// One flag of the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagRow {
    pub id: String,
    pub rule_id: String,
    pub title: String,
    pub severity: Severity,
    /// Whose history raised it.
    pub user_id: String,
    pub user_email: String,
    pub session: Option<String>,
    pub detail: String,
    pub created_at: Micros,
    pub state: FlagState,
    pub assignee: Option<String>,
    /// Oldest first.
    pub history: Vec<HistoryRow>,
}

/// The page's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlagsPage {
    pub viewer: Viewer,
    pub now: Micros,
    /// The viewer is the store's only reviewer/admin (their own flags are then actionable).
    pub sole_reviewer: bool,
    /// The `state` filter in force (`open`, …), empty for all.
    pub state_filter: String,
    pub flags: Vec<FlagRow>,
    /// The cursor for the next page, if any.
    pub older: Option<String>,
}

/// What the viewer may do with one flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum May {
    /// Nothing: a member, or a reviewer facing their own flag.
    Nothing,
    Act,
    /// Only with `override` (an admin, their own flag).
    Override,
}

fn may(p: &FlagsPage, f: &FlagRow) -> May {
    let v = &p.viewer;
    match (v.role.can_review(), f.user_id == v.user_id, p.sole_reviewer, v.role) {
        (false, _, _, _) => May::Nothing,
        (true, false, _, _) | (true, true, true, _) => May::Act,
        (true, true, false, Role::Admin) => May::Override,
        (true, true, false, _) => May::Nothing,
    }
}

pub fn render(p: &FlagsPage) -> Markup {
    let reviewer = p.viewer.role.can_review();
    let body = html! {
        nav aria-label="Flag state" {
            @for (label, v) in [("open", "open"), ("acknowledged", "acknowledged"), ("resolved", "resolved"), ("dismissed", "dismissed"), ("all", "")] {
                a href=(format!("/flags{}", query([("state", v)]))) aria-current=[(p.state_filter == v).then_some("page")] { (label) } " "
            }
        }
        @if p.flags.is_empty() {
            p.mut { "No flags here." }
        } @else {
            @if reviewer {
                form #bulk method="post" action=(BULK_PATH) {
                    (csrf_field(&p.viewer))
                    fieldset {
                        legend { "Selected flags" }
                        label { "Action " (action_select("bulk-action")) }
                        " "
                        label { "Note " textarea name="note" required maxlength="16384" {} }
                        " "
                        button type="submit" { "Apply to selected" }
                    }
                }
            }
            p.mut { "Keys: " (kbd_like("j")) " / " (kbd_like("k")) " move between flags, " (kbd_like("Enter")) " opens one." }
            table.queue {
                thead { tr {
                    @if reviewer { th scope="col" { span.mut { "Select" } } }
                    th scope="col" { "Severity" }
                    th scope="col" { "Rule" }
                    th scope="col" { "Person" }
                    th scope="col" { "Session" }
                    th scope="col" { "Age" }
                    th scope="col" { "State" }
                } }
                tbody {
                    @for (n, f) in p.flags.iter().enumerate() { (row(p, n, f)) }
                }
            }
        }
        @if let Some(c) = &p.older {
            p { a rel="next" href=(format!("/flags{}", query([("state", p.state_filter.as_str()), ("cursor", c.as_str())]))) { "More flags →" } }
        }
    };
    page("Flags", &p.viewer, Section::Flags, body)
}

fn kbd_like(k: &str) -> Markup {
    html! { code { (k) } }
}

fn action_select(id: &str) -> Markup {
    html! {
        select name="action" id=(id) {
            @for a in ACTIONS { option value=(a) { (a) } }
        }
    }
}

fn row(p: &FlagsPage, n: usize, f: &FlagRow) -> Markup {
    let reviewer = p.viewer.role.can_review();
    let m = may(p, f);
    let cols = if reviewer { 7 } else { 6 };
    let sev = f.severity.as_str();
    html! {
        tr.fr {
            @if reviewer {
                td { input type="checkbox" name="flag" value=(f.id) form="bulk" aria-label=(format!("select flag {}", n + 1)) disabled[m != May::Act]; }
            }
            td { span class=(format!("sev-{sev}")) { (sev) } }
            td { a.open href=(format!("#f{n}")) { code { (one_line(&f.rule_id, 80)) } } br; span.mut { (one_line(&f.title, 160)) } }
            td { a href=(person_href(&f.user_id)) { (f.user_email) } }
            td { @if let Some(s) = &f.session { a href=(session_href(s, &f.user_id)) { (one_line(s, 24)) } } }
            td { time datetime=(when(f.created_at)) title=(when(f.created_at)) { (age(p.now, f.created_at)) } }
            td {
                (f.state.as_str())
                @if let Some(a) = &f.assignee { br; span.mut { "assigned to " (a) } }
            }
        }
        tr.fd {
            td colspan=(cols) {
                details id=(format!("f{n}")) {
                    summary { "Details, history and actions" }
                    pre { (super::clip(&f.detail, 4096).0) }
                    (linked(f))
                    (history(&f.history))
                    (actions(p, f, m))
                }
            }
        }
    }
}

/// A correlate flag's linked events by side (egress / transcript / record, as its detail
/// names them), each a link to the event on its session's drill-down (`#e<pk>`).
fn linked(f: &FlagRow) -> Markup {
    let sides = if f.rule_id.starts_with("correlate.") {
        crate::review::correlate::sides(&f.detail)
    } else {
        Vec::new()
    };
    html! {
        @if !sides.is_empty() {
            table.linked {
                caption.mut { "Linked events, by side" }
                thead { tr { th scope="col" { "Side" } th scope="col" { "Events" } } }
                tbody { @for (side, pks) in &sides {
                    tr {
                        td { (side.as_str()) }
                        td { @for pk in pks { a href=(event_href(f, *pk)) { "event " (pk) } " " } }
                    }
                } }
            }
        }
    }
}

/// Where one linked event is shown: its session's drill-down (else the person's timeline),
/// at the event's anchor.
pub fn event_href(f: &FlagRow, pk: i64) -> String {
    match &f.session {
        Some(s) => format!("{}#e{pk}", session_href(s, &f.user_id)),
        None => format!("{}#e{pk}", person_href(&f.user_id)),
    }
}

fn history(h: &[HistoryRow]) -> Markup {
    html! {
        @if h.is_empty() {
            p.mut { "No state appended yet: open since it was raised." }
        } @else {
            table {
                caption.mut { "State history, oldest first" }
                thead { tr { th scope="col" { "When" } th scope="col" { "State" } th scope="col" { "By" } th scope="col" { "Note" } } }
                tbody { @for r in h {
                    tr {
                        td { time { (when(r.at)) } }
                        td { (r.state) }
                        td { (r.actor) @if r.self_action { " " span.b title="acted on a flag raised on their own history" { "(self)" } } }
                        td { @if let Some(n) = &r.note { (super::clip(n, 2048).0) } }
                    }
                } }
            }
        }
    }
}

fn actions(p: &FlagsPage, f: &FlagRow, m: May) -> Markup {
    let href = action_href(&f.id);
    html! {
        @match m {
            May::Nothing => {
                @if p.viewer.role.can_review() {
                    p.mut { "This flag was raised on your own history: ask another reviewer or an admin to act on it." }
                }
            },
            May::Act | May::Override => {
                @if m == May::Override {
                    p.b { "This flag was raised on your own history: acting on it needs the override, and is recorded as a self-action." }
                } @else if f.user_id == p.viewer.user_id {
                    p.b { "This flag was raised on your own history; as the only reviewer you may act, recorded as a self-action." }
                }
                div.actions {
                    form method="post" action=(href) {
                        (csrf_field(&p.viewer))
                        label { "Action " (action_select(&format!("a-{}", path_segment(&f.id)))) }
                        label { "Note (required)" textarea name="note" required maxlength="16384" {} }
                        @if m == May::Override {
                            label { input type="checkbox" name="override" value="true" required; " override: act on my own flag" }
                        }
                        button type="submit" { "Apply" }
                    }
                    form method="post" action=(href) {
                        (csrf_field(&p.viewer))
                        input type="hidden" name="action" value="assign";
                        label { "Assign to (email)" input type="email" name="assignee" required value=[f.assignee.as_deref()]; }
                        @if m == May::Override {
                            label { input type="checkbox" name="override" value="true" required; " override" }
                        }
                        button type="submit" { "Assign" }
                    }
                }
            },
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::review::render::testutil::{XSS, assert_inert, assert_no_urls, tags, viewer};

    fn flag(id: &str, user: &str) -> FlagRow {
        FlagRow {
            id: id.into(),
            rule_id: "egress.paste-site".into(),
            title: "Upload to a paste site".into(),
            severity: Severity::High,
            user_id: user.into(),
            user_email: format!("{user}@example.test"),
            session: Some("s-1".into()),
            detail: "CONNECT pastebin.com".into(),
            created_at: 0,
            state: FlagState::Acknowledged,
            assignee: Some("bo@example.test".into()),
            history: vec![HistoryRow {
                state: "acknowledged".into(),
                actor: "rita@example.test".into(),
                at: 60_000_000,
                note: Some("looking".into()),
                self_action: false,
            }],
        }
    }

    fn page_of(role: Role, flags: Vec<FlagRow>) -> FlagsPage {
        FlagsPage {
            viewer: viewer(role),
            now: 3_600_000_000,
            sole_reviewer: false,
            state_filter: "open".into(),
            flags,
            older: None,
        }
    }

    #[test]
    fn queue_rows_forms_and_history() {
        let html = render(&page_of(Role::Reviewer, vec![flag("f1", "u-ana"), flag("f2", "u-bo")]))
            .into_string();
        assert!(html.contains(r#"<table class="queue">"#));
        assert_eq!(html.matches(r##"<a class="open" href="#f"##).count(), 2);
        assert!(html.contains(r#"<details id="f0">"#));
        assert!(html.contains(r#"<span class="sev-high">high</span>"#));
        assert!(html.contains(r#"<a href="/people/u-ana">u-ana@example.test</a>"#));
        assert!(html.contains(r#"<a href="/sessions/s-1?user=u-ana">s-1</a>"#));
        assert!(html.contains(">1h</time>"));
        assert!(html.contains("assigned to bo@example.test"));
        assert!(html.contains("rita@example.test") && html.contains("looking"));
        assert!(html.contains(r#"<form method="post" action="/flags/f1">"#));
        assert!(html.contains(r#"<textarea name="note" required maxlength="16384"></textarea>"#));
        assert!(
            html.contains(
                r#"<input type="email" name="assignee" required value="bo@example.test">"#
            )
        );
        assert!(html.contains(r#"<input type="checkbox" name="flag" value="f1" form="bulk""#));
        assert!(html.contains(r#"<form id="bulk" method="post" action="/flags/bulk">"#));
        for a in ACTIONS {
            assert!(html.contains(&format!(r#"<option value="{a}">{a}</option>"#)));
        }
        // Every POST form carries the csrf field.
        let forms = html.matches(r#"method="post""#).count();
        assert_eq!(forms, 1 + 1 + 2 * 2, "logout, bulk, two per flag");
        assert_eq!(
            html.matches(r#"<input type="hidden" name="csrf" value="tok-123">"#).count(),
            forms
        );
        assert_no_urls(&html);
    }

    #[test]
    fn a_correlate_flag_links_each_side_to_its_events_in_the_session() {
        let mut f = flag("c1", "u-ana");
        f.rule_id = "correlate.retry-after-deny".into();
        f.detail = "denied CONNECT x.test:443 (not_allowed); then another tool \
                    [egress 12, 15; transcript 7, 9; record 20]"
            .into();
        let html = render(&page_of(Role::Reviewer, vec![f.clone()])).into_string();
        assert!(html.contains("Linked events, by side"), "{html}");
        for (side, pks) in [("egress", [12, 15]), ("transcript", [7, 9])] {
            let row = format!(
                r#"<tr><td>{side}</td><td><a href="/sessions/s-1?user=u-ana#e{a}">event {a}</a> <a href="/sessions/s-1?user=u-ana#e{b}">event {b}</a> </td></tr>"#,
                a = pks[0],
                b = pks[1]
            );
            assert!(html.contains(&row), "{side}: {html}");
        }
        assert!(
            html.contains(
                r#"<td>record</td><td><a href="/sessions/s-1?user=u-ana#e20">event 20</a>"#
            )
        );
        // Without a session: the person's timeline.
        f.session = None;
        assert_eq!(event_href(&f, 3), "/people/u-ana#e3");
        // Another rule's detail with brackets is not read as sides.
        let mut other = flag("o1", "u-ana");
        other.detail = "odd [egress 1]".into();
        let html = render(&page_of(Role::Reviewer, vec![other])).into_string();
        assert!(!html.contains("Linked events"));
    }

    #[test]
    fn tab_order_follows_the_table() {
        let html = render(&page_of(Role::Reviewer, vec![flag("f1", "u-ana"), flag("f2", "u-bo")]))
            .into_string();
        let t = tags(&html);
        // No tabindex reorders anything.
        assert!(t.iter().all(|t| t.attrs.iter().all(|(k, v)| k != "tabindex" || v == "-1")));
        let opens: Vec<usize> = t
            .iter()
            .enumerate()
            .filter(|(_, t)| t.attrs.iter().any(|a| a.0 == "class" && a.1 == "open"))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(opens.len(), 2);
        assert!(html.find("href=\"#f0\"").unwrap() < html.find("id=\"f0\"").unwrap());
        assert!(html.find("id=\"f0\"").unwrap() < html.find("href=\"#f1\"").unwrap());
    }

    #[test]
    fn self_action_rule_mirrored() {
        // A reviewer's own flag: no forms, no selectable checkbox.
        let html = render(&page_of(Role::Reviewer, vec![flag("own", "u-viewer")])).into_string();
        assert!(html.contains("ask another reviewer or an admin"));
        assert!(!html.contains("action=\"/flags/own\""));
        assert!(html.contains("disabled"));
        // An admin's own flag: forms with a required override.
        let html = render(&page_of(Role::Admin, vec![flag("own", "u-viewer")])).into_string();
        assert!(html.contains(r#"<input type="checkbox" name="override" value="true" required>"#));
        // The sole reviewer: forms, no override needed.
        let mut p = page_of(Role::Reviewer, vec![flag("own", "u-viewer")]);
        p.sole_reviewer = true;
        let html = render(&p).into_string();
        assert!(html.contains("action=\"/flags/own\"") && !html.contains("name=\"override\""));
        // Members: read-only.
        let html = render(&page_of(Role::Member, vec![flag("f", "u-viewer")])).into_string();
        assert!(!html.contains("id=\"bulk\"") && !html.contains("action=\"/flags/f\""));
        assert!(!html.contains("ask another reviewer"));
    }

    #[test]
    fn hostile_notes_emails_rules_and_ids_render_inert() {
        let flags = XSS
            .iter()
            .map(|x| FlagRow {
                id: (*x).into(),
                rule_id: (*x).into(),
                title: (*x).into(),
                user_id: (*x).into(),
                user_email: (*x).into(),
                session: Some((*x).into()),
                detail: (*x).into(),
                assignee: Some((*x).into()),
                history: vec![HistoryRow {
                    state: (*x).into(),
                    actor: (*x).into(),
                    at: 0,
                    note: Some((*x).into()),
                    self_action: true,
                }],
                ..flag("x", "y")
            })
            .collect();
        let mut p = page_of(Role::Admin, flags);
        p.state_filter = XSS[1].into();
        p.older = Some(XSS[0].into());
        let html = render(&p).into_string();
        assert_inert(&html);
        assert!(html.contains(r#"action="/flags/javascript%3Aalert%281%29""#));
        assert!(html.contains("&lt;/textarea&gt;&lt;script&gt;alert(2)&lt;/script&gt;"));
        assert!(html.contains(r#"value="&quot;&gt;&lt;img src=x onerror=alert(1)&gt;""#));
    }
}
