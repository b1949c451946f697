//! `airlock policy check | show | trust`: decide a target against the layers in force, show
//! the effective policy, and trust a repo's `.airlock.toml` by content hash (DESIGN §4).
//!
//! `policy check` is pure: it never resolves a name, unless `--resolve` asks it to (then the
//! answers go through the proxy's address guard, [`super::policy_resolve`]). Exit codes
//! (DESIGN §3): 0 allowed, 1 denied, 2 malformed target, 3 configuration error, 4 the name did
//! not resolve (`--resolve`).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde::Serialize;

use super::Context;
use crate::config::{self, ConfigError, LayerDoc, Loaded, ParsedLayer, RepoFile, trust};
use crate::paths::Paths;
use crate::policy::{
    Decision, EntryKind, LayerKind, LocalAddrs, Mode, Reason, Verdict, parse_target,
};
use crate::repo::Repo;

/// Exit codes of `airlock policy check`.
pub const EXIT_ALLOWED: i32 = 0;
pub const EXIT_DENIED: i32 = 1;
pub const EXIT_MALFORMED: i32 = 2;
pub const EXIT_CONFIG: i32 = 3;

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Decide whether a target may be reached (exit 0 allowed, 1 denied, 2 malformed target,
    /// 3 configuration error, 4 resolution failed); resolves names only with --resolve
    Check(CheckArgs),
    /// Show the effective policy: mode, each layer, trust state, shadowed entries, warnings
    Show(ShowArgs),
    /// Trust the repo's .airlock.toml as it is now (recorded by SHA-256), after its policy
    /// tests pass
    Trust(TrustArgs),
    /// Run the [[test]] tables against the policy with the repo file as it is now, as if
    /// trusted (exit 0 all hold, 1 any fails, 3 configuration error)
    Test(super::policy_test::TestArgs),
    /// Propose allow entries from this repo's audit lines (default: its most recent session)
    /// and write them to .airlock.toml only with --yes; never records trust
    Learn(super::policy_learn::LearnArgs),
    /// Add an allow entry to the repo (default) or user layer, keeping the file's comments
    Allow(super::policy_edit::EditArgs),
    /// Add a block entry to the repo (default) or user layer, keeping the file's comments
    Deny(super::policy_edit::EditArgs),
    /// Write a commented starting policy for an agent (the repo's .airlock.toml, or --layer user)
    Init(super::policy_init::InitArgs),
}

