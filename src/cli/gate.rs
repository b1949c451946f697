//! `airlock gate list|show|approve|deny|watch`: a person decides the attempts held for a
//! `[gate]` (docs/gates.md). Each decision is bound to the digest of the exact action shown,
//! and is single-use: the next attempt asks again.
//!
//! Logged in to a review server (`airlock login --server`), these commands talk to the
//! server's gate queue with the login's token ([`server`]): a reviewer decides anyone's gates,
//! under the server's rules (no self-approval, step-up for `high`). Otherwise (or with
//! `--local`) they talk to this machine's airlockd: the decider is the only person there is,
//! the requester, so every decision is a self-decision and is recorded `"self": true`.

use std::io::{BufRead, IsTerminal, Write};
use std::time::{Duration, SystemTime};

use crate::client::{ClientError, Endpoint};
use crate::protocol::{ErrorCode, GateDecision, GateInfo, GateState};

use super::Context;

mod server;

/// `airlock gate [--local] COMMAND`.
#[derive(Debug, clap::Args)]
pub struct GateArgs {
    /// Talk to this machine's airlockd even when logged in to a review server (its relayed
    /// sessions' gates are decided on the server only)
    #[arg(long, global = true)]
    pub local: bool,
    #[command(subcommand)]
    pub command: GateCommand,
}

