//! `airlock policy test [--repo DIR] [--json]`: run the `[[test]]` tables of the managed, user
//! and repo layers against the policy the repo's sessions would get with the repo file *as it
//! is now, as if trusted* (so a pull request can be checked before anyone trusts it), and
//! [`before_trust`], the same run every command that records trust makes first.
//!
//! Pure, like `policy check`: no name is resolved. Exit codes: 0 every test holds (or there are
//! none and none are required), 1 a test fails or the managed layer requires tests and the repo
//! file has none, 2 usage, 3 configuration error.

use serde::Serialize;
use std::collections::BTreeMap;

use super::Context;
use super::policy::RepoArgs;
use crate::config::policy_tests::{self, Outcome};
use crate::config::{self, ConfigError, LayerDoc, ParsedLayer};
use crate::paths::Paths;
use crate::policy::Policy;
use crate::repo::Repo;

const EXIT_FAILED: i32 = 1;
const EXIT_CONFIG: i32 = 3;

#[derive(Debug, clap::Args)]
pub struct TestArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Print {"tests": [...], "total", "passed", "failed", "require_tests"} on stdout
    #[arg(long)]
    pub json: bool,
}

/// The result of running every test.
#[derive(Debug)]
pub struct Report {
    pub outcomes: Vec<Outcome>,
    /// The managed layer's `[policy] require_tests`.
    pub required: bool,
    /// How many tests the repo file holds.
    pub repo_tests: usize,
    /// The repo file as the user sees it.
    pub repo_file: String,
}

impl Report {
    pub fn failed(&self) -> impl Iterator<Item = &Outcome> {
        self.outcomes.iter().filter(|o| !o.pass)
    }

    /// The managed layer requires tests and the repo file has none.
    pub fn missing_required(&self) -> bool {
        self.required && self.repo_tests == 0
    }
}

/// Runs the tests of the managed and user layers and of `repo` (the repo file's parse, trusted
/// or not) against the policy those three layers build.
pub fn evaluate(
    paths: &Paths,
    repo: &Repo,
    repo_parsed: Option<&ParsedLayer>,
) -> Result<Report, ConfigError> {
    let identity = config::load_identity(paths)?;
    // The repo file is added by the caller as it is now; `load` would apply it only if trusted.
    let loaded = config::load(paths, None, identity.as_ref())?;
    let layers: Vec<&ParsedLayer> = [loaded.managed.as_ref(), loaded.user.as_ref(), repo_parsed]
        .into_iter()
        .flatten()
        .collect();
    let tests: Vec<_> = layers
        .iter()
        .flat_map(|p| p.tests.tests.iter().map(|t| (p.doc.kind, p.doc.name.as_str(), t)))
        .collect();
    let outcomes = if tests.is_empty() {
        Vec::new()
    } else {
        let docs: Vec<&LayerDoc> = layers.iter().map(|p| &p.doc).collect();
        let plain = config::build_policy(&docs, &loaded.review_servers)?.policy;
        // One evaluator per phase the tests name, built up front so an unknown phase is a
        // configuration error located at its test rather than a failing test.
        let mut phased: BTreeMap<&str, Policy> = BTreeMap::new();
        for (_, _, t) in &tests {
            let Some(phase) = t.phase.as_deref() else { continue };
            if phased.contains_key(phase) {
                continue;
            }
            let built = config::build_policy_in_phase(&docs, &loaded.review_servers, Some(phase))
                .map_err(|e| match e {
                ConfigError::Phase(why) => {
                    ConfigError::Phase(format!("{}: test.phase: {why}", t.at))
                }
                e => e,
            })?;
            phased.insert(phase, built.policy);
        }
        policy_tests::run(tests, |phase| phase.and_then(|p| phased.get(p)).unwrap_or(&plain))
    };
    Ok(Report {
        outcomes,
        required: loaded.managed.as_ref().and_then(|m| m.tests.require_tests).unwrap_or(false),
        repo_tests: repo_parsed.map_or(0, |p| p.tests.tests.len()),
        repo_file: config::display_path(paths, &repo.config_file()),
    })
}

/// The check every trust-recording command makes before it records `repo_parsed`: the tests
/// must hold (unless `force`), and a managed `require_tests` must be met (`force` does not lift
/// it, like other managed pins). `Ok` is how many tests ran; `Err` the message to print, one
/// problem per line. Failures lifted by `force` are reported on stderr.
pub fn before_trust(
    paths: &Paths,
    repo: &Repo,
    repo_parsed: &ParsedLayer,
    force: bool,
) -> Result<usize, String> {
    let report = evaluate(paths, repo, Some(repo_parsed)).map_err(|e| {
        format!("{e}\nrefusing to trust {}: its policy tests cannot run", repo_parsed.doc.name)
    })?;
    if report.missing_required() {
        return Err(format!(
            "refusing to trust {}: the managed policy requires policy tests ([policy] \
             require_tests) and the file has no [[test]] table; add tests (docs/configuration.md, \
             \"Policy tests\"); --force does not lift this",
            report.repo_file
        ));
    }
    let failed: Vec<&Outcome> = report.failed().collect();
    if failed.is_empty() {
        return Ok(report.outcomes.len());
    }
    let lines: Vec<String> = failed.iter().map(|o| format!("FAIL {}", line(o))).collect();
    if force {
        for l in &lines {
            eprintln!("airlock: {l}");
        }
        eprintln!(
            "airlock: warning: {} of {} policy tests fail; trusting anyway (--force)",
            failed.len(),
            report.outcomes.len()
        );
        return Ok(report.outcomes.len());
    }
    Err(format!(
        "{}\nrefusing to trust {}: {} of {} policy tests fail; fix the policy or the tests \
         (`airlock policy test --repo {r}`), or record trust despite them with \
         `airlock policy trust --force --repo {r}`",
        lines.join("\n"),
        report.repo_file,
        failed.len(),
        report.outcomes.len(),
        r = repo.path.display()
    ))
}

