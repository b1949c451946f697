//! Policy tests (`[[test]]` tables) and the managed layer's `[policy] require_tests`: their
//! schema, validated from the spanned TOML tree so each problem is located at `file:line:col`,
//! and [`run`], which decides every test with the evaluator `airlock policy check` uses (pure:
//! no name is resolved).
//!
//! ```toml
//! [[test]]
//! target = "api.anthropic.com"   # host, host:port, [v6]:port or URL (as `policy check`)
//! expect = "allow"               # or "deny"
//! reason = "blocked"             # optional: a reason code is checked, other text is a note
//! phase = "build"                # optional: decided with [phase.build.network] in force
//! [policy]                       # managed layer only
//! require_tests = true           # a repo file without [[test]] cannot be trusted
//! ```

use std::ops::Range;

use serde::Serialize;
use toml::Spanned;
use toml::de::{DeTable, DeValue};

use super::diag::{line_col, suggestion};
use crate::policy::{Decision, LayerKind, LocalAddrs, Policy, Reason, Verdict, parse_target};

const TEST_KEYS: &[&str] = &["target", "expect", "reason", "phase"];
const POLICY_KEYS: &[&str] = &["require_tests"];
const EXPECTS: &[&str] = &["allow", "deny"];

/// What a test expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Expect {
    Allow,
    Deny,
}

impl Expect {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }
}

/// One `[[test]]` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyTest {
    /// As written.
    pub target: String,
    pub expect: Expect,
    /// A reason code (`blocked`, `not_allowed`, …; also checked) or a free-text note.
    pub reason: Option<String>,
    /// Decide with this phase in force (`[phase.NAME.network]` in place of each defining
    /// layer's `[network]` lists, as `airlock policy check --phase NAME`).
    pub phase: Option<String>,
    /// `file:line:col` of the table's `target`, for messages.
    pub at: String,
}

impl PolicyTest {
    /// The reason when it is one of the documented codes (then the verdict's code must match).
    pub fn reason_code(&self) -> Option<Reason> {
        let r = self.reason.as_deref()?;
        Reason::ALL.iter().copied().find(|c| c.as_str() == r)
    }
}

/// What one layer file holds besides its policy: its tests and `[policy]` settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyTests {
    pub tests: Vec<PolicyTest>,
    /// `[policy] require_tests` (managed layer only).
    pub require_tests: Option<bool>,
}

/// Problems found, each with its span (the layer walker turns them into diagnostics).
pub(super) type Problems = Vec<(Range<usize>, String)>;

type Item<'i> = Spanned<DeValue<'i>>;

/// `test = [...]` (from `[[test]]` tables): the tests, and every problem found.
pub(super) fn walk_tests(name: &str, text: &str, value: &Item<'_>) -> (Vec<PolicyTest>, Problems) {
    let mut problems = Problems::new();
    let DeValue::Array(items) = value.get_ref() else {
        problems.push((
            value.span(),
            format!(
                "`test` must be an array of tables ([[test]] with target and expect), found {}",
                value.get_ref().type_str()
            ),
        ));
        return (Vec::new(), problems);
    };
    let mut tests = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let DeValue::Table(t) = item.get_ref() else {
            problems.push((
                item.span(),
                format!(
                    "test[{i}] must be a table ([[test]]), found {}",
                    item.get_ref().type_str()
                ),
            ));
            continue;
        };
        if let Some(test) = one_test(name, text, t, item.span(), &mut problems) {
            tests.push(test);
        }
    }
    (tests, problems)
}