#[derive(Debug, clap::Subcommand)]
pub enum GateCommand {
    /// List the attempts waiting for a decision, oldest first
    List {
        /// One JSON object with `gates` (docs/gates.md has the fields).
        #[arg(long)]
        json: bool,
    },
    /// Show one gate: who asked, the exact action and its digest
    Show {
        id: String,
        #[arg(long)]
        json: bool,
    },
    /// Let one held attempt proceed, once
    Approve(DecideArgs),
    /// Refuse one held attempt (the agent gets 403 gate_denied)
    Deny(DecideArgs),
    /// Show gates as they arrive and decide them (on a terminal); `--json` prints each
    Watch {
        /// Print each new gate as one JSON line and never prompt.
        #[arg(long)]
        json: bool,
        /// Only show gates, never prompt (the default when stdin is not a terminal).
        #[arg(long)]
        no_prompt: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct DecideArgs {
    pub id: String,
    /// Why (kept with the decision in the audit log and on the server; at most 500 bytes).
    #[arg(long, default_value = "")]
    pub note: String,
    /// Decide only if the gate's action has this digest (`sha256:…`, as `gate show` prints).
    #[arg(long)]
    pub digest: Option<String>,
    /// Review server, a `high` gate: read your console password from stdin (step-up).
    #[arg(long)]
    pub password_stdin: bool,
    /// Review server, an admin's own gate: decide it anyway (recorded as a self-approval).
    #[arg(long = "override")]
    pub override_self: bool,
}

/// A gate that is not (or no longer) pending.
pub const EXIT_UNKNOWN: i32 = 1;

pub fn run(args: &GateArgs, ctx: &Context<'_>) -> i32 {
    if !args.local
        && let Some(client) = server::login(ctx)
    {
        return match client {
            Ok(client) => server::run(&args.command, ctx, &client),
            Err(code) => code,
        };
    }
    let cmd = &args.command;
    if let GateCommand::Approve(a) | GateCommand::Deny(a) = cmd
        && (a.password_stdin || a.override_self)
    {
        eprintln!(
            "airlock: --password-stdin and --override are for a review server's gates; this \
             machine's gates are decided without them"
        );
        return EXIT_UNKNOWN;
    }
    let result = match cmd {
        GateCommand::List { json } => list(ctx, *json),
        GateCommand::Show { id, json } => show(ctx, id, *json),
        GateCommand::Approve(args) => decide(ctx, args, true),
        GateCommand::Deny(args) => decide(ctx, args, false),
        GateCommand::Watch { json, no_prompt } => watch(ctx, *json, *no_prompt),
    };
    exit_code(result)
}

/// What went wrong in a gate command, on this machine's airlockd or on the review server.
enum Failure {
    Client(ClientError),
    Remote(crate::remote::RemoteError),
    Usage(String),
    Io(std::io::Error),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Self::Client(e)
    }
}

impl From<crate::remote::RemoteError> for Failure {
    fn from(e: crate::remote::RemoteError) -> Self {
        Self::Remote(e)
    }
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// Prints a failure and gives the exit code: 1 for a gate that could not be decided as asked
/// (not pending, another digest, refused), 125 when airlockd or the server could not be asked.
fn exit_code(result: Result<i32, Failure>) -> i32 {
    match result {
        Ok(code) => code,
        Err(Failure::Client(e)) => {
            eprintln!("airlock: {e}");
            match e {
                ClientError::Refused {
                    code: ErrorCode::UnknownGate | ErrorCode::GateDigest | ErrorCode::GateRelayed,
                    ..
                } => EXIT_UNKNOWN,
                e => e.exit_code(),
            }
        }
        Err(Failure::Remote(e)) => {
            eprintln!("airlock: {e}");
            server::exit_of(&e)
        }
        Err(Failure::Usage(msg)) => {
            eprintln!("airlock: {msg}");
            EXIT_UNKNOWN
        }
        Err(Failure::Io(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(Failure::Io(e)) => {
            eprintln!("airlock: cannot write the output: {e}");
            125
        }
    }
}

fn pending(ctx: &Context<'_>) -> Result<Vec<GateInfo>, Failure> {
    let mut client = Endpoint::resolve(ctx.env).connect()?;
    Ok(client.gate_list(None, None)?.1)
}

fn list(ctx: &Context<'_>, json: bool) -> Result<i32, Failure> {
    let gates = pending(ctx)?;
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, &serde_json::json!({ "gates": gates }))
            .map_err(std::io::Error::other)?;
        writeln!(out)?;
        return Ok(0);
    }
    if gates.is_empty() {
        writeln!(out, "no attempt is waiting for a gate decision")?;
        return Ok(0);
    }
    writeln!(out, "{:<22} {:<7} {:>6}  {:<24} TARGET", "ID", "SEVERITY", "LEFT", "REPO")?;
    for g in &gates {
        writeln!(
            out,
            "{:<22} {:<7} {:>6}  {:<24} {}",
            g.id,
            g.severity,
            left(&g.deadline),
            truncate(&g.repo, 24),
            target(g)
        )?;
    }
    Ok(0)
}

fn find(ctx: &Context<'_>, id: &str) -> Result<GateInfo, Failure> {
    pending(ctx)?.into_iter().find(|g| g.id == id).ok_or_else(|| {
        Failure::Usage(format!(
            "no pending gate {id}: it was decided, expired or abandoned already \
             (`airlock gate list` shows the pending ones)"
        ))
    })
}

fn show(ctx: &Context<'_>, id: &str, json: bool) -> Result<i32, Failure> {
    let g = find(ctx, id)?;
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, &g).map_err(std::io::Error::other)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", describe(&g))?;
    }
    Ok(0)
}

/// The full description a decider reads before deciding.
fn describe(g: &GateInfo) -> String {
    let mut s = format!(
        "gate {}  ({} severity, expires in {})\n  action:   {}\n",
        g.id,
        g.severity,
        left(&g.deadline),
        target(g)
    );
    if let Some(r) = &g.request {
        let label = if g.kind == "tool" { "command:" } else { "request: " };
        s.push_str(&format!("  {label} {}\n", printable(r)));
    }
    s.push_str(&format!(
        "  session:  {}\n  repo:     {}{}\n  rule:     {:?} in {} ({})\n  asked at: {}\n  digest:   {}\n  \
         canonical action: {}\n",
        g.session,
        g.repo,
        g.repo_key.as_deref().map(|k| format!(" ({k})")).unwrap_or_default(),
        g.rule,
        g.policy,
        g.layer,
        g.requested_at,
        g.digest,
        // The agent chose parts of it; serde_json leaves DEL, C1 and bidi controls as they are.
        printable(&g.action)
    ));
    if let Some(server) = &g.relay {
        s.push_str(&format!(
            "  decided on the review server {server} (its /gates page, or `airlock gate` \
             logged in there); not here\n"
        ));
    }
    s
}

