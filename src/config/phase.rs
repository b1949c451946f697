//! `[phase.NAME.network]`: named alternatives to a layer's `[network]` `allow`/`block` lists,
//! parsed and validated here (names, keys, entries at `file:line:col`) so the layer parser only
//! dispatches to it. While phase NAME is in force, a layer with that block is evaluated with its
//! lists in place of `[network]`'s (`policy::Policy::build_in_phase`); docs/configuration.md,
//! "Phases", is the reference.

use serde::{Deserialize, Serialize};
use toml::de::DeTable;

use super::diag::nearest;
use super::layer::{LayerDoc, Walker};
use crate::policy::EntryKind;

/// The longest phase name, in bytes.
pub const MAX_PHASE_NAME: usize = 32;

/// The documented phase-name syntax, for messages.
pub const PHASE_NAME_SYNTAX: &str =
    "1 to 32 characters of a-z, 0-9, `_` and `-`, starting with a letter or digit";

const PHASE_KEYS: &[&str] = &["network"];
const PHASE_NETWORK_KEYS: &[&str] = &["allow", "block"];

/// One `[phase.NAME.network]` block: entries as written (the `[network]` entry syntax).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PhaseDoc {
    #[serde(default)]
    pub allow: Vec<String>,
    #[serde(default)]
    pub block: Vec<String>,
}

/// `[a-z0-9][a-z0-9_-]{0,31}`: safe in a command line, a TOML bare key and a file name.
pub fn is_phase_name(name: &str) -> bool {
    let b = name.as_bytes();
    let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= MAX_PHASE_NAME
        && ok(&b[0])
        && b.iter().all(|c| ok(c) || *c == b'_' || *c == b'-')
}

impl Walker<'_> {
    /// The `[phase]` table: one sub-table per phase, each holding only `network`.
    pub(super) fn phases(&mut self, table: &DeTable<'_>, doc: &mut LayerDoc) {
        for (key, value) in table.iter() {
            let name = key.get_ref().as_ref();
            if !is_phase_name(name) {
                self.error(
                    key.span(),
                    format!("phase name {name:?} is not valid: use {PHASE_NAME_SYNTAX}"),
                );
                continue;
            }
            let section = format!("[phase.{name}]");
            let Some(t) = self.table(value, &section) else { continue };
            let mut phase = PhaseDoc::default();
            for (key, value) in t.iter() {
                match key.get_ref().as_ref() {
                    "network" => {
                        let section = format!("[phase.{name}.network]");
                        if let Some(net) = self.table(value, &section) {
                            self.phase_network(net, name, &mut phase);
                        }
                    }
                    _ => self.unknown(key, &section, PHASE_KEYS),
                }
            }
            doc.phases.insert(name.to_owned(), phase);
        }
    }

    fn phase_network(&mut self, table: &DeTable<'_>, name: &str, phase: &mut PhaseDoc) {
        let section = format!("phase.{name}.network");
        let (mut allow, mut block) = (Vec::new(), Vec::new());
        for (key, value) in table.iter() {
            match key.get_ref().as_ref() {
                "allow" => allow = self.entries(value, EntryKind::Allow, &section),
                "block" => block = self.entries(value, EntryKind::Block, &section),
                k @ ("mode" | "allow_private") => self.error(
                    key.span(),
                    format!(
                        "`{k}` cannot be set in [{section}]: a phase changes only `allow` and \
                         `block`; set `{k}` in [network], where it applies in every phase"
                    ),
                ),
                _ => self.unknown(key, &format!("[{section}]"), PHASE_NETWORK_KEYS),
            }
        }
        self.cross_check(&allow, &block, &section);
        phase.allow = allow.into_iter().map(|(e, _)| e.text().to_owned()).collect();
        phase.block = block.into_iter().map(|(e, _)| e.text().to_owned()).collect();
    }
}

/// The phases `layers` define, each with the layers (their files) defining it, sorted by name.
pub fn defined_phases(layers: &[&LayerDoc]) -> Vec<(String, Vec<String>)> {
    let mut out: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for l in layers {
        for name in l.phases.keys() {
            out.entry(name.clone()).or_default().push(l.name.clone());
        }
    }
    out.into_iter().collect()
}

