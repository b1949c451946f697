//! `airlock gate` against the review server's gate queue (docs/gates.md "With a review
//! server"; docs/api.md "Gates"): the login's token, never airlockd. What the server refuses
//! (not a reviewer, one's own gate, step-up, decided already, another digest) exits 1 with the
//! server's words; a server that cannot be reached exits 125.

use std::collections::BTreeSet;
use std::io::{IsTerminal, Read, Write};
use std::time::Duration;

use serde_json::{Value, json};
use zeroize::Zeroizing;

use super::{DecideArgs, EXIT_UNKNOWN, Failure, GateCommand, left, printable, truncate};
use crate::cli::Context;
use crate::remote::gates::ServerGate;
use crate::remote::{self, RemoteError};

/// The server could not be asked (unreachable, TLS, a broken answer).
const EXIT_UNREACHABLE: i32 = 125;
/// How often `watch` asks the server for new gates.
const WATCH_EVERY: Duration = Duration::from_secs(2);

/// The review-server client when the identity names a server (`None`: decide locally); an
/// unusable login is an error (exit code), never a silent fall-back to local decisions.
pub(super) fn login(ctx: &Context<'_>) -> Option<Result<remote::Client, i32>> {
    let paths = crate::paths::Paths::from_env(ctx.env).ok()?;
    let identity = crate::config::identity::read(&paths.identity_file()).ok().flatten()?;
    let server = identity.server?;
    Some(remote::Client::from_login(&paths).map_err(|e| {
        eprintln!(
            "airlock: you are logged in to the review server {server}, which decides gates, but \
             the login cannot be used: {e}; `airlock gate --local` talks to this machine's airlockd"
        );
        EXIT_UNREACHABLE
    }))
}

pub(super) fn run(cmd: &GateCommand, ctx: &Context<'_>, client: &remote::Client) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("airlock: cannot start the runtime: {e}");
            return EXIT_UNREACHABLE;
        }
    };
    let _ = ctx;
    let result = rt.block_on(async {
        match cmd {
            GateCommand::List { json } => list(client, *json).await,
            GateCommand::Show { id, json } => show(client, id, *json).await,
            GateCommand::Approve(a) => decide(client, a, "approve").await,
            GateCommand::Deny(a) => decide(client, a, "deny").await,
            GateCommand::Watch { json, no_prompt } => watch(client, *json, *no_prompt).await,
        }
    });
    super::exit_code(result)
}

/// A refusal the server gave (4xx but 401 and 429) is the caller's: 1; the rest: 125.
pub(super) fn exit_of(e: &RemoteError) -> i32 {
    match e {
        RemoteError::Status { status, .. } if (400..500).contains(status) => EXIT_UNKNOWN,
        _ => EXIT_UNREACHABLE,
    }
}

async fn list(client: &remote::Client, json: bool) -> Result<i32, Failure> {
    let gates = client.pending_gates().await?;
    let mut out = std::io::stdout().lock();
    if json {
        let raw: Vec<&Value> = gates.iter().map(|(_, raw)| raw).collect();
        serde_json::to_writer_pretty(&mut out, &json!({"server": client.server(), "gates": raw}))
            .map_err(std::io::Error::other)?;
        writeln!(out)?;
        return Ok(0);
    }
    if gates.is_empty() {
        writeln!(out, "no gate is waiting for a decision on {}", client.server())?;
        return Ok(0);
    }
    writeln!(out, "{:<35} {:<7} {:>6}  {:<28} TARGET", "ID", "SEVERITY", "LEFT", "ASKED BY")?;
    for (g, _) in &gates {
        writeln!(
            out,
            "{:<35} {:<7} {:>6}  {:<28} {}",
            g.id,
            g.severity,
            left(&g.deadline),
            truncate(&printable(&g.user_email), 28),
            printable(&truncate(&g.target(), 120))
        )?;
    }
    Ok(0)
}

async fn show(client: &remote::Client, id: &str, json: bool) -> Result<i32, Failure> {
    let (g, raw) = client.gate(id, 0).await?;
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, &raw).map_err(std::io::Error::other)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", describe(&g, client.server()))?;
    }
    Ok(0)
}