#[derive(Debug, Args)]
pub struct RepoArgs {
    /// The repo directory (default: the git top level of the working directory)
    #[arg(long, value_name = "DIR")]
    pub repo: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TrustArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Trust the file even though some of its policy tests fail (a managed `require_tests`
    /// is not lifted)
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// host, host:port, [v6]:port, or an http(s) URL; the port defaults to 443
    // Hyphen values allowed so `-a.com` reaches the parser and is reported as malformed (exit 2).
    #[arg(allow_hyphen_values = true)]
    pub target: String,
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Print {"verdict","host","port","rule","layer","policy","reason"} on stdout (with
    /// --resolve also "answers": [{"addr","verdict","reason"}])
    #[arg(long)]
    pub json: bool,
    /// Also resolve the name on this host and run each answer through the proxy's address
    /// guard (exit 1 if any answer is refused, 4 if it does not resolve)
    #[arg(long)]
    pub resolve: bool,
    /// Decide with phase NAME in force ([phase.NAME.network] in place of each defining
    /// layer's [network] lists); an unknown phase is a configuration error (exit 3)
    #[arg(long, value_name = "NAME")]
    pub phase: Option<String>,
}

#[derive(Debug, Args)]
pub struct ShowArgs {
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Print the effective policy as JSON
    #[arg(long)]
    pub json: bool,
}

pub fn run(command: &PolicyCommand, ctx: &Context<'_>) -> i32 {
    match command {
        PolicyCommand::Check(args) => check(args, ctx),
        PolicyCommand::Show(args) => show(args, ctx),
        PolicyCommand::Trust(args) => trust_cmd(args, ctx),
        PolicyCommand::Test(args) => super::policy_test::run(args, ctx),
        PolicyCommand::Learn(args) => super::policy_learn::run(args, ctx),
        PolicyCommand::Allow(args) => super::policy_edit::run(args, EntryKind::Allow, ctx),
        PolicyCommand::Deny(args) => super::policy_edit::run(args, EntryKind::Block, ctx),
        PolicyCommand::Init(args) => super::policy_init::run(args, ctx),
    }
}

/// `policy check --json` output: exactly these keys, `null` where absent.
#[derive(Debug, Serialize)]
struct CheckJson {
    verdict: &'static str,
    host: String,
    port: Option<u16>,
    rule: Option<String>,
    layer: Option<&'static str>,
    policy: Option<String>,
    reason: Option<&'static str>,
    /// `--resolve` only: each answer and the address guard's verdict.
    #[serde(skip_serializing_if = "Option::is_none")]
    answers: Option<Vec<super::policy_resolve::AnswerJson>>,
    /// `--resolve` only: why the name did not resolve.
    #[serde(skip_serializing_if = "Option::is_none")]
    resolve_error: Option<String>,
    /// An allowed target that a `[gate]` entry holds for a person's decision.
    #[serde(skip_serializing_if = "Option::is_none")]
    gate: Option<GateJson>,
}

#[derive(Debug, Serialize)]
struct GateJson {
    rule: String,
    layer: &'static str,
    policy: String,
    severity: &'static str,
    /// `[gate] timeout` in force, in seconds.
    timeout_secs: u64,
}

/// The pieces every policy command needs.
struct Setup {
    paths: Paths,
    repo: Repo,
}

fn setup(repo: &RepoArgs, ctx: &Context<'_>) -> Result<Setup, String> {
    let paths = Paths::from_env(ctx.env).map_err(|e| e.to_string())?;
    let repo = Repo::resolve(repo.repo.as_deref(), &ctx.cwd).map_err(|e| e.to_string())?;
    Ok(Setup { paths, repo })
}

fn load(setup: &Setup) -> Result<Loaded, ConfigError> {
    let identity = config::load_identity(&setup.paths)?;
    config::load(&setup.paths, Some(&setup.repo), identity.as_ref())
}

fn config_error(e: &dyn std::fmt::Display) -> i32 {
    for line in e.to_string().lines() {
        eprintln!("airlock: {line}");
    }
    EXIT_CONFIG
}

/// Notes on stderr: a repo file that does not apply, and warnings of the applied files.
fn print_notes(loaded: &Loaded) {
    if let Some(file) = loaded.repo.as_ref().filter(|f| !f.trust.is_trusted()) {
        eprintln!("airlock: note: {}", file.trust.describe(&file.name, &file.repo_dir));
    }
    for w in loaded.warnings() {
        eprintln!("airlock: {w}");
    }
}

fn check(args: &CheckArgs, ctx: &Context<'_>) -> i32 {
    // The target first: a malformed target is malformed whatever the configuration says.
    let target = match parse_target(&args.target) {
        Ok(t) => t,
        Err(why) => {
            if args.json {
                print_json(&CheckJson {
                    verdict: "malformed",
                    host: args.target.clone(),
                    port: None,
                    rule: None,
                    layer: Some(LayerKind::None.as_str()),
                    policy: None,
                    reason: Some(Reason::Malformed.as_str()),
                    answers: None,
                    resolve_error: None,
                    gate: None,
                });
            }
            eprintln!("airlock: malformed target {:?}: {why}", args.target);
            return EXIT_MALFORMED;
        }
    };
    let port = target.port.unwrap_or(443);
    let setup = match setup(&args.repo, ctx) {
        Ok(s) => s,
        Err(e) => return config_error(&e),
    };
    let loaded = match load(&setup) {
        Ok(l) => l,
        Err(e) => return config_error(&e),
    };
    print_notes(&loaded);
    let built = match loaded.build_policy_in_phase(args.phase.as_deref()) {
        Ok(b) => b,
        Err(e) => return config_error(&e),
    };
    for w in built.cross_file_warnings() {
        eprintln!("airlock: warning: {w}");
    }
    // Pure: no interface addresses are read and no name is resolved.
    let decision = built.policy.decide(&target.host, port, &LocalAddrs::default());
    let authority = target.host.authority(port);
    let gate =
        decision.is_allowed().then(|| built.policy.gate(&target.host, port)).flatten().map(|g| {
            GateJson {
                rule: g.rule,
                layer: g.layer.as_str(),
                policy: g.policy,
                severity: g.severity.as_str(),
                timeout_secs: built.policy.gate_timeout().as_secs(),
            }
        });
    // Only an allowed target is resolved, as the proxy does: a refused name never is.
    let resolved = (args.resolve && decision.is_allowed()).then(|| {
        super::policy_resolve::resolve_and_judge(&built.policy, &target.host, port, ctx.env)
    });
    let (answers, resolve_error) = match &resolved {
        Some(Ok(a)) => (Some(a.clone()), None),
        Some(Err(e)) => (Some(Vec::new()), Some(e.clone())),
        None if args.resolve => (Some(Vec::new()), None),
        None => (None, None),
    };
    if args.json {
        print_json(&CheckJson {
            verdict: match decision.verdict {
                Verdict::Allow => "allow",
                Verdict::Deny => "deny",
            },
            host: target.host.to_string(),
            port: Some(port),
            rule: decision.rule.clone(),
            layer: Some(decision.layer.as_str()),
            policy: decision.policy.clone(),
            reason: Some(decision.reason.as_str()),
            answers: answers.clone(),
            resolve_error: resolve_error.clone(),
            gate,
        });
    } else {
        println!("{}", describe(&authority, &decision));
        if let Some(g) = &gate {
            println!(
                "  gated: held until a person approves it (`airlock gate`), by {:?} ({} layer, \
                 {}; {} severity; expires after {}s)",
                g.rule, g.layer, g.policy, g.severity, g.timeout_secs
            );
        }
        if args.resolve && !decision.is_allowed() {
            println!("  not resolved: the policy refuses the name before any lookup");
        }
        for a in answers.iter().flatten() {
            let why = if a.verdict == "allow" { String::new() } else { format!(" [{}]", a.reason) };
            println!("  answer {}: {}{why}", a.addr, a.verdict);
        }
    }
    if let Some(e) = &resolve_error {
        eprintln!("airlock: {e}");
        return super::policy_resolve::EXIT_RESOLVE_FAILED;
    }
    let refused = answers.iter().flatten().any(|a| a.verdict != "allow");
    let private: Vec<&str> = answers
        .iter()
        .flatten()
        .filter(|a| a.reason == Reason::PrivateAddress.as_str())
        .map(|a| a.addr.as_str())
        .collect();
    if !private.is_empty() {
        eprintln!(
            "airlock: the proxy would refuse {authority} (private_address); if it is meant to \
             reach {}, add them to [network] allow_private (docs/configuration.md)",
            private.join(", ")
        );
    }
    if decision.is_allowed() && !refused { EXIT_ALLOWED } else { EXIT_DENIED }
}

fn print_json(value: &impl Serialize) {
    match serde_json::to_string(value) {
        Ok(s) => println!("{s}"),
        // Serializing plain strings and numbers cannot fail; say so if it ever does.
        Err(e) => eprintln!("airlock: cannot encode JSON: {e}"),
    }
}

/// `allow api.anthropic.com:443 by rule "anthropic.com" (repo layer, /src/app/.airlock.toml)`
fn describe(authority: &str, d: &Decision) -> String {
    let verdict = match d.verdict {
        Verdict::Allow => "allow",
        Verdict::Deny => "deny",
    };
    let mut out = format!("{verdict} {authority}");
    if let Some(rule) = &d.rule {
        out.push_str(&format!(" by rule {rule:?} ({} layer", d.layer));
        if let Some(policy) = &d.policy {
            out.push_str(&format!(", {policy}"));
        }
        out.push(')');
    } else if let Some(policy) = &d.policy {
        out.push_str(&format!(" ({} layer, {policy})", d.layer));
    }
    if d.verdict == Verdict::Deny || d.rule.is_none() {
        out.push_str(&format!(": {} [{}]", explain(d.reason), d.reason));
    }
    out
}

fn explain(reason: Reason) -> &'static str {
    match reason {
        Reason::Allowed => "allowed (blocklist mode: no block entry matches)",
        Reason::NotAllowed => "no allow entry matches (allowlist mode denies anything unlisted)",
        Reason::Blocked => "a block entry matches (block wins over any allow)",
        Reason::ManagedNotAllowed => {
            "the managed layer has allow entries and none matches; it gates every request"
        }
        Reason::ReviewPlane => "a review-plane server; always blocked",
        Reason::IpNotAllowed => "an IP-literal target must match an allow entry",
        Reason::PrivateAddress => "a special-purpose address outside allow_private",
        Reason::BlockedAddress => "the address lies in a blocked CIDR",
        Reason::Malformed => "malformed target",
        _ => "refused",
    }
}

// ---------------------------------------------------------------------------------------------
// policy show

#[derive(Debug, Serialize)]
struct ShowJson {
    mode: &'static str,
    mode_source: ModeSource,
    overrides: Vec<String>,
    layers: Vec<LayerJson>,
    shadowed: Vec<String>,
    /// The evaluator's digest of the effective rules (what session records carry).
    digest: Option<String>,
    review_servers: Vec<config::ReviewServer>,
    /// `[terminal] clipboard` in force (managed and user layers only).
    terminal_clipboard: crate::sandbox::termfilter::Clipboard,
    warnings: Vec<String>,
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct ModeSource {
    layer: &'static str,
    policy: Option<String>,
    pinned: bool,
}

#[derive(Debug, Serialize)]
struct LayerJson {
    layer: &'static str,
    file: String,
    present: bool,
    applied: bool,
    trust: Option<trust::TrustState>,
    digest: Option<String>,
    mode: Option<&'static str>,
    allow: Vec<String>,
    block: Vec<String>,
    allow_private: Vec<String>,
    env_pass: Vec<String>,
    mcp: Vec<String>,
    review_servers: Vec<String>,
    /// `[gate]` targets, each with its severity (`api.stripe.com (high)`).
    gates: Vec<String>,
    /// `[phase.NAME.network]` blocks: `NAME: allow [...] block [...]`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    phases: Vec<String>,
    /// How many `[[test]]` tables the file holds (`airlock policy test` runs them).
    tests: usize,
    errors: Vec<String>,
}

/// The effective mode and where it came from: a managed `mode` pins; otherwise user beats repo.
fn mode_source(applied: &[&LayerDoc]) -> (Mode, ModeSource) {
    let by = |kind| applied.iter().find(|d| d.kind == kind && d.network.mode.is_some());
    // The evaluator's order (policy::eval): managed pins, then user, operator, repo.
    for kind in [LayerKind::Managed, LayerKind::User, LayerKind::Operator, LayerKind::Repo] {
        if let Some(d) = by(kind) {
            let mode = d.network.mode.unwrap_or_default();
            return (
                mode,
                ModeSource {
                    layer: kind.as_str(),
                    policy: Some(d.name.clone()),
                    pinned: kind == LayerKind::Managed,
                },
            );
        }
    }
    (Mode::default(), ModeSource { layer: "default", policy: None, pinned: false })
}

fn layer_json(kind: LayerKind, file: String, parsed: Option<&ParsedLayer>) -> LayerJson {
    let doc = parsed.map(|p| &p.doc);
    LayerJson {
        layer: kind.as_str(),
        file,
        present: parsed.is_some(),
        applied: parsed.is_some(),
        trust: None,
        digest: doc.map(|d| d.digest.clone()),
        mode: doc.and_then(|d| d.network.mode).map(Mode::as_str),
        allow: doc.map(|d| d.network.allow.clone()).unwrap_or_default(),
        block: doc.map(|d| d.network.block.clone()).unwrap_or_default(),
        allow_private: doc
            .map(|d| d.network.allow_private.iter().map(|n| n.to_string()).collect())
            .unwrap_or_default(),
        env_pass: doc.map(|d| d.env_pass.clone()).unwrap_or_default(),
        mcp: doc
            .map(|d| {
                d.mcp
                    .iter()
                    .map(|(server, creds)| {
                        let vars: Vec<&str> = creds.keys().map(String::as_str).collect();
                        format!("{server}: {}", vars.join(", "))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        review_servers: doc.map(|d| d.review_servers.clone()).unwrap_or_default(),
        gates: doc.map(gate_summary).unwrap_or_default(),
        phases: doc
            .map(|d| {
                d.phases
                    .iter()
                    .map(|(n, p)| {
                        format!(
                            "{n}: allow [{}] block [{}]",
                            p.allow.join(", "),
                            p.block.join(", ")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default(),
        tests: parsed.map_or(0, |p| p.tests.tests.len()),
        errors: Vec::new(),
    }
}

/// A layer's gated targets as `policy show` and the trust prompt list them.
fn gate_summary(doc: &LayerDoc) -> Vec<String> {
    let hosts = doc.gate.hosts.iter().map(|h| format!("{h} (medium)"));
    let rules = doc.gate.rules.iter().map(|r| format!("{} ({})", r.host, r.severity));
    let commands = doc.gate.commands.iter().map(|c| format!("command {c:?}"));
    hosts.chain(rules).chain(commands).collect()
}

fn repo_layer_json(file: &RepoFile) -> LayerJson {
    // An untrusted file is parsed here only to show it; its errors never cause exit 3.
    let (parsed, errors) = match &file.parsed {
        Some(p) => (Some(p.clone()), Vec::new()),
        None => match file.parse() {
            Ok(p) => (Some(p), Vec::new()),
            Err(e) => (None, e.to_string().lines().map(str::to_owned).collect()),
        },
    };
    let mut json = layer_json(LayerKind::Repo, file.name.clone(), parsed.as_ref());
    json.present = true;
    json.applied = file.trust.is_trusted();
    json.trust = Some(file.trust.clone());
    json.digest = Some(file.digest.clone());
    json.errors = errors;
    json
}

fn show(args: &ShowArgs, ctx: &Context<'_>) -> i32 {
    let setup = match setup(&args.repo, ctx) {
        Ok(s) => s,
        Err(e) => return config_error(&e),
    };
    let loaded = match load(&setup) {
        Ok(l) => l,
        Err(e) => return config_error(&e),
    };
    let paths = &setup.paths;
    let applied = loaded.applied();
    let (mode, source) = mode_source(&applied);
    let built = loaded.build_policy();
    let mut layers = vec![
        layer_json(
            LayerKind::Managed,
            config::display_path(paths, paths.managed_policy()),
            loaded.managed.as_ref(),
        ),
        layer_json(
            LayerKind::User,
            config::display_path(paths, &paths.user_config()),
            loaded.user.as_ref(),
        ),
    ];
    match &loaded.repo {
        Some(file) => layers.push(repo_layer_json(file)),
        None => {
            let name = config::display_path(paths, &setup.repo.config_file());
            layers.push(layer_json(LayerKind::Repo, name, None));
        }
    }
    let mut warnings: Vec<String> = loaded.warnings().iter().map(|w| w.to_string()).collect();
    let (shadowed, digest, error) = match &built {
        Ok(b) => {
            warnings.extend(b.cross_file_warnings().map(|w| format!("warning: {w}")));
            (shadowed_lines(&b.policy), Some(b.policy.digest()), None)
        }
        Err(e) => (Vec::new(), None, Some(e.to_string())),
    };
    let report = ShowJson {
        mode: mode.as_str(),
        mode_source: source,
        overrides: paths.overrides.clone(),
        layers,
        shadowed,
        digest,
        review_servers: loaded.review_servers.clone(),
        terminal_clipboard: config::terminal_policy(&applied).clipboard,
        warnings,
        error,
    };
    // Loud on purpose, in both output forms: a test hook changes which policy applies.
    for o in &report.overrides {
        eprintln!("airlock: !!! TEST OVERRIDE IN FORCE: {o} !!!");
    }
    if let Some(file) = loaded.repo.as_ref().filter(|f| !f.trust.is_trusted()) {
        eprintln!("airlock: note: {}", file.trust.describe(&file.name, &file.repo_dir));
        // What trusting it would change, so the review needs no other command.
        if let Ok(parsed) = file.parse() {
            let review = config::review::for_repo_file(paths, &setup.repo, file, &parsed);
            eprint!("{}", review.render());
        }
    }
    if args.json {
        print_json(&report);
    } else {
        print_show(&report);
    }
    if let Some(e) = &report.error {
        for line in e.lines() {
            eprintln!("airlock: {line}");
        }
    }
    if report.error.is_some() { EXIT_CONFIG } else { 0 }
}

fn shadowed_lines(policy: &crate::policy::Policy) -> Vec<String> {
    let mut lines: Vec<String> = policy
        .shadowed()
        .into_iter()
        .map(|(kind, entry)| format!("{entry} ({kind} layer)"))
        .collect();
    // A duplicated entry is shadowed once (the duplicate has its own warning).
    lines.dedup();
    lines
}

fn print_show(r: &ShowJson) {
    for o in &r.overrides {
        println!("!!! TEST OVERRIDE IN FORCE: {o} !!!");
    }
    let src = match &r.mode_source.policy {
        Some(p) if r.mode_source.pinned => format!("pinned by the managed layer, {p}"),
        Some(p) => format!("from the {} layer, {p}", r.mode_source.layer),
        None => "default".to_owned(),
    };
    println!("mode: {} ({src})", r.mode);
    let clipboard = match r.terminal_clipboard {
        crate::sandbox::termfilter::Clipboard::Allow => "allow (agents may set your clipboard)",
        crate::sandbox::termfilter::Clipboard::Deny => "deny",
    };
    println!("terminal clipboard: {clipboard}");
    for l in &r.layers {
        let state = match (&l.trust, l.present) {
            (_, false) if l.errors.is_empty() => "absent".to_owned(),
            (Some(t), _) if !t.is_trusted() => "UNTRUSTED, not applied".to_owned(),
            (Some(_), _) => "trusted, applied".to_owned(),
            (None, _) => "applied".to_owned(),
        };
        println!();
        println!("{} layer: {} ({state})", l.layer, l.file);
        if let Some(d) = &l.digest {
            println!("  sha256: {d}");
        }
        if let Some(m) = l.mode {
            println!("  mode: {m}");
        }
        let lists: [(&str, &Vec<String>); 8] = [
            ("allow", &l.allow),
            ("block", &l.block),
            ("allow_private", &l.allow_private),
            ("gates", &l.gates),
            ("phases", &l.phases),
            ("env pass", &l.env_pass),
            ("mcp", &l.mcp),
            ("review servers", &l.review_servers),
        ];
        for (label, items) in lists {
            if !items.is_empty() {
                println!("  {label}: {}", items.join(", "));
            }
        }
        if l.tests > 0 {
            println!("  policy tests: {} (`airlock policy test` runs them)", l.tests);
        }
        for e in &l.errors {
            println!("  error: {e}");
        }
    }
    if let Some(d) = &r.digest {
        println!();
        println!("effective policy sha256: {d}");
    }
    if !r.review_servers.is_empty() {
        println!();
        println!("review-plane servers (always blocked):");
        for s in &r.review_servers {
            println!("  {} ({} layer, {})", s.server, s.layer, s.policy);
        }
    }
    if !r.shadowed.is_empty() {
        println!();
        println!("shadowed by the managed layer (no effect):");
        for s in &r.shadowed {
            println!("  {s}");
        }
    }
    if !r.warnings.is_empty() {
        println!();
        println!("warnings:");
        for w in &r.warnings {
            println!("  {w}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// policy trust

/// Records the repo's git pointers (worktree/submodule `gitdir:`, `commondir`, alternates,
/// `config.worktree`) as they are now, after judging each (SECURITY §7); how many.
fn record_git_pointers(setup: &Setup, ctx: &Context<'_>) -> Result<usize, i32> {
    use crate::sandbox::gitptr;
    let rules = crate::hostpath::HostPathRules::for_user(&setup.paths, ctx.env);
    let found = gitptr::discover(&setup.repo.path, &rules).map_err(|e| config_error(&e))?;
    let problems = gitptr::judge(&found, &setup.repo.path);
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("airlock: {p}");
        }
        eprintln!("airlock: refusing to trust: fix or remove the git pointers above first");
        return Err(EXIT_CONFIG);
    }
    let record = gitptr::write_record(&setup.paths, &setup.repo, &found.pointers)
        .map_err(|e| config_error(&e))?;
    for p in &found.pointers {
        match &p.target {
            Some(t) => println!("recorded git pointer {} → {}", p.file.display(), t.display()),
            None => println!("recorded git pointer {} ({})", p.file.display(), p.digest),
        }
    }
    if !found.pointers.is_empty() {
        println!("git pointers recorded in {}", config::display_path(&setup.paths, &record));
    }
    Ok(found.pointers.len())
}

fn trust_cmd(args: &TrustArgs, ctx: &Context<'_>) -> i32 {
    let setup = match setup(&args.repo, ctx) {
        Ok(s) => s,
        Err(e) => return config_error(&e),
    };
    let pointers = match record_git_pointers(&setup, ctx) {
        Ok(n) => n,
        Err(code) => return code,
    };
    let file = match config::load_repo_file(&setup.paths, &setup.repo) {
        Ok(Some(f)) => f,
        Ok(None) if pointers > 0 => return 0,
        Ok(None) => {
            eprintln!(
                "airlock: there is no {} to trust (and no git pointers to record); create it \
                 (see docs/configuration.md)",
                setup.repo.config_file().display()
            );
            return EXIT_CONFIG;
        }
        Err(e) => return config_error(&e),
    };
    let parsed = match file.parse() {
        Ok(p) => p,
        Err(e) => {
            config_error(&e);
            eprintln!("airlock: refusing to trust {}: fix the errors above first", file.name);
            return EXIT_CONFIG;
        }
    };
    for w in &parsed.warnings {
        eprintln!("airlock: {w}");
    }
    if file.trust.is_trusted() {
        println!("{} is already trusted (sha256 {})", file.name, file.digest);
        return 0;
    }
    match super::policy_test::before_trust(&setup.paths, &setup.repo, &parsed, args.force) {
        Ok(0) => {}
        Ok(n) => println!("policy tests: {n} run (`airlock policy test` lists them)"),
        Err(e) => {
            for line in e.lines() {
                eprintln!("airlock: {line}");
            }
            return EXIT_DENIED;
        }
    }
    if let trust::TrustState::Changed { trusted_at, .. } = &file.trust {
        println!(
            "{} changed since it was trusted ({trusted_at}); trusting the new content",
            file.name
        );
    }
    let review = config::review::for_repo_file(&setup.paths, &setup.repo, &file, &parsed);
    print!("{}", review.render());
    println!("trusting {} (sha256 {}):", file.name, file.digest);
    let doc = &parsed.doc;
    if let Some(mode) = doc.network.mode {
        println!("  mode: {}", mode.as_str());
    }
    let nets: Vec<String> = doc.network.allow_private.iter().map(|n| n.to_string()).collect();
    let mcp: Vec<String> = doc
        .mcp
        .iter()
        .map(|(server, creds)| {
            let vars: Vec<String> = creds
                .iter()
                .map(|(k, v)| match v {
                    config::Credential::FromEnv { from_env } => format!("{k} from ${from_env}"),
                    config::Credential::Value(_) => format!("{k} (literal value)"),
                })
                .collect();
            format!("{server} [{}]", vars.join(", "))
        })
        .collect();
    let gates = gate_summary(doc);
    for (label, items) in [
        ("allow", &doc.network.allow),
        ("block", &doc.network.block),
        ("allow_private", &nets),
        ("gates", &gates),
        ("env pass", &doc.env_pass),
        ("mcp", &mcp),
    ] {
        if !items.is_empty() {
            println!("  {label}: {}", items.join(", "));
        }
    }
    match trust::trust_content(&setup.paths, &setup.repo, &file.bytes) {
        Ok(_) => {
            let record = trust::record_path(&setup.paths, &setup.repo);
            println!("trusted; recorded in {}", config::display_path(&setup.paths, &record));
            0
        }
        Err(e) => config_error(&e),
    }
}
