//! `/people`: everyone the viewer may see (a member: only themselves) with their activity
//! today and over 7 days, denied attempts, open flags by severity, last activity and a 7-day
//! sparkline.

use super::layout::{Section, Viewer, page};
use super::{Micros, age, person_href, svg, when};
use maud::{Markup, html};

/// Open flags of one person, by severity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OpenFlags {
    pub critical: u64,
    pub high: u64,
    pub medium: u64,
    pub low: u64,
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PersonRow {
    pub user_id: String,
    pub email: String,
    /// `admin`, `reviewer` or `member`.
    pub role: String,
    /// Events with `ts` since the start of the current UTC day, and over the last 7 days.
    pub events_today: u64,
    pub events_7d: u64,
    /// Denied egress attempts over the last 7 days.
    pub denied_7d: u64,
    pub open_flags: OpenFlags,
    /// The latest event's `received_at`, if any.
    pub last_activity: Option<Micros>,
    /// Events per day over the last 7 days, oldest first (today last).
    pub daily: [u64; 7],
}

/// The page's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeoplePage {
    pub viewer: Viewer,
    /// Server time, for "last activity" ages.
    pub now: Micros,
    pub people: Vec<PersonRow>,
}

pub fn render(p: &PeoplePage) -> Markup {
    let body = html! {
        @if p.people.is_empty() {
            p.mut { "Nobody to show yet: nothing has been published to this server." }
        } @else {
            table.people {
                thead { tr {
                    th scope="col" { "Person" }
                    th scope="col" { "Role" }
                    th.n scope="col" { "Today" }
                    th.n scope="col" { "7 days" }
                    th scope="col" { "Activity (7 d)" }
                    th.n scope="col" { "Denied (7 d)" }
                    th scope="col" { "Open flags" }
                    th scope="col" { "Last activity" }
                } }
                tbody {
                    @for r in &p.people {
                        tr {
                            td { a href=(person_href(&r.user_id)) { (r.email) } }
                            td.mut { (r.role) }
                            td.n { (r.events_today) }
                            td.n { (r.events_7d) }
                            td { (svg::sparkline(&r.daily)) }
                            td.n.no[r.denied_7d > 0] { (r.denied_7d) }
                            td { (open_flags(&r.open_flags)) }
                            td {
                                @match r.last_activity {
                                    Some(t) => time datetime=(when(t)) title=(when(t)) { (age(p.now, t)) " ago" },
                                    None => span.mut { "never" },
                                }
                            }
                        }
                    }
                }
            }
        }
    };
    page("People", &p.viewer, Section::People, body)
}

fn open_flags(f: &OpenFlags) -> Markup {
    let parts = [(f.critical, "critical"), (f.high, "high"), (f.medium, "medium"), (f.low, "low")];
    html! {
        @if parts.iter().all(|(n, _)| *n == 0) {
            span.mut { "none" }
        } @else {
            @for (n, sev) in parts {
                @if n > 0 {
                    span class=(format!("sev-{sev}")) { (n) " " (sev) } " "
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::review::Role;
    use crate::review::render::testutil::{XSS, assert_inert, assert_no_urls, viewer};

    fn row(id: &str, email: &str) -> PersonRow {
        PersonRow {
            user_id: id.into(),
            email: email.into(),
            role: "member".into(),
            events_today: 12,
            events_7d: 340,
            denied_7d: 3,
            open_flags: OpenFlags { critical: 0, high: 2, medium: 1, low: 0 },
            last_activity: Some(1_000_000_000),
            daily: [1, 2, 3, 4, 5, 6, 12],
        }
    }

    #[test]
    fn table_shows_counts_flags_and_sparkline() {
        let p = PeoplePage {
            viewer: viewer(Role::Reviewer),
            now: 1_000_000_000 + 7_200_000_000,
            people: vec![row("u-ana", "ana@example.test")],
        };
        let html = render(&p).into_string();
        assert!(html.contains(r#"<a href="/people/u-ana">ana@example.test</a>"#));
        assert!(html.contains(r#"<td class="n">12</td><td class="n">340</td>"#));
        assert!(html.contains(r#"<span class="sev-high">2 high</span>"#));
        assert!(html.contains(r#"<span class="sev-medium">1 medium</span>"#));
        assert!(!html.contains("sev-critical"));
        assert!(html.contains("2h ago"));
        assert!(html.contains("<svg class=\"spark\""));
        assert_no_urls(&html);
    }

    #[test]
    fn hostile_ids_and_emails_are_escaped_and_encoded() {
        let people = XSS.iter().map(|x| row(x, x)).collect();
        let p = PeoplePage { viewer: viewer(Role::Admin), now: 0, people };
        let html = render(&p).into_string();
        assert_inert(&html);
        assert!(html.contains("/people/javascript%3Aalert%281%29"));
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
        assert!(
            html.contains("/people/%27%3E%3Ca%20href%3D%27%2F%2Fevil.example%27%3Ex%3C%2Fa%3E")
        );
    }

    #[test]
    fn empty_store() {
        let p = PeoplePage { viewer: viewer(Role::Member), now: 0, people: vec![] };
        assert!(render(&p).into_string().contains("Nobody to show yet"));
    }
}