/// What a reviewer reads before deciding. Everything the requester's agent chose is escaped.
fn describe(g: &ServerGate, server: &str) -> String {
    let when = if g.is_pending() {
        format!("pending, expires in {}", left(&g.deadline))
    } else {
        g.state.clone()
    };
    let mut s = format!(
        "gate {}  ({} severity, {when}) on {server}\n  action:   {}\n",
        g.id,
        g.severity,
        printable(&g.target())
    );
    if let Some(r) = g.request.as_ref().filter(|_| g.kind == "egress") {
        s.push_str(&format!("  request:  {}\n", printable(r)));
    }
    s.push_str(&format!("  asked by: {}\n", printable(&g.user_email)));
    if let Some(session) = &g.session {
        s.push_str(&format!("  session:  {}\n", printable(session)));
    }
    if let Some(repo) = &g.repo {
        s.push_str(&format!("  repo:     {}\n", printable(repo)));
    }
    if let Some(rule) = &g.rule {
        s.push_str(&format!(
            "  rule:     {:?} in {} ({})\n",
            printable(rule),
            printable(g.policy.as_deref().unwrap_or("?")),
            printable(g.layer.as_deref().unwrap_or("?"))
        ));
    }
    s.push_str(&format!(
        "  asked at: {}\n  digest:   {}\n  canonical action: {}\n",
        g.requested_at,
        g.digest,
        printable(&g.action)
    ));
    if let Some(d) = &g.decision {
        let by = d.by_email.as_deref().unwrap_or("the server (deadline)");
        let marks = [(d.self_decided, " (self)"), (d.step_up, " (password re-entered)")]
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, m)| *m)
            .collect::<String>();
        s.push_str(&format!("  decision: {} by {}{marks} at {}", d.state, printable(by), d.at));
        if let Some(n) = &d.note {
            s.push_str(&format!(": {}", printable(n)));
        }
        s.push('\n');
    }
    s
}

/// Reads a password piped to stdin (one trailing newline dropped).
fn password_from_stdin() -> Result<Zeroizing<String>, Failure> {
    let mut pw = Zeroizing::new(String::new());
    std::io::stdin()
        .take(64 * 1024)
        .read_to_string(&mut pw)
        .map_err(|e| Failure::Usage(format!("cannot read the password from stdin: {e}")))?;
    let trimmed = pw.strip_suffix('\n').map(|p| p.strip_suffix('\r').unwrap_or(p));
    let pw = Zeroizing::new(trimmed.unwrap_or(&pw).to_owned());
    if pw.is_empty() {
        return Err(Failure::Usage("--password-stdin read an empty password".into()));
    }
    Ok(pw)
}

async fn decide(client: &remote::Client, args: &DecideArgs, action: &str) -> Result<i32, Failure> {
    let password = if args.password_stdin { Some(password_from_stdin()?) } else { None };
    let (g, _) = client.gate(&args.id, 0).await?;
    if !g.is_pending() {
        return Err(Failure::Usage(format!(
            "gate {} is {} already: nothing was decided",
            g.id, g.state
        )));
    }
    if let Some(d) = &args.digest
        && *d != g.digest
    {
        return Err(Failure::Usage(format!(
            "gate {} holds action {}, not {d}: nothing was decided; look at it again with \
             `airlock gate show {}`",
            g.id, g.digest, g.id
        )));
    }
    let pw = password.as_deref().map(String::as_str);
    let done = send(client, &g, action, &args.note, pw, args.override_self).await?;
    println!("{}", decided_line(&done));
    Ok(0)
}

/// Posts one decision bound to `g`'s digest.
async fn send(
    client: &remote::Client,
    g: &ServerGate,
    action: &str,
    note: &str,
    password: Option<&str>,
    override_self: bool,
) -> Result<ServerGate, Failure> {
    let mut body = json!({"action": action, "digest": g.digest});
    if !note.is_empty() {
        body["note"] = json!(note);
    }
    if let Some(pw) = password {
        body["password"] = json!(pw);
    }
    if override_self {
        body["override"] = json!(true);
    }
    let sent = client.decide_gate(&g.id, &body).await;
    // The body held the password: wiped before anything else happens.
    if let Some(Value::String(pw)) = body.get_mut("password") {
        zeroize::Zeroize::zeroize(pw);
    }
    match sent {
        Ok(done) => Ok(done),
        Err(RemoteError::Status { status: 403, reason: Some(r), .. })
            if r == "step_up_required" =>
        {
            Err(Failure::Usage(format!(
                "gate {} is high severity: a decision needs your console password again; run \
                 `airlock gate {action} {} --password-stdin` with it on stdin, or decide in the \
                 console ({}/gates)",
                g.id,
                g.id,
                client.server()
            )))
        }
        Err(e) => Err(Failure::Remote(e)),
    }
}

