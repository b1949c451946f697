//! The page frame every console page shares (doctype, title, navigation, the signed-in user
//! and the logout form) and the two first-party assets embedded in the binary: the stylesheet
//! and the small keyboard script. The CSP (`default-src 'self'`) forbids inline styles and
//! scripts, so neither is ever inlined; pages are complete without the script.

use crate::review::Role;
use maud::{DOCTYPE, Markup, html};

/// Where the stylesheet is served.
pub const CSS_ROUTE: &str = "/assets/console.css";
/// Where the keyboard script is served.
pub const JS_ROUTE: &str = "/assets/console.js";

/// The route serving [`CSS`] (`text/css`).
pub fn css_route() -> &'static str {
    CSS_ROUTE
}

/// The route serving [`JS`] (`text/javascript`).
pub fn js_route() -> &'static str {
    JS_ROUTE
}

/// The console's only stylesheet. No `@import`, no `url()`: nothing is fetched.
pub const CSS: &str = r#":root{--fg:#1b1f24;--mut:#5b6470;--bg:#fff;--line:#d8dde3;--al:#2f8f5b;--de:#c2372d;--tr:#3b6fc4;--fl:#d9822b}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,sans-serif;color:var(--fg);background:var(--bg)}
header{display:flex;gap:1.2em;align-items:center;padding:.5em 1em;border-bottom:1px solid var(--line);flex-wrap:wrap}
header .brand{font-weight:700}
header nav a{margin-right:1em}
header nav a[aria-current]{font-weight:700;text-decoration:none}
header .me{margin-left:auto;display:flex;gap:.6em;align-items:center}
main{padding:1em}
h1{font-size:1.3em;margin:.2em 0 .6em}
h2{font-size:1.1em;margin:1.2em 0 .4em}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.25em .5em;border-bottom:1px solid var(--line);vertical-align:top}
th{font-weight:600;color:var(--mut)}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
code,pre,time{font-family:ui-monospace,monospace;font-size:12.5px}
pre{white-space:pre-wrap;word-break:break-word;margin:.3em 0;background:#f5f7f9;padding:.4em;border-radius:3px}
.mut{color:var(--mut)}
.b{color:var(--de);font-weight:600}
.ok{color:var(--al)}
.w{color:var(--al);text-decoration:none}
.no{color:var(--de)}
.sev-critical{color:#fff;background:#8b1a12;padding:0 .3em}
.sev-high{color:var(--de);font-weight:700}
.sev-medium{color:var(--fl);font-weight:600}
.sev-low{color:var(--mut)}
form.filters{display:flex;flex-wrap:wrap;gap:.4em .8em;align-items:end;margin:.4em 0 1em}
form.filters label{display:flex;flex-direction:column;font-size:12px;color:var(--mut)}
svg .al{fill:var(--al)}
svg .de{fill:var(--de)}
svg .tr{fill:var(--tr)}
svg .fl{fill:var(--fl)}
svg .ax{stroke:var(--line)}
svg a:focus rect,svg a:hover rect{opacity:.7}
.spark{vertical-align:middle}
.chart{max-width:100%;height:auto}
.legend span{margin-right:1em}
.dd{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,1fr);gap:.3em 1em}
.dd>.c{grid-column:1}
.dd>.e{grid-column:2;font-size:12.5px;border-left:3px solid var(--line);padding-left:.4em}
.dd>.e.no{border-left-color:var(--de)}
.msg{border-left:3px solid var(--line);padding:.2em .6em}
.msg.user{border-left-color:var(--tr)}
.msg.assistant{border-left-color:var(--al)}
.msg.tool{border-left-color:var(--fl)}
.sub{margin:.4em 0 .4em 1.2em;border:1px dashed var(--line);padding:.3em .6em}
details>summary{cursor:pointer;color:var(--mut)}
dl.rec{display:grid;grid-template-columns:max-content 1fr;gap:.2em 1em}
dl.rec dt{color:var(--mut)}
dl.rec dd{margin:0}
table.access code{overflow-wrap:anywhere}
tr.cur{outline:2px solid var(--tr)}
tr.fd>td{background:#fafbfc}
.actions{display:flex;flex-wrap:wrap;gap:1em}
.actions form{display:flex;flex-direction:column;gap:.2em}
textarea{min-height:3em}
section.gate{border:1px solid var(--line);border-radius:3px;padding:.4em .8em;margin:.8em 0}
section.gate h3{font-size:1em;margin:.2em 0 .4em}
form.decide{display:flex;flex-direction:column;gap:.3em;max-width:42em}
form.decide label{display:flex;flex-direction:column}
.notice{border-left:3px solid var(--al);padding:.2em .6em}
code.digest{overflow-wrap:anywhere}
@media print{header nav,header .me form,.actions,form.filters,form.decide{display:none}}
"#;

/// The keyboard script for the flags queue: `j`/`k` move between rows (from inside a row's
/// opened details, on from that row), `Enter` opens the focused row's details. Without it
/// every link and form still works.
pub const JS: &str = r#"(function(){
"use strict";
var q=document.querySelector("table.queue");if(!q)return;
function links(){return Array.prototype.slice.call(q.querySelectorAll("a.open"));}
function mark(a){var r=q.querySelectorAll("tr.cur");for(var i=0;i<r.length;i++)r[i].classList.remove("cur");var t=a.closest("tr");if(t)t.classList.add("cur");}
function open(a){var id=a.getAttribute("href").slice(1);var d=document.getElementById(id);if(d){d.open=true;var s=d.querySelector("summary");if(s)s.focus();}}
function within(l){var a=document.activeElement;var r=a&&a.closest&&a.closest("tr.fd");r=r&&r.previousElementSibling;var o=r&&r.querySelector("a.open");return o?l.indexOf(o):-1;}
q.addEventListener("focusin",function(e){var a=e.target.closest&&e.target.closest("tr.fr");if(a){var l=a.querySelector("a.open");if(l)mark(l);}});
document.addEventListener("keydown",function(e){
if(e.altKey||e.ctrlKey||e.metaKey)return;
var t=e.target;if(t&&(t.isContentEditable||/^(INPUT|TEXTAREA|SELECT|BUTTON)$/.test(t.tagName)))return;
var l=links();if(!l.length)return;
var i=l.indexOf(document.activeElement);
if(e.key==="j"||e.key==="k"){e.preventDefault();var j=i<0?within(l):i;j=e.key==="j"?Math.min(j+1,l.length-1):Math.max(j-1,0);l[j].focus();mark(l[j]);}
else if(e.key==="Enter"&&i>=0){e.preventDefault();open(l[i]);}
});
})();
"#;

