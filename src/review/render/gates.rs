//! `/gates`: action gates decided in the browser (docs/console.md "/gates"). The pending
//! queue, oldest first — per gate who asked, what (target, request text, the canonical action
//! the digest covers), severity, rule, session, time left, the requester's recent timeline and
//! the decision form — then the recently decided, expired and abandoned gates with who decided,
//! when, the note and the `self` / `step-up` marks.
//!
//! The decision form posts `csrf`, the `digest` shown (the decision is bound to it), a
//! required `note`, the password again for a `high` gate (step-up), `override` (an admin's
//! own gate only) and `action=approve|deny`. The self-approval rule
//! ([`crate::review::gates::may_decide`]) is mirrored so the page does not offer what would be
//! refused; the server enforces it.

use super::layout::{Section, Viewer, csrf_field, page};
use super::{Micros, age, clip, one_line, path_segment, person_href, query, session_href, when};
use crate::gate::Severity;
use crate::review::gates::{Gate, GateKind, GateState};
use crate::review::{Role, Source};
use maud::{Markup, html};

/// Where one gate's decision form posts.
pub fn action_href(gate_id: &str) -> String {
    format!("/gates/{}", path_segment(gate_id))
}

/// One event of a requester's recent timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecentEvent {
    pub ts: Micros,
    pub source: Source,
    /// The event `type`.
    pub kind: String,
    /// What it says, in one line (the routes fill it with the timeline's summary).
    pub summary: String,
    /// The Airlock session it belongs to, for the drill-down link.
    pub session: Option<String>,
}

/// A pending gate with its requester's recent events (newest first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingGate {
    pub gate: Gate,
    pub recent: Vec<RecentEvent>,
}

/// A line above the queue: what was just decided, or what was wrong with a form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// The gate as the store now holds it (so a crafted link cannot claim a decision).
    Decided(Box<Gate>),
    Problem(String),
}

/// The page's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatesPage {
    pub viewer: Viewer,
    pub now: Micros,
    /// The viewer is the store's only reviewer/admin (their own gates are then approvable).
    pub sole_reviewer: bool,
    pub notice: Option<Notice>,
    /// Oldest first.
    pub pending: Vec<PendingGate>,
    /// The cursor of the next pending page, when there are more.
    pub more_pending: Option<i64>,
    /// This page continues the queue from a cursor.
    pub paged: bool,
    /// Decided, expired and abandoned gates, newest first.
    pub decided: Vec<Gate>,
}

/// What the viewer is offered on one pending gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Offer {
    approve: bool,
    deny: bool,
    /// An admin's own gate: approving needs the override.
    override_box: bool,
}

/// [`crate::review::gates::may_decide`] seen from the page: another person's gate is a
/// reviewer's to approve or deny; one's own may always be denied, and approved only when the
/// gate allows self-approval, the viewer is the sole reviewer, or (an admin) with override.
fn offer(v: &Viewer, sole_reviewer: bool, g: &Gate) -> Offer {
    let reviewer = v.role.can_review();
    if g.gate.user_id != v.user_id {
        return Offer { approve: reviewer, deny: reviewer, override_box: false };
    }
    let plain = g.gate.self_approve || (reviewer && sole_reviewer);
    let admin = v.role == Role::Admin;
    Offer { approve: plain || admin, deny: true, override_box: admin && !plain }
}

/// When a gate ended: its decision's time, or its deadline (expired, row not yet written).
pub fn ended_at(g: &Gate) -> Micros {
    g.decision.as_ref().map_or(g.deadline, |d| d.at)
}