fn one_test(
    name: &str,
    text: &str,
    table: &DeTable<'_>,
    span: Range<usize>,
    problems: &mut Problems,
) -> Option<PolicyTest> {
    let (mut target, mut expect, mut reason, mut phase, mut ok) = (None, None, None, None, true);
    let string = |value: &Item<'_>, what: &str, problems: &mut Problems| match value.get_ref() {
        DeValue::String(s) => Some(s.to_string()),
        other => {
            problems.push((
                value.span(),
                format!("test.{what} must be a string, found {}", other.type_str()),
            ));
            None
        }
    };
    for (key, value) in table.iter() {
        match key.get_ref().as_ref() {
            "target" => match string(value, "target", problems) {
                Some(t) => match parse_target(&t) {
                    Ok(_) => {
                        let (line, col) = line_col(text, value.span().start);
                        target = Some((t, format!("{name}:{line}:{col}")));
                    }
                    Err(why) => {
                        problems.push((
                            value.span(),
                            format!(
                                "test.target {t:?} is malformed: {why}; write a host, host:port, \
                                 [v6]:port or URL as for `airlock policy check`"
                            ),
                        ));
                        ok = false;
                    }
                },
                None => ok = false,
            },
            "expect" => match string(value, "expect", problems).as_deref() {
                Some("allow") => expect = Some(Expect::Allow),
                Some("deny") => expect = Some(Expect::Deny),
                Some(other) => {
                    problems.push((
                        value.span(),
                        format!(
                            "test.expect must be \"allow\" or \"deny\", found {other:?}; {}",
                            suggestion(other, EXPECTS)
                        ),
                    ));
                    ok = false;
                }
                None => ok = false,
            },
            "reason" => match string(value, "reason", problems) {
                Some(r) => reason = Some(r),
                None => ok = false,
            },
            "phase" => match string(value, "phase", problems) {
                Some(p) if super::phase::is_phase_name(&p) => phase = Some(p),
                Some(p) => {
                    problems.push((
                        value.span(),
                        format!(
                            "test.phase {p:?} is not a phase name: 1 to 32 of a-z, 0-9, `_` and \
                             `-`, starting with a letter or digit (as in [phase.NAME.network])"
                        ),
                    ));
                    ok = false;
                }
                None => ok = false,
            },
            other => {
                problems.push((
                    key.span(),
                    format!("unknown key `{other}` in [[test]]; {}", suggestion(other, TEST_KEYS)),
                ));
                ok = false;
            }
        }
    }
    if !ok {
        return None;
    }
    let missing: Vec<&str> = [("target", target.is_none()), ("expect", expect.is_none())]
        .into_iter()
        .filter_map(|(k, m)| m.then_some(k))
        .collect();
    match (target, expect) {
        (Some((target, at)), Some(expect)) => {
            Some(PolicyTest { target, expect, reason, phase, at })
        }
        _ => {
            problems.push((
                span,
                format!(
                    "a [[test]] table needs {} (e.g. target = \"api.anthropic.com\", expect = \
                     \"allow\")",
                    missing.iter().map(|k| format!("`{k}`")).collect::<Vec<_>>().join(" and ")
                ),
            ));
            None
        }
    }
}

/// `[policy]`: `require_tests`, allowed in the managed layer only.
pub(super) fn walk_policy(
    kind: LayerKind,
    key_span: Range<usize>,
    value: &Item<'_>,
) -> (Option<bool>, Problems) {
    let mut problems = Problems::new();
    if kind != LayerKind::Managed {
        problems.push((
            key_span,
            format!(
                "[policy] is not allowed in the {kind} layer: whether policy tests are required \
                 is set only in the managed policy (/etc/airlock/policy.toml); remove it here"
            ),
        ));
        return (None, problems);
    }
    let DeValue::Table(table) = value.get_ref() else {
        problems.push((
            value.span(),
            format!("[policy] must be a table, found {}", value.get_ref().type_str()),
        ));
        return (None, problems);
    };
    let mut require = None;
    for (key, value) in table.iter() {
        match key.get_ref().as_ref() {
            "require_tests" => match value.get_ref() {
                DeValue::Boolean(b) => require = Some(*b),
                other => problems.push((
                    value.span(),
                    format!(
                        "policy.require_tests must be true or false, found {}",
                        other.type_str()
                    ),
                )),
            },
            other => problems.push((
                key.span(),
                format!("unknown key `{other}` in [policy]; {}", suggestion(other, POLICY_KEYS)),
            )),
        }
    }
    (require, problems)
}