/// `api.anthropic.com: expected allow, got deny [not_allowed] (test at f:4:10)`
fn line(o: &Outcome) -> String {
    let mut out = format!("{}: expected {}", o.target, o.expect.as_str());
    let code = o.expect_reason.as_deref().filter(|_| o.expect_reason_is_code());
    if let Some(c) = code {
        out.push_str(&format!(" [{c}]"));
    }
    if let Some(p) = &o.phase {
        out.push_str(&format!(" in phase {p}"));
    }
    out.push_str(&format!(", got {} [{}]", o.got.as_str(), o.decision.reason));
    if let Some(rule) = &o.decision.rule {
        out.push_str(&format!(" by rule {rule:?}"));
    }
    if o.decision.rule.is_some() || o.decision.policy.is_some() {
        out.push_str(&format!(" ({} layer", o.decision.layer));
        if let Some(p) = &o.decision.policy {
            out.push_str(&format!(", {p}"));
        }
        out.push(')');
    }
    out.push_str(&format!(" (test at {})", o.at));
    if let Some(note) = o.expect_reason.as_deref().filter(|_| !o.expect_reason_is_code())
        && !o.pass
    {
        out.push_str(&format!("; why this test exists: {note}"));
    }
    out
}

#[derive(Debug, Serialize)]
struct TestJson<'a> {
    target: &'a str,
    expect: &'static str,
    /// The test's `reason` as written (a code is also checked).
    expect_reason: Option<&'a str>,
    /// The phase the test was decided in (`null`: the plain `[network]` lists).
    phase: Option<&'a str>,
    got: &'static str,
    reason: &'static str,
    rule: Option<&'a str>,
    layer: &'static str,
    policy: Option<&'a str>,
    /// The layer whose file holds the test, and where.
    test_layer: &'static str,
    at: &'a str,
    pass: bool,
}

#[derive(Debug, Serialize)]
struct ReportJson<'a> {
    tests: Vec<TestJson<'a>>,
    total: usize,
    passed: usize,
    failed: usize,
    require_tests: bool,
    /// The managed layer requires tests and the repo file has none.
    missing_required: bool,
}

pub fn run(args: &TestArgs, ctx: &Context<'_>) -> i32 {
    let prepared = (|| {
        let paths = Paths::from_env(ctx.env).map_err(|e| e.to_string())?;
        let repo = Repo::resolve(args.repo.repo.as_deref(), &ctx.cwd).map_err(|e| e.to_string())?;
        let file = config::load_repo_file(&paths, &repo).map_err(|e| e.to_string())?;
        // As if trusted: the file is parsed whatever its trust state.
        let parsed = file.as_ref().map(|f| f.parse()).transpose().map_err(|e| e.to_string())?;
        evaluate(&paths, &repo, parsed.as_ref()).map_err(|e| e.to_string())
    })();
    let report = match prepared {
        Ok(r) => r,
        Err(e) => {
            for l in e.lines() {
                eprintln!("airlock: {l}");
            }
            return EXIT_CONFIG;
        }
    };
    let failed = report.failed().count();
    if args.json {
        let json = ReportJson {
            tests: report
                .outcomes
                .iter()
                .map(|o| TestJson {
                    target: &o.target,
                    expect: o.expect.as_str(),
                    expect_reason: o.expect_reason.as_deref(),
                    phase: o.phase.as_deref(),
                    got: o.got.as_str(),
                    reason: o.decision.reason.as_str(),
                    rule: o.decision.rule.as_deref(),
                    layer: o.decision.layer.as_str(),
                    policy: o.decision.policy.as_deref(),
                    test_layer: o.test_layer.as_str(),
                    at: &o.at,
                    pass: o.pass,
                })
                .collect(),
            total: report.outcomes.len(),
            passed: report.outcomes.len() - failed,
            failed,
            require_tests: report.required,
            missing_required: report.missing_required(),
        };
        match serde_json::to_string(&json) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("airlock: cannot encode JSON: {e}"),
        }
    } else {
        for o in &report.outcomes {
            println!("{} {}", if o.pass { "ok  " } else { "FAIL" }, line(o));
        }
        if report.outcomes.is_empty() {
            println!(
                "no policy tests: no [[test]] table in the managed, user or repo layer ({}); \
                 see docs/configuration.md, \"Policy tests\"",
                report.repo_file
            );
        } else {
            println!(
                "{} tests: {} passed, {failed} failed",
                report.outcomes.len(),
                report.outcomes.len() - failed
            );
        }
    }
    if report.missing_required() {
        eprintln!(
            "airlock: the managed policy requires policy tests ([policy] require_tests) and {} \
             has no [[test]] table; add tests to it",
            report.repo_file
        );
        return EXIT_FAILED;
    }
    if failed > 0 { EXIT_FAILED } else { 0 }
}