pub fn render(p: &GatesPage) -> Markup {
    let reviewer = p.viewer.role.can_review();
    let body = html! {
        @match &p.notice {
            Some(Notice::Decided(g)) => { (decided_notice(g, p.now)) },
            Some(Notice::Problem(text)) => { p role="alert" { (text) } },
            None => {},
        }
        p.mut {
            @if reviewer {
                "Action gates waiting for a decision, oldest first: each holds one exact action of someone's agent until a reviewer approves or denies it, or its deadline passes. "
            } @else {
                "Your own action gates. Another person's gates are decided by reviewers; you may deny your own. "
            }
            "A decision is bound to the digest shown and needs a note; a high-severity gate needs your password again."
        }
        h2 { "Pending (" (p.pending.len()) @if p.more_pending.is_some() { "+" } ")" }
        @if p.paged {
            p { a href="/gates" { "← The oldest pending gates" } }
        }
        @if p.pending.is_empty() {
            p.mut { "Nothing is waiting for a decision." }
        }
        @for pg in &p.pending { (pending(p, pg)) }
        @if let Some(n) = p.more_pending {
            p { a rel="next" href=(format!("/gates{}", query([("cursor", n.to_string().as_str())]))) { "More pending gates →" } }
        }
        h2 { "Recently decided" }
        @if p.decided.is_empty() {
            p.mut { "No gate has been decided, expired or withdrawn yet." }
        } @else {
            (decided_table(p))
        }
    };
    page("Gates", &p.viewer, Section::Gates, body)
}

fn decided_notice(g: &Gate, now: Micros) -> Markup {
    let state = g.state(now);
    let by = g.decision.as_ref().and_then(|d| d.actor_email.clone());
    html! {
        p.notice role="status" {
            "Gate " code { (g.gate.id) } " (" (one_line(&g.target(), 120)) ") is " strong { (state.as_str()) }
            @if let Some(by) = by { " by " (by) }
            "."
        }
    }
}

fn sev(s: Severity) -> Markup {
    html! { span class=(format!("sev-{}", s.as_str())) { (s.as_str()) } }
}

/// `45s left`, or that the deadline passed (the expiry is written within a second).
fn time_left(now: Micros, deadline: Micros) -> String {
    if deadline > now {
        format!("{} left", age(deadline, now))
    } else {
        "past its deadline".to_string()
    }
}

fn pending(p: &GatesPage, pg: &PendingGate) -> Markup {
    let g = &pg.gate;
    let x = &g.gate;
    let o = offer(&p.viewer, p.sole_reviewer, g);
    html! {
        section.gate id=(format!("g-{}", x.id)) aria-label=(format!("gate {}", x.id)) {
            h3 {
                (sev(x.severity)) " " (x.kind.as_str()) " · " code { (one_line(&g.target(), 200)) }
            }
            dl.rec {
                dt { "Asked by" } dd { a href=(person_href(&x.user_id)) { (g.user_email) } }
                dt { "Gate" } dd { code { (x.id) } }
                dt { "Kind" } dd { (x.kind.as_str()) }
                dt { "Target" } dd { code { (g.target()) } }
                dt { "Severity" } dd { (sev(x.severity)) }
                dt { "Digest" } dd { code.digest { (x.digest) } }
                @if let Some(r) = &x.rule { dt { "Rule" } dd { code { (r) } } }
                @if let Some(l) = &x.layer { dt { "Layer" } dd { (l) } }
                @if let Some(pol) = &x.policy { dt { "Policy" } dd { code { (pol) } } }
                @if let Some(s) = &x.session {
                    dt { "Session" } dd { a href=(session_href(s, &x.user_id)) { (one_line(s, 64)) } }
                }
                @if let Some(r) = &x.repo { dt { "Repo" } dd { (r) } }
                dt { "Requested" } dd { time datetime=(when(g.requested_at)) { (when(g.requested_at)) } " (" (age(p.now, g.requested_at)) " ago)" }
                dt { "Deadline" } dd { time datetime=(when(g.deadline)) { (when(g.deadline)) } " (" strong { (time_left(p.now, g.deadline)) } ")" }
                @if x.self_approve { dt { "Self-approval" } dd { "allowed for this gate (recorded as such)" } }
            }
            @if let Some(r) = &x.request {
                p.mut {
                    @match x.kind {
                        GateKind::Egress => "The request line:",
                        GateKind::Tool => "The tool call:",
                        GateKind::External => "The action asked for:",
                    }
                }
                pre.req { (r) }
            }
            details.canon {
                summary { "The exact action the digest covers (canonical text)" }
                pre { (x.action) }
            }
            @if let Some(c) = &x.context {
                details {
                    summary { "Context sent by the requester" }
                    pre { (clip(c, 4096).0) }
                }
            }
            (recent(pg))
            (form(p, g, o))
        }
    }
}