fn decided_line(g: &ServerGate) -> String {
    let d = g.decision.as_ref();
    let mark = match d {
        Some(d) if d.self_decided => " (a self-decision: recorded as such)",
        _ => "",
    };
    format!(
        "{} {}: {} (asked by {}){mark}",
        g.state,
        g.id,
        printable(&g.target()),
        printable(&g.user_email)
    )
}

async fn watch(client: &remote::Client, json: bool, no_prompt: bool) -> Result<i32, Failure> {
    let prompt = !json && !no_prompt && std::io::stdin().is_terminal();
    let mut seen = BTreeSet::new();
    if !json {
        eprintln!("airlock: watching {} for gate requests (Ctrl-C to stop)", client.server());
    }
    loop {
        let gates = client.pending_gates().await?;
        for (g, raw) in &gates {
            if !seen.insert(g.id.clone()) {
                continue;
            }
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer(&mut out, raw).map_err(std::io::Error::other)?;
                writeln!(out)?;
                out.flush()?;
                continue;
            }
            write!(out, "\n{}", describe(g, client.server()))?;
            out.flush()?;
            drop(out);
            if prompt {
                prompt_and_decide(client, g).await?;
            }
        }
        seen.retain(|id| gates.iter().any(|(g, _)| &g.id == id));
        tokio::time::sleep(WATCH_EVERY).await;
    }
}

async fn prompt_and_decide(client: &remote::Client, g: &ServerGate) -> Result<(), Failure> {
    let Some((approve, note)) = super::ask_decision(&g.id)? else { return Ok(()) };
    let password = if g.severity == "high" {
        let pw = crate::cli::identity::prompt::read_secret("your console password (step-up): ")?;
        let Some(pw) = pw else { return Ok(()) };
        Some(Zeroizing::new(String::from_utf8_lossy(&pw).into_owned()))
    } else {
        None
    };
    let action = if approve { "approve" } else { "deny" };
    match send(client, g, action, &note, password.as_deref().map(String::as_str), false).await {
        Ok(done) => println!("{}", decided_line(&done)),
        Err(Failure::Usage(m)) => eprintln!("airlock: {m}"),
        Err(Failure::Remote(e)) if exit_of(&e) == EXIT_UNKNOWN => eprintln!("airlock: {e}"),
        Err(e) => return Err(e),
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn gate(state: &str) -> ServerGate {
        serde_json::from_value(json!({
            "id": "gt_1", "kind": "egress", "state": state, "user_email": "dev@example.test",
            "method": "CONNECT", "host": "pay\u{1b}[31m.test", "port": 443, "action": "{}",
            "digest": "sha256:00", "severity": "high", "requested_at": "t",
            "deadline": "2000-01-01T00:00:00Z", "rule": "pay.test", "layer": "user",
            "policy": "~/.airlock/config.toml",
            "decision": if state == "pending" { Value::Null } else {
                json!({"state": state, "by_email": "rev@example.test", "note": "ok", "self": true,
                       "step_up": true, "at": "t"}) }
        }))
        .unwrap()
    }

    #[test]
    fn descriptions_name_the_action_and_decision_and_escape_the_agents_text() {
        let d = describe(&gate("pending"), "https://r.test");
        assert!(d.contains("high severity, pending") && d.contains("sha256:00"), "{d}");
        assert!(d.contains("asked by: dev@example.test") && !d.contains('\u{1b}'), "{d}");
        let d = describe(&gate("approved"), "https://r.test");
        assert!(d.contains("approved by rev@example.test (self) (password re-entered)"), "{d}");
        let line = decided_line(&gate("approved"));
        assert!(line.starts_with("approved gt_1:") && line.contains("self-decision"), "{line}");
    }

    #[test]
    fn refusals_exit_1_and_unreachable_servers_125() {
        let status = |status| RemoteError::Status {
            server: "s".into(),
            status,
            message: "m".into(),
            reason: None,
        };
        assert_eq!(exit_of(&status(403)), 1);
        assert_eq!(exit_of(&status(409)), 1);
        assert_eq!(exit_of(&status(503)), 125);
        let t = RemoteError::Transport { server: "s".into(), message: "m".into() };
        assert_eq!(exit_of(&t), 125);
    }
}