/// One test's result.
#[derive(Debug, Clone, Serialize)]
pub struct Outcome {
    /// The layer whose file holds the test.
    pub test_layer: LayerKind,
    /// That file as the user sees it.
    pub file: String,
    /// `file:line:col` of the test.
    pub at: String,
    pub target: String,
    pub expect: Expect,
    /// The reason the test names (a code or a note), as written.
    pub expect_reason: Option<String>,
    /// The phase the test was decided in.
    pub phase: Option<String>,
    pub got: Expect,
    pub decision: Decision,
    pub pass: bool,
}

impl Outcome {
    /// The test's `reason` is a reason code (checked), not a free-text note.
    pub fn expect_reason_is_code(&self) -> bool {
        self.expect_reason.as_deref().is_some_and(|r| Reason::ALL.iter().any(|c| c.as_str() == r))
    }
}

/// Decides every test against the policy its phase builds (`policy_for(None)`: no phase),
/// pure: no name resolved, no interface read. A test passes when the verdict is the expected
/// one and, if its `reason` is a reason code, the verdict's reason is that code.
pub fn run<'a, 'p>(
    tests: impl IntoIterator<Item = (LayerKind, &'a str, &'a PolicyTest)>,
    policy_for: impl Fn(Option<&str>) -> &'p Policy,
) -> Vec<Outcome> {
    tests
        .into_iter()
        .map(|(layer, file, t)| {
            let policy = policy_for(t.phase.as_deref());
            let decision = match parse_target(&t.target) {
                Ok(target) => {
                    policy.decide(&target.host, target.port.unwrap_or(443), &LocalAddrs::default())
                }
                // Validated when the file was parsed; a refusal if it ever is not.
                Err(_) => Decision::refusal(Reason::Malformed),
            };
            let got = match decision.verdict {
                Verdict::Allow => Expect::Allow,
                Verdict::Deny => Expect::Deny,
            };
            let pass = got == t.expect && t.reason_code().is_none_or(|c| c == decision.reason);
            Outcome {
                test_layer: layer,
                file: file.to_owned(),
                at: t.at.clone(),
                target: t.target.clone(),
                expect: t.expect,
                expect_reason: t.reason.clone(),
                phase: t.phase.clone(),
                got,
                decision,
                pass,
            }
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::config::parse_layer;

    fn errors(kind: LayerKind, text: &str) -> String {
        parse_layer(kind, "f.toml", text.as_bytes()).unwrap_err().to_string()
    }

    #[test]
    fn tests_parse_with_their_locations() {
        let text = "[network]\nallow = [\"a.test\"]\n\n[[test]]\ntarget = \"a.test\"\nexpect = \"allow\"\n\n[[test]]\ntarget = \"https://b.test:8443/x\"\nexpect = \"deny\"\nreason = \"not_allowed\"\n";
        let p = parse_layer(LayerKind::Repo, "f.toml", text.as_bytes()).unwrap();
        let t = &p.tests.tests;
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].at, "f.toml:5:10");
        assert_eq!(t[1].expect, Expect::Deny);
        assert_eq!(t[1].reason_code(), Some(Reason::NotAllowed));
        assert_eq!(p.tests.require_tests, None);
    }

    #[test]
    fn bad_tests_are_located_with_a_fix() {
        let table: &[(&str, &str)] = &[
            (
                "[[test]]\ntarget = \"a.test\"\nexpect = \"allowed\"\n",
                "f.toml:3:10: test.expect must be \"allow\" or \"deny\", found \"allowed\"; did you mean `allow`?",
            ),
            (
                "[[test]]\ntarget = \"a.test\"\nexpect = \"allow\"\nwhy = \"x\"\n",
                "f.toml:4:1: unknown key `why` in [[test]]",
            ),
            (
                "[[test]]\ntarget = \"-a.test\"\nexpect = \"allow\"\n",
                "f.toml:2:10: test.target \"-a.test\" is malformed",
            ),
            (
                "[[test]]\ntarget = \"a.test:0\"\nexpect = \"deny\"\n",
                "f.toml:2:10: test.target \"a.test:0\" is malformed",
            ),
            ("[[test]]\nexpect = \"deny\"\n", "f.toml:1:1: a [[test]] table needs `target`"),
            ("[[test]]\ntarget = \"a.test\"\n", "needs `expect`"),
            (
                "[[test]]\ntarget = 1\nexpect = \"deny\"\n",
                "f.toml:2:10: test.target must be a string, found integer",
            ),
            (
                "[[test]]\ntarget = \"a.test\"\nexpect = \"deny\"\nphase = \"-x\"\n",
                "f.toml:4:9: test.phase \"-x\" is not a phase name",
            ),
            ("test = 1\n", "f.toml:1:8: `test` must be an array of tables"),
            ("test = [1]\n", "f.toml:1:9: test[0] must be a table"),
            (
                "[[test]]\ntarget = \"a.test\"\nexpect = \"deny\"\nreason = 3\n",
                "f.toml:4:10: test.reason must be a string",
            ),
        ];
        for (text, want) in table {
            let got = errors(LayerKind::Repo, text);
            assert!(got.contains(want), "{text:?}:\n got {got}\nwant {want}");
        }
    }

    proptest::proptest! {
        /// Whatever the target text, a `[[test]]` either parses with a target `policy check`
        /// accepts, or is refused with an error located on the target's line.
        #[test]
        fn any_target_is_accepted_as_policy_check_would_or_located(
            target in "(\\PC|\\[|\\]|:|/|\\.|-){0,40}",
        ) {
            let quoted = toml::Value::String(target.clone()).to_string();
            let text = format!("[[test]]\ntarget = {quoted}\nexpect = \"deny\"\n");
            match parse_layer(LayerKind::Repo, "f.toml", text.as_bytes()) {
                Ok(p) => {
                    proptest::prop_assert!(parse_target(&target).is_ok());
                    proptest::prop_assert_eq!(&p.tests.tests[0].target, &target);
                }
                Err(e) => {
                    proptest::prop_assert!(parse_target(&target).is_err());
                    let e = e.to_string();
                    proptest::prop_assert!(e.starts_with("f.toml:2:10: test.target "), "{}", e);
                }
            }
        }
    }

    #[test]
    fn require_tests_is_managed_only() {
        let p = parse_layer(LayerKind::Managed, "m", b"[policy]\nrequire_tests = true\n").unwrap();
        assert_eq!(p.tests.require_tests, Some(true));
        for kind in [LayerKind::User, LayerKind::Repo] {
            let e = errors(kind, "[policy]\nrequire_tests = true\n");
            assert!(e.contains("f.toml:1:2: [policy] is not allowed in the"), "{e}");
        }
        let e = errors(LayerKind::Managed, "[policy]\nrequire_tests = \"yes\"\nrequire = 1\n");
        assert!(e.contains("f.toml:2:17: policy.require_tests must be true or false"), "{e}");
        assert!(e.contains("f.toml:3:1: unknown key `require` in [policy]"), "{e}");
    }

    #[test]
    fn outcomes_check_verdict_and_reason_codes() {
        let text = "[network]\nallow = [\"a.test\"]\nblock = [\"bad.test\"]\n[[test]]\ntarget = \"a.test\"\nexpect = \"allow\"\n[[test]]\ntarget = \"bad.test\"\nexpect = \"deny\"\nreason = \"blocked\"\n[[test]]\ntarget = \"other.test\"\nexpect = \"deny\"\nreason = \"blocked\"\n[[test]]\ntarget = \"other.test\"\nexpect = \"deny\"\nreason = \"unlisted on purpose\"\n[[test]]\ntarget = \"a.test:22\"\nexpect = \"allow\"\n";
        let p = parse_layer(LayerKind::Repo, "f.toml", text.as_bytes()).unwrap();
        let built = crate::config::build_policy(&[&p.doc], &[]).unwrap();
        let out =
            run(p.tests.tests.iter().map(|t| (LayerKind::Repo, "f.toml", t)), |_| &built.policy);
        let pass: Vec<bool> = out.iter().map(|o| o.pass).collect();
        // The third is denied, but as not_allowed, not blocked; the fifth needs a port entry.
        assert_eq!(pass, [true, true, false, true, false]);
        assert_eq!(out[2].decision.reason, Reason::NotAllowed);
        assert_eq!(out[1].decision.rule.as_deref(), Some("bad.test"));
    }
}