fn recent(pg: &PendingGate) -> Markup {
    let x = &pg.gate.gate;
    html! {
        @if pg.recent.is_empty() {
            p.mut { "No recent events of " (pg.gate.user_email) "." }
        } @else {
            table.recent {
                caption.mut { "Recent events of " (pg.gate.user_email) ", newest first" }
                thead { tr { th scope="col" { "Time (ts)" } th scope="col" { "Source, type" } th scope="col" { "What" } th scope="col" { "Session" } } }
                tbody {
                    @for e in &pg.recent {
                        tr {
                            td { time { (when(e.ts)) } }
                            td { (e.source.as_str()) " " (one_line(&e.kind, 64)) }
                            td { (e.summary) }
                            td { @if let Some(s) = &e.session { a href=(session_href(s, &x.user_id)) { (one_line(s, 12)) } } }
                        }
                    }
                }
            }
        }
        p { a href=(person_href(&x.user_id)) { "Full timeline of " (pg.gate.user_email) " →" } }
    }
}

fn form(p: &GatesPage, g: &Gate, o: Offer) -> Markup {
    let x = &g.gate;
    let own = x.user_id == p.viewer.user_id;
    let high = x.severity == Severity::High;
    html! {
        @if own {
            p.b {
                @if o.override_box {
                    "This gate holds your own agent's action: you may deny it; approving it needs the override and is recorded as a self-approval."
                } @else if o.approve {
                    "This gate holds your own agent's action; approving it is allowed here and is recorded as a self-approval."
                } @else {
                    "This gate holds your own agent's action: another reviewer or an admin approves it. You may deny it, or let it expire."
                }
            }
        }
        @if o.approve || o.deny {
            form.decide method="post" action=(action_href(&x.id)) {
                (csrf_field(&p.viewer))
                input type="hidden" name="digest" value=(x.digest);
                label { "Note (required: why, for whoever reads the record)"
                    textarea name="note" required maxlength="16384" {} }
                @if high {
                    label { "Your password, again (this gate is high severity)"
                        input type="password" name="password" required autocomplete="current-password"; }
                }
                @if o.override_box {
                    label { input type="checkbox" name="override" value="true"; " override: approve my own gate (admins only; recorded as a self-approval)" }
                }
                div.buttons {
                    @if o.approve { button type="submit" name="action" value="approve" { "Approve" } " " }
                    @if o.deny { button type="submit" name="action" value="deny" { "Deny" } }
                }
            }
        }
    }
}

fn decided_table(p: &GatesPage) -> Markup {
    html! {
        table.decided {
            thead { tr {
                th scope="col" { "Ended" } th scope="col" { "State" } th scope="col" { "Asked by" }
                th scope="col" { "Gate" } th scope="col" { "By" } th scope="col" { "Note" }
            } }
            tbody {
                @for g in &p.decided {
                    @let state = g.state(p.now);
                    tr {
                        td { time { (when(ended_at(g))) } }
                        td class=(state_class(state)) { (state.as_str()) }
                        td { a href=(person_href(&g.gate.user_id)) { (g.user_email) } }
                        td {
                            (sev(g.gate.severity)) " " (g.gate.kind.as_str()) " "
                            code { (one_line(&g.target(), 120)) }
                            br; span.mut { code { (g.gate.id) } " " code { (one_line(&g.gate.digest, 80)) } }
                        }
                        td {
                            @match &g.decision {
                                Some(d) => {
                                    @match &d.actor_email { Some(e) => (e), None => span.mut { "—" } }
                                    @if d.self_decided { " " span.b title="the requester decided their own gate" { "(self)" } }
                                    @if d.step_up { " " span title="the decider typed their password again" { "(step-up)" } }
                                },
                                None => span.mut { "nobody (deadline)" },
                            }
                        }
                        td { @if let Some(n) = g.decision.as_ref().and_then(|d| d.note.as_deref()) { (clip(n, 2048).0) } }
                    }
                }
            }
        }
    }
}

