//! What a person reviews before trusting a repo's `.airlock.toml`: a line-based unified diff
//! against the content trusted last (kept by [`super::trust::trust_content`]), and call-outs for
//! the settings that widen what an agent can reach — `mode = "blocklist"` (every host no entry
//! blocks becomes reachable) and new `allow_private` networks (names may then resolve to those
//! private addresses). Shown by the launch's trust prompt, `airlock policy trust` and
//! `airlock policy show`.

use super::LayerDoc;
use crate::policy::Mode;

/// The review of one change: call-outs first (empty when none), then the diff.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Review {
    pub callouts: Vec<String>,
    /// Unified diff (`---`/`+++`/`@@` headers), or every line as `+` when nothing was trusted
    /// before (or no copy of it was kept).
    pub diff: String,
}

impl Review {
    /// Call-outs and diff as one block of text, each line indented by two spaces.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for c in &self.callouts {
            out.push_str(&format!("  !! {c}\n"));
        }
        for line in self.diff.lines() {
            out.push_str(&format!("  {line}\n"));
        }
        out
    }
}

/// Reviews `new` (parsed as `new_doc`) against the trusted `old` bytes (parsed as `old_doc`).
/// `name` labels the diff's headers.
pub fn review(
    name: &str,
    old: Option<(&[u8], Option<&LayerDoc>)>,
    new: &[u8],
    new_doc: &LayerDoc,
) -> Review {
    let old_doc = old.and_then(|(_, d)| d);
    let mut callouts = Vec::new();
    let was_blocklist = old_doc.is_some_and(|d| d.network.mode == Some(Mode::Blocklist));
    if new_doc.network.mode == Some(Mode::Blocklist) && !was_blocklist {
        callouts.push(
            "it sets mode = \"blocklist\": every host that no block entry names becomes \
             reachable (unless your user layer sets the mode)"
                .to_owned(),
        );
    }
    let before: Vec<String> = old_doc
        .map(|d| d.network.allow_private.iter().map(|n| n.to_string()).collect())
        .unwrap_or_default();
    let added: Vec<String> = new_doc
        .network
        .allow_private
        .iter()
        .map(|n| n.to_string())
        .filter(|n| !before.contains(n))
        .collect();
    if !added.is_empty() {
        callouts.push(format!(
            "it adds allow_private {}: allowed names may then resolve to these private \
             addresses (your LAN, the host's own services)",
            added.join(", ")
        ));
    }
    // A phase's lists replace the file's [network] lists while it is in force: a new or changed
    // phase can open hosts the [network] section never names.
    let changed: Vec<&str> = new_doc
        .phases
        .iter()
        .filter(|(n, p)| old_doc.and_then(|d| d.phases.get(*n)) != Some(*p))
        .map(|(n, _)| n.as_str())
        .collect();
    if !changed.is_empty() {
        callouts.push(format!(
            "it adds or changes phase(s) {}: while one is in force (`airlock run --phase`, \
             `airlock phase set`), its allow/block lists replace this file's [network] lists",
            changed.join(", ")
        ));
    }
    let new_text = String::from_utf8_lossy(new);
    let diff = match old {
        Some((old, _)) => {
            let old_text = String::from_utf8_lossy(old);
            let d = similar::TextDiff::from_lines(old_text.as_ref(), new_text.as_ref());
            let trusted = format!("{name} (trusted)");
            let now = format!("{name} (now)");
            let mut unified = d.unified_diff();
            unified.context_radius(3).header(&trusted, &now);
            let mut text = unified.to_string();
            if !text.is_empty() && !text.ends_with('\n') {
                text.push('\n');
            }
            text
        }
        None => {
            let mut text = format!("--- (nothing trusted before)\n+++ {name} (now)\n");
            for line in new_text.lines() {
                text.push_str(&format!("+{line}\n"));
            }
            text
        }
    };
    // Line by line: the escaper shows newlines as escapes too. The file is the agent's.
    let diff = diff
        .lines()
        .map(|l| format!("{}\n", crate::audit::escape_for_terminal(l)))
        .collect::<String>();
    Review { callouts, diff }
}