/// The error for a phase no applied layer defines: what was asked, what is defined, what to do.
pub fn unknown_phase_message(phase: &str, layers: &[&LayerDoc]) -> String {
    unknown_phase_among(phase, &defined_phases(layers))
}

/// [`unknown_phase_message`] over [`defined_phases`]' result.
pub fn unknown_phase_among(phase: &str, defined: &[(String, Vec<String>)]) -> String {
    if defined.is_empty() {
        format!(
            "unknown phase {phase:?}: no layer in force defines any phase; add a \
             [phase.{phase}.network] block to .airlock.toml (then `airlock policy trust`) or \
             ~/.airlock/config.toml"
        )
    } else {
        let list: Vec<String> =
            defined.iter().map(|(n, files)| format!("{n} ({})", files.join(", "))).collect();
        let names: Vec<&str> = defined.iter().map(|(n, _)| n.as_str()).collect();
        let hint =
            nearest(phase, &names).map(|n| format!("; did you mean `{n}`?")).unwrap_or_default();
        format!(
            "unknown phase {phase:?}; the phases defined by the layers in force are: {}{hint}",
            list.join(", ")
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::config::{ConfigError, parse_layer};
    use crate::policy::LayerKind;

    const F: &str = "/r/.airlock.toml";

    fn err(kind: LayerKind, text: &str) -> String {
        match parse_layer(kind, F, text.as_bytes()) {
            Err(ConfigError::Invalid(d)) => {
                d.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
            }
            other => panic!("expected errors, got {other:?}"),
        }
    }

    #[test]
    fn phase_blocks_parse_in_every_layer_that_may_set_allow_and_block() {
        let text = "[network]\nallow = [\"a.test\"]\n[phase.build.network]\nallow = [\"pypi.test\", \"=files.test:8443\"]\nblock = [\"evil.test\"]\n[phase.ship-2.network]\nallow = [\"api.test\"]\n";
        for kind in [LayerKind::Managed, LayerKind::User, LayerKind::Repo, LayerKind::Operator] {
            let doc = parse_layer(kind, F, text.as_bytes()).unwrap().doc;
            assert_eq!(doc.network.allow, ["a.test"]);
            let build = &doc.phases["build"];
            assert_eq!(build.allow, ["pypi.test", "=files.test:8443"]);
            assert_eq!(build.block, ["evil.test"]);
            assert_eq!(doc.phases["ship-2"].allow, ["api.test"]);
            let layer = doc.to_policy_layer().unwrap();
            assert_eq!(layer.phases["build"].allow[1].text(), "=files.test:8443");
            // Documents round-trip through JSON (the CLI's cache) unchanged.
            let json = serde_json::to_string(&doc).unwrap();
            assert_eq!(serde_json::from_str::<LayerDoc>(&json).unwrap(), doc);
        }
        // Dotted keys are the same table.
        let doc =
            parse_layer(LayerKind::Repo, F, b"phase.x.network.block = [\"b.test\"]\n").unwrap().doc;
        assert_eq!(doc.phases["x"].block, ["b.test"]);
    }

    #[test]
    fn bad_phase_input_is_located_with_a_fix() {
        let repo = |t: &str| err(LayerKind::Repo, t);
        let table = [
            (
                "[phase.Build.network]\nallow = [\"a.test\"]\n",
                "/r/.airlock.toml:1:8: phase name \"Build\" is not valid: use 1 to 32 characters",
            ),
            ("[phase.\"-x\".network]\n", "/r/.airlock.toml:1:8: phase name \"-x\" is not valid"),
            ("[phase.\"a b\".network]\n", "/r/.airlock.toml:1:8: phase name \"a b\" is not valid"),
            (
                "[phase.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa.network]\n",
                "/r/.airlock.toml:1:8: phase name \"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\" is not valid",
            ),
            (
                "[phase.build.netwrk]\n",
                "/r/.airlock.toml:1:14: unknown key `netwrk` in [phase.build]; did you mean `network`?",
            ),
            (
                "[phase.build.network]\nalow = [\"a.test\"]\n",
                "/r/.airlock.toml:2:1: unknown key `alow` in [phase.build.network]; did you mean `allow`?",
            ),
            (
                "[phase.build.network]\nallow = [\"bad host\"]\n",
                "/r/.airlock.toml:2:10: phase.build.network.allow entry \"bad host\"",
            ),
            (
                "[phase.build.network]\nblock = [\"x.test:0\"]\n",
                "/r/.airlock.toml:2:10: phase.build.network.block entry \"x.test:0\"",
            ),
            (
                "[phase.build.network]\nmode = \"blocklist\"\n",
                "/r/.airlock.toml:2:1: `mode` cannot be set in [phase.build.network]: a phase \
                 changes only `allow` and `block`",
            ),
            (
                "[phase.build.network]\nallow_private = [\"127.0.0.2\"]\n",
                "/r/.airlock.toml:2:1: `allow_private` cannot be set in [phase.build.network]",
            ),
            ("[phase]\nbuild = 1\n", "/r/.airlock.toml:2:9: [phase.build] must be a table"),
            ("phase = 1\n", "/r/.airlock.toml:1:9: [phase] must be a table"),
            (
                "[phase.build]\nnetwork = \"x\"\n",
                "/r/.airlock.toml:2:11: [phase.build.network] must be a table",
            ),
            (
                "[phase.build.network]\nallow = \"a.test\"\n",
                "/r/.airlock.toml:2:9: phase.build.network.allow must be an array of strings",
            ),
            (
                "[phaze.build.network]\n",
                "/r/.airlock.toml:1:2: unknown key `phaze` in the top level; did you mean `phase`?",
            ),
        ];
        for (text, want) in table {
            let got = repo(text);
            assert!(got.starts_with(want), "{text:?}\n got: {got}\nwant: {want}");
        }
        // Overlaps within a phase warn like [network]'s.
        let p = parse_layer(
            LayerKind::Repo,
            F,
            b"[phase.b.network]\nallow = [\"x.test\"]\nblock = [\"x.test\"]\n",
        )
        .unwrap();
        assert!(p.warnings[0].to_string().contains("in both phase.b.network.allow"), "{p:?}");
    }

    #[test]
    fn phase_names_follow_the_documented_charset() {
        for ok in ["a", "0", "build", "ship-2", "a_b", &"x".repeat(32)] {
            assert!(is_phase_name(ok), "{ok}");
        }
        for bad in ["", "-a", "_a", "A", "a.b", "a b", "é", &"x".repeat(33)] {
            assert!(!is_phase_name(bad), "{bad}");
        }
    }

    proptest::proptest! {
        /// Any `[phase.NAME.network]` key: accepted exactly when the name is valid, and a
        /// rejected one is reported at the name.
        #[test]
        fn any_phase_name_is_accepted_or_located(name in "[a-zA-Z0-9_. -]{0,40}") {
            let text = format!("[phase.\"{name}\".network]\nallow = [\"a.test\"]\n");
            match parse_layer(LayerKind::Repo, F, text.as_bytes()) {
                Ok(p) => {
                    proptest::prop_assert!(is_phase_name(&name));
                    proptest::prop_assert!(p.doc.phases.contains_key(&name));
                }
                Err(e) => {
                    proptest::prop_assert!(!is_phase_name(&name));
                    proptest::prop_assert!(e.to_string().starts_with("/r/.airlock.toml:1:8: phase name"), "{e}");
                }
            }
        }
    }

    #[test]
    fn unknown_phases_name_the_defined_ones() {
        let a =
            parse_layer(LayerKind::User, "~/u", b"[phase.build.network]\nallow = [\"a.test\"]\n")
                .unwrap()
                .doc;
        let b = parse_layer(LayerKind::Repo, F, b"[phase.build.network]\n[phase.ship.network]\n")
            .unwrap()
            .doc;
        let m = unknown_phase_message("bild", &[&a, &b]);
        assert_eq!(
            m,
            "unknown phase \"bild\"; the phases defined by the layers in force are: build (~/u, \
             /r/.airlock.toml), ship (/r/.airlock.toml); did you mean `build`?"
        );
        assert!(!unknown_phase_message("zzz", &[&a, &b]).contains("did you mean"));
        assert!(unknown_phase_message("x", &[]).contains("no layer in force defines any phase"));
    }
}