fn state_class(s: GateState) -> &'static str {
    match s {
        GateState::Approved => "ok",
        GateState::Denied => "no",
        _ => "mut",
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::review::gates::{Decision, NewGate};
    use crate::review::render::testutil::{XSS, assert_inert, assert_no_urls, viewer};

    const T0: Micros = 1_772_614_800_000_000; // 2026-03-04T09:00:00Z

    fn gate(id: &str, user: &str, severity: Severity) -> Gate {
        Gate {
            n: 1,
            gate: NewGate {
                id: id.into(),
                user_id: user.into(),
                kind: GateKind::External,
                session: Some("s-1".into()),
                repo: Some("payments".into()),
                method: None,
                host: None,
                port: None,
                request: Some("deploy v2".into()),
                action:
                    r#"{"action":"deploy v2","gate":"gt_1","kind":"external","requester":"u-ana"}"#
                        .into(),
                digest: "sha256:abc".into(),
                severity,
                rule: Some("deploy".into()),
                layer: None,
                policy: None,
                local_id: None,
                context: None,
                self_approve: false,
                timeout_ms: 60_000,
            },
            user_email: format!("{user}@example.test"),
            requested_at: T0,
            deadline: T0 + 90_000_000,
            decision: None,
        }
    }

    fn page_of(role: Role, pending: Vec<Gate>, decided: Vec<Gate>) -> GatesPage {
        GatesPage {
            viewer: viewer(role),
            now: T0 + 30_000_000,
            sole_reviewer: false,
            notice: None,
            pending: pending
                .into_iter()
                .map(|gate| PendingGate {
                    gate,
                    recent: vec![RecentEvent {
                        ts: T0 - 1_000_000,
                        source: Source::Egress,
                        kind: "denied".into(),
                        summary: "CONNECT pastebin.com:443".into(),
                        session: Some("s-1".into()),
                    }],
                })
                .collect(),
            more_pending: None,
            paged: false,
            decided,
        }
    }

    #[test]
    fn a_pending_gate_shows_what_is_asked_its_digest_timeline_and_form() {
        let html =
            render(&page_of(Role::Reviewer, vec![gate("gt_1", "u-ana", Severity::Medium)], vec![]))
                .into_string();
        assert!(html.contains(r#"<a href="/gates" aria-current="page">Gates</a>"#));
        assert!(html.contains(r#"<a href="/people/u-ana">u-ana@example.test</a>"#));
        assert!(html.contains(r#"<code class="digest">sha256:abc</code>"#));
        assert!(html.contains("<pre class=\"req\">deploy v2</pre>"));
        assert!(html.contains("&quot;requester&quot;:&quot;u-ana&quot;"), "canonical text");
        assert!(html.contains(r#"<a href="/sessions/s-1?user=u-ana">s-1</a>"#));
        assert!(html.contains("1m left"), "{html}");
        assert!(html.contains("CONNECT pastebin.com:443"));
        assert!(html.contains(r#"<form class="decide" method="post" action="/gates/gt_1">"#));
        assert!(html.contains(r#"<input type="hidden" name="digest" value="sha256:abc">"#));
        assert!(html.contains(r#"<textarea name="note" required maxlength="16384"></textarea>"#));
        assert!(html.contains(r#"<button type="submit" name="action" value="approve">"#));
        assert!(html.contains(r#"<button type="submit" name="action" value="deny">"#));
        assert!(!html.contains("name=\"password\""), "medium: no step-up");
        assert!(!html.contains("name=\"override\""));
        let forms = html.matches(r#"method="post""#).count();
        assert_eq!(forms, 2, "logout and the decision");
        assert_eq!(
            html.matches(r#"<input type="hidden" name="csrf" value="tok-123">"#).count(),
            forms
        );
        assert_no_urls(&html);
    }

    #[test]
    fn a_high_gate_asks_for_the_password_again() {
        let html =
            render(&page_of(Role::Admin, vec![gate("gt_h", "u-ana", Severity::High)], vec![]))
                .into_string();
        assert!(html.contains("Your password, again"));
        assert!(html.contains(
            r#"<input type="password" name="password" required autocomplete="current-password">"#
        ));
    }

    #[test]
    fn the_self_approval_rule_is_mirrored() {
        let own = |role: Role, sole: bool, self_approve: bool| {
            let mut g = gate("gt_o", "u-viewer", Severity::Medium);
            g.gate.self_approve = self_approve;
            let mut p = page_of(role, vec![g], vec![]);
            p.sole_reviewer = sole;
            render(&p).into_string()
        };
        let approve = r#"value="approve""#;
        let deny = r#"value="deny""#;
        // A reviewer's own gate, another reviewer present: deny only.
        let h = own(Role::Reviewer, false, false);
        assert!(!h.contains(approve) && h.contains(deny), "{h}");
        assert!(h.contains("another reviewer or an admin approves it"));
        // The sole reviewer, or a gate allowing self-approval: both, no override.
        for h in [own(Role::Reviewer, true, false), own(Role::Member, false, true)] {
            assert!(h.contains(approve) && h.contains(deny) && !h.contains("override"), "{h}");
        }
        // A member's own gate: deny only.
        let h = own(Role::Member, false, false);
        assert!(!h.contains(approve) && h.contains(deny));
        // An admin's own gate: both, with the override box.
        let h = own(Role::Admin, false, false);
        assert!(h.contains(approve) && h.contains(r#"name="override" value="true""#));
        // Someone else's gate for a member (never listed by the routes): no form at all.
        let h = render(&page_of(Role::Member, vec![gate("gt_x", "u-bo", Severity::Low)], vec![]))
            .into_string();
        assert!(!h.contains("action=\"/gates/gt_x\""));
    }

    #[test]
    fn decided_gates_show_who_when_note_and_marks() {
        let mut g = gate("gt_d", "u-ana", Severity::High);
        g.decision = Some(Decision {
            state: GateState::Approved,
            actor: Some("u-rev".into()),
            actor_email: Some("rev@example.test".into()),
            note: Some("ticket 4411".into()),
            self_decided: true,
            step_up: true,
            at: T0 + 10_000_000,
        });
        let mut e = gate("gt_e", "u-bo", Severity::Low);
        e.deadline = T0;
        let mut p = page_of(Role::Reviewer, vec![], vec![g.clone(), e]);
        p.notice = Some(Notice::Decided(Box::new(g)));
        let html = render(&p).into_string();
        assert!(html.contains("Nothing is waiting for a decision."));
        assert!(html.contains(r#"<td class="ok">approved</td>"#));
        assert!(html.contains("rev@example.test") && html.contains("ticket 4411"));
        assert!(html.contains("(self)") && html.contains("(step-up)"));
        assert!(html.contains(r#"<td class="mut">expired</td>"#));
        assert!(html.contains("nobody (deadline)"));
        assert!(html.contains(r#"<p class="notice" role="status">Gate <code>gt_d</code>"#));
        assert!(html.contains("<strong>approved</strong> by rev@example.test."));
        assert_no_urls(&html);
    }

    #[test]
    fn hostile_actions_notes_and_emails_render_inert() {
        let mk = |x: &str| {
            let mut g = gate(x, x, Severity::High);
            g.user_email = x.into();
            g.gate.request = Some(x.into());
            g.gate.action = x.into();
            g.gate.digest = x.into();
            g.gate.session = Some(x.into());
            g.gate.rule = Some(x.into());
            g.gate.layer = Some(x.into());
            g.gate.policy = Some(x.into());
            g.gate.context = Some(x.into());
            g
        };
        let pending: Vec<Gate> = XSS.iter().map(|x| mk(x)).collect();
        let decided: Vec<Gate> = XSS
            .iter()
            .map(|x| {
                let mut g = mk(x);
                g.decision = Some(Decision {
                    state: GateState::Denied,
                    actor: Some((*x).into()),
                    actor_email: Some((*x).into()),
                    note: Some((*x).into()),
                    self_decided: false,
                    step_up: false,
                    at: T0,
                });
                g
            })
            .collect();
        let mut p = page_of(Role::Admin, pending, decided);
        p.notice = Some(Notice::Problem(XSS[0].into()));
        p.more_pending = Some(7);
        let html = render(&p).into_string();
        assert_inert(&html);
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(html.contains(r#"action="/gates/javascript%3Aalert%281%29""#));
        assert!(html.contains(r#"value="&quot;&gt;&lt;img src=x onerror=alert(1)&gt;""#));
        assert!(html.contains(r#"href="/gates?cursor=7""#));
    }

    #[test]
    fn a_passed_deadline_says_so() {
        assert_eq!(time_left(10, 5), "past its deadline");
    }
}