/// The review of `file` (parsed as `parsed`) against what was trusted last for `repo`.
pub fn for_repo_file(
    paths: &crate::paths::Paths,
    repo: &crate::repo::Repo,
    file: &super::RepoFile,
    parsed: &super::ParsedLayer,
) -> Review {
    let old = super::trust::trusted_content(paths, repo);
    let old_doc = old.as_deref().and_then(|b| {
        super::parse_layer(crate::policy::LayerKind::Repo, &file.name, b).ok().map(|p| p.doc)
    });
    review(&file.name, old.as_deref().map(|b| (b, old_doc.as_ref())), &file.bytes, &parsed.doc)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::config::parse_layer;
    use crate::policy::LayerKind;

    fn doc(text: &str) -> LayerDoc {
        parse_layer(LayerKind::Repo, ".airlock.toml", text.as_bytes()).unwrap().doc
    }

    #[test]
    fn a_real_diff_and_call_outs_for_blocklist_and_new_private_networks() {
        let old = "# ours\n[network]\nallow = [\"a.test\"]\nallow_private = [\"10.0.0.0/8\"]\n";
        let new = "# ours\n[network]\nmode = \"blocklist\"\nallow = [\"a.test\"]\n\
                   allow_private = [\"10.0.0.0/8\", \"192.168.0.0/16\"]\n";
        let (od, nd) = (doc(old), doc(new));
        let r = review(".airlock.toml", Some((old.as_bytes(), Some(&od))), new.as_bytes(), &nd);
        assert_eq!(r.callouts.len(), 2, "{r:?}");
        assert!(r.callouts[0].contains("mode = \"blocklist\""));
        assert!(r.callouts[1].contains("192.168.0.0/16") && !r.callouts[1].contains("10.0.0.0/8"));
        assert!(r.diff.starts_with("--- .airlock.toml (trusted)\n+++ .airlock.toml (now)\n@@"));
        assert!(r.diff.contains("\n+mode = \"blocklist\"\n"), "{}", r.diff);
        assert!(r.diff.contains("\n-allow_private = [\"10.0.0.0/8\"]\n"), "{}", r.diff);
        assert!(r.diff.contains("\n # ours\n"), "context lines kept: {}", r.diff);
        // The same content again: nothing to call out, an empty diff.
        let same = review(".airlock.toml", Some((new.as_bytes(), Some(&nd))), new.as_bytes(), &nd);
        assert!(same.callouts.is_empty() && same.diff.is_empty(), "{same:?}");
    }

    #[test]
    fn new_and_changed_phases_are_called_out() {
        let old =
            "[phase.a.network]\nallow = [\"a.test\"]\n[phase.b.network]\nallow = [\"b.test\"]\n";
        let new = "[phase.a.network]\nallow = [\"a.test\"]\n[phase.b.network]\nallow = [\"x.test\"]\n\
                   [phase.c.network]\nblock = [\"c.test\"]\n";
        let r = review("f", Some((old.as_bytes(), Some(&doc(old)))), new.as_bytes(), &doc(new));
        assert_eq!(r.callouts.len(), 1, "{r:?}");
        assert!(r.callouts[0].starts_with("it adds or changes phase(s) b, c:"), "{r:?}");
        let same = review("f", Some((old.as_bytes(), Some(&doc(old)))), old.as_bytes(), &doc(old));
        assert!(same.callouts.is_empty(), "{same:?}");
    }

    #[test]
    fn nothing_trusted_before_shows_every_line_added_and_escapes() {
        let new = "[network]\nallow = [\"a.test\"] # \u{1b}[2J\n";
        let clean = doc("[network]\nallow = [\"a.test\"]\n");
        let r = review(".airlock.toml", None, new.as_bytes(), &clean);
        assert!(r.callouts.is_empty());
        assert!(r.diff.contains("+[network]\n+allow = "), "{}", r.diff);
        assert!(!r.diff.contains('\u{1b}'), "{:?}", r.diff);
        assert!(r.render().starts_with("  --- (nothing trusted before)\n"));
    }
}