/// Who decides: the identity's email, else the local user name.
fn decider(ctx: &Context<'_>) -> String {
    let identity = crate::paths::Paths::from_env(ctx.env)
        .ok()
        .and_then(|p| crate::config::identity::read(&p.identity_file()).ok().flatten());
    match identity {
        Some(i) => i.email,
        None => {
            let user = ctx.env.var("USER").or_else(|| ctx.env.var("LOGNAME"));
            let uid = nix::unistd::getuid().as_raw();
            format!("local:{}", user.unwrap_or_else(|| format!("uid {uid}")))
        }
    }
}

fn decide(ctx: &Context<'_>, args: &DecideArgs, approve: bool) -> Result<i32, Failure> {
    let g = find(ctx, &args.id)?;
    if let Some(d) = &args.digest
        && *d != g.digest
    {
        return Err(Failure::Usage(format!(
            "gate {} holds action {}, not {d}: nothing was decided; look at it again with \
             `airlock gate show {}`",
            g.id, g.digest, g.id
        )));
    }
    let (state, self_decided) = send_decision(ctx, &g, approve, &args.note)?;
    println!("{}", decided_line(&g, state, self_decided));
    Ok(0)
}

fn send_decision(
    ctx: &Context<'_>,
    g: &GateInfo,
    approve: bool,
    note: &str,
) -> Result<(GateState, bool), Failure> {
    let mut client = Endpoint::resolve(ctx.env).connect()?;
    let decision = GateDecision {
        id: g.id.clone(),
        digest: g.digest.clone(),
        approve,
        note: note.to_owned(),
        by: decider(ctx),
        relay: None,
    };
    Ok(client.gate_decide(decision)?)
}

fn decided_line(g: &GateInfo, state: GateState, self_decided: bool) -> String {
    let mark = if self_decided { " (a self-decision: you asked and you decided)" } else { "" };
    format!("{} {}: {}{mark}", state.as_str(), g.id, target(g))
}

fn watch(ctx: &Context<'_>, json: bool, no_prompt: bool) -> Result<i32, Failure> {
    let prompt = !json && !no_prompt && std::io::stdin().is_terminal();
    let mut client = Endpoint::resolve(ctx.env).connect()?;
    let (mut version, mut gates) = client.gate_list(None, None)?;
    let mut seen = std::collections::BTreeSet::new();
    if !json {
        eprintln!("airlock: watching for gate requests (Ctrl-C to stop)");
    }
    loop {
        for g in &gates {
            if !seen.insert(g.id.clone()) {
                continue;
            }
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer(&mut out, g).map_err(std::io::Error::other)?;
                writeln!(out)?;
                out.flush()?;
                continue;
            }
            write!(out, "\n{}", describe(g))?;
            out.flush()?;
            drop(out);
            if prompt {
                prompt_and_decide(ctx, g)?;
            }
        }
        let live: std::collections::BTreeSet<_> = gates.iter().map(|g| g.id.clone()).collect();
        seen.retain(|id| live.contains(id));
        (version, gates) =
            client.gate_list(Some(version), Some(crate::protocol::MAX_GATE_WAIT_MS))?;
    }
}