/// Which navigation entry the page belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    People,
    Flags,
    Gates,
    AccessLog,
    /// A page outside the navigation (a session drill-down is under People).
    Other,
}

/// The signed-in user, as the frame shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Viewer {
    pub user_id: String,
    pub email: String,
    pub role: Role,
    /// The session's CSRF token, placed in every state-changing form.
    pub csrf: String,
}

/// The hidden `csrf` field of a form.
pub fn csrf_field(viewer: &Viewer) -> Markup {
    html! { input type="hidden" name="csrf" value=(viewer.csrf); }
}

/// A whole page: `title` in `<title>` and the `<h1>`, `body` inside `<main>`.
pub fn page(title: &str, viewer: &Viewer, current: Section, body: Markup) -> Markup {
    let nav = |section: Section, href: &str, label: &str| {
        html! { a href=(href) aria-current=[(current == section).then_some("page")] { (label) } }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { (title) " · Airlock review" }
                link rel="stylesheet" href=(CSS_ROUTE);
                script src=(JS_ROUTE) defer {}
            }
            body {
                header {
                    span.brand { "Airlock review" }
                    nav aria-label="Console" {
                        (nav(Section::People, "/people", "People"))
                        (nav(Section::Flags, "/flags", "Flags"))
                        (nav(Section::Gates, "/gates", "Gates"))
                        @if viewer.role == Role::Admin {
                            (nav(Section::AccessLog, "/access-log", "Access log"))
                        }
                    }
                    div.me {
                        span { "signed in as " (viewer.email) " (" (viewer.role.as_str()) ")" }
                        form method="post" action="/logout" {
                            (csrf_field(viewer))
                            button type="submit" { "Log out" }
                        }
                    }
                }
                main {
                    h1 { (title) }
                    (body)
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::review::render::testutil::{assert_inert, viewer};

    #[test]
    fn frame_has_doctype_nav_logout_and_only_first_party_assets() {
        let v = viewer(Role::Reviewer);
        let html = page("People", &v, Section::People, html! { p { "x" } }).into_string();
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<title>People · Airlock review</title>"));
        assert!(html.contains(r#"<a href="/people" aria-current="page">People</a>"#));
        assert!(html.contains(r#"<a href="/flags">Flags</a>"#));
        assert!(html.contains(r#"<a href="/gates">Gates</a>"#));
        assert!(!html.contains("/access-log"), "only admins see the access log");
        assert!(html.contains(r#"<form method="post" action="/logout"><input type="hidden" name="csrf" value="tok-123">"#));
        assert!(html.contains(r#"<link rel="stylesheet" href="/assets/console.css">"#));
        assert!(html.contains(r#"<script src="/assets/console.js" defer></script>"#));
        assert_inert(&html);
        let admin = page("Flags", &viewer(Role::Admin), Section::Flags, html! {}).into_string();
        assert!(admin.contains(r#"<a href="/access-log">Access log</a>"#));
    }

    #[test]
    fn hostile_viewer_fields_are_escaped() {
        let mut v = viewer(Role::Admin);
        v.email = r#""><img src=x onerror=alert(1)>@x"#.into();
        v.csrf = r#"a"><script>alert(1)</script>"#.into();
        let html = page("<script>t</script>", &v, Section::Other, html! {}).into_string();
        assert_inert(&html);
        assert!(html.contains("&lt;script&gt;t&lt;/script&gt;"));
        assert!(html.contains("&quot;&gt;&lt;img src=x onerror=alert(1)&gt;@x"));
    }

    #[test]
    fn assets_fetch_nothing() {
        for s in [CSS, JS] {
            assert!(!s.contains("http:") && !s.contains("https:") && !s.contains("//"), "{s}");
            assert!(!s.contains("@import") && !s.contains("url("));
        }
        assert_eq!(css_route(), "/assets/console.css");
        assert_eq!(js_route(), "/assets/console.js");
    }
}
