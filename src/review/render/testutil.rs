//! Test helpers for the renderers: sample viewers, the hostile strings every view is fed, and
//! a small tag scanner asserting a rendered page holds only the markup the renderers write
//! (maud escapes `<` in text and `"` in attributes, so every `<` left is a real tag).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::layout::{CSS_ROUTE, JS_ROUTE, Viewer};
use crate::review::Role;

pub fn viewer(role: Role) -> Viewer {
    Viewer {
        user_id: "u-viewer".into(),
        email: "rita@example.test".into(),
        role,
        csrf: "tok-123".into(),
    }
}

/// Strings an attacker would store: each must come out as inert text.
pub const XSS: &[&str] = &[
    "<script>alert(1)</script>",
    r#""><img src=x onerror=alert(1)>"#,
    "javascript:alert(1)",
    "</textarea><script>alert(2)</script>",
    "<svg onload=alert(3)><rect/></svg>",
    "<style>body{display:none}</style>",
    "'><a href='//evil.example'>x</a>",
    "https://evil.example/?q=<b>",
];

const TAGS: &[&str] = &[
    "html", "head", "meta", "title", "link", "script", "body", "header", "nav", "span", "a", "div",
    "form", "input", "button", "main", "h1", "h2", "h3", "p", "table", "thead", "tbody", "tr",
    "th", "td", "time", "abbr", "details", "summary", "pre", "code", "svg", "rect", "line", "g",
    "dl", "dt", "dd", "label", "select", "option", "textarea", "small", "strong", "ul", "li", "br",
    "section", "aside", "caption", "fieldset", "legend", "polygon", "circle",
];

/// One tag of a page: its name and attributes (values still HTML-escaped).
#[derive(Debug)]
pub struct Tag {
    pub name: String,
    pub closing: bool,
    pub attrs: Vec<(String, String)>,
}

pub fn tags(html: &str) -> Vec<Tag> {
    let b = html.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'<' {
            i += 1;
            continue;
        }
        i += 1;
        if i < b.len() && b[i] == b'!' {
            while i < b.len() && b[i] != b'>' {
                i += 1;
            }
            continue;
        }
        let closing = i < b.len() && b[i] == b'/';
        if closing {
            i += 1;
        }
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'-') {
            i += 1;
        }
        let name = html[start..i].to_ascii_lowercase();
        assert!(
            !name.is_empty(),
            "a bare `<` in the output at {start}: {}",
            &html[start.saturating_sub(60)..(start + 60).min(html.len())]
        );
        let mut attrs = Vec::new();
        loop {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            if i >= b.len() || b[i] == b'>' {
                i += 1;
                break;
            }
            let s = i;
            while i < b.len() && !b[i].is_ascii_whitespace() && b[i] != b'=' && b[i] != b'>' {
                i += 1;
            }
            let an = html[s..i].to_ascii_lowercase();
            let mut val = String::new();
            if i < b.len() && b[i] == b'=' {
                i += 1;
                assert_eq!(b[i], b'"', "unquoted attribute {an} in <{name}>");
                i += 1;
                let vs = i;
                while b[i] != b'"' {
                    i += 1;
                }
                val = html[vs..i].to_string();
                i += 1;
            }
            attrs.push((an, val));
        }
        out.push(Tag { name, closing, attrs });
    }
    out
}

/// Asserts the page holds only the renderers' own tags and attributes: no event handlers, no
/// inline styles, no script or stylesheet but the embedded ones, every link first-party
/// (`/…`, `?…` or `#…`, never `//host`, never a scheme).
pub fn assert_inert(html: &str) {
    let mut open_ta = 0;
    let mut close_ta = 0;
    for t in tags(html) {
        assert!(TAGS.contains(&t.name.as_str()), "unexpected tag <{}>", t.name);
        if t.name == "textarea" {
            if t.closing { close_ta += 1 } else { open_ta += 1 }
        }
        for (k, v) in &t.attrs {
            assert!(!k.starts_with("on"), "event handler {k} on <{}>", t.name);
            assert!(!matches!(k.as_str(), "style" | "srcdoc" | "formaction" | "xlink:href"), "{k}");
            if matches!(k.as_str(), "href" | "src" | "action") {
                let ok = (v.starts_with('/') && !v.starts_with("//"))
                    || v.starts_with('#')
                    || v.starts_with('?');
                assert!(ok, "a {k} that is not first-party: {v:?}");
                assert!(!v.to_ascii_lowercase().contains("javascript:"), "{v}");
                // Stored data in a link is percent-encoded: no scheme or authority survives.
                assert!(!v.contains("://") && !v.get(1..).unwrap_or("").contains("//"), "{v}");
            }
        }
        if t.name == "script" && !t.closing {
            assert_eq!(t.attrs.iter().find(|a| a.0 == "src").map(|a| a.1.as_str()), Some(JS_ROUTE));
        }
        if t.name == "link" {
            assert!(t.attrs.iter().any(|a| a.0 == "href" && a.1 == CSS_ROUTE));
        }
    }
    assert_eq!(open_ta, close_ta, "textareas balanced");
    assert_eq!(html.matches("<script").count(), html.matches("</script>").count());
}

/// [`assert_inert`], and no absolute or scheme-relative URL anywhere (for pages rendered from
/// data that holds none).
pub fn assert_no_urls(html: &str) {
    assert_inert(html);
    for bad in ["http://", "https://", "=\"//"] {
        if let Some(i) = html.find(bad) {
            panic!(
                "{bad} in the page: …{}…",
                &html[i.saturating_sub(80)..(i + 80).min(html.len())]
            );
        }
    }
}