/// `gate watch`'s question on a terminal: `Some((approve, note))`, or `None` to skip the gate
/// (an empty answer, `s`, or the end of input).
fn ask_decision(id: &str) -> std::io::Result<Option<(bool, String)>> {
    let stdin = std::io::stdin();
    let approve = loop {
        eprint!("approve, deny or skip {id}? [a/d/s] ");
        let mut answer = String::new();
        if stdin.lock().read_line(&mut answer)? == 0 {
            return Ok(None);
        }
        match answer.trim() {
            "a" | "approve" | "y" | "yes" => break true,
            "d" | "deny" | "n" | "no" => break false,
            "s" | "skip" | "" => return Ok(None),
            _ => continue,
        }
    };
    eprint!("note (optional): ");
    let mut note = String::new();
    stdin.lock().read_line(&mut note)?;
    Ok(Some((approve, note.trim().to_owned())))
}

fn prompt_and_decide(ctx: &Context<'_>, g: &GateInfo) -> Result<(), Failure> {
    let Some((approve, note)) = ask_decision(&g.id)? else { return Ok(()) };
    match send_decision(ctx, g, approve, &note) {
        Ok((state, self_decided)) => println!("{}", decided_line(g, state, self_decided)),
        Err(Failure::Client(e @ ClientError::Refused { .. })) => eprintln!("airlock: {e}"),
        Err(e) => return Err(e),
    }
    Ok(())
}

/// The held attempt as airlockd names it (a tool gate too: its tool at `gate.airlock`).
pub(crate) fn target(g: &GateInfo) -> String {
    crate::gate::target_text("egress", Some(&g.method), Some(&g.host), Some(g.port), None)
}

/// Time left until `deadline` (RFC 3339), `expired` once past, `?` if it does not parse.
pub(super) fn left(deadline: &str) -> String {
    let Some(at) = crate::publish::envelope::parse_ts(deadline) else {
        return "?".into();
    };
    let now = time::OffsetDateTime::from(SystemTime::now());
    let secs = (at - now).whole_seconds();
    if secs <= 0 {
        return "expired".into();
    }
    let d = Duration::from_secs(secs.unsigned_abs());
    if d.as_secs() >= 60 {
        format!("{}m{:02}s", d.as_secs() / 60, d.as_secs() % 60)
    } else {
        format!("{}s", d.as_secs())
    }
}

pub(super) fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        return s.to_owned();
    }
    let mut t: String = s.chars().take(n.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// The agent chose the host and the request line: nothing in them reaches the terminal raw.
pub(super) fn printable(s: &str) -> String {
    crate::audit::escape_for_terminal(s).into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn gate() -> GateInfo {
        GateInfo {
            id: "g000001-abcdef012345".into(),
            kind: "egress".into(),
            session: "s1".into(),
            repo: "app".into(),
            repo_key: Some("app-0123abcd".into()),
            user_id: None,
            method: "GET".into(),
            host: "pay.test".into(),
            port: 80,
            request: Some("GET http://pay.test/\u{1b}[31m HTTP/1.1".into()),
            action: "{}".into(),
            digest: "sha256:00".into(),
            severity: "high".into(),
            rule: "pay.test".into(),
            layer: "repo".into(),
            policy: "/src/app/.airlock.toml".into(),
            requested_at: "2026-12-04T10:00:00.000Z".into(),
            deadline: "2000-01-01T00:00:00.000Z".into(),
            relay: None,
        }
    }

    #[test]
    fn a_description_names_everything_decided_and_escapes_the_agents_text() {
        let d = describe(&gate());
        for part in ["GET pay.test:80", "sha256:00", "high severity", "expired", "app-0123abcd"] {
            assert!(d.contains(part), "{part} missing in {d}");
        }
        assert!(!d.contains('\u{1b}'), "{d}");
    }

    #[test]
    fn ipv6_targets_are_bracketed_and_self_decisions_say_so() {
        let mut g = gate();
        g.host = "2001:db8::1".into();
        g.method = "CONNECT".into();
        g.port = 443;
        assert_eq!(target(&g), "CONNECT [2001:db8::1]:443");
        let line = decided_line(&g, GateState::Approved, true);
        assert!(line.starts_with("approved g000001-") && line.contains("self-decision"), "{line}");
        assert_eq!(left("not a time"), "?");
    }
}
