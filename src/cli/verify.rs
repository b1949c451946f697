//! `airlock verify`: check a review server's record without trusting the server
//! (docs/evidence.md):
//!
//! - `airlock verify EXPORT [--key FILE] [--json]`: an export from `GET /api/v1/export`,
//!   offline ([`crate::evidence::export`]);
//! - `airlock verify --checkpoint FILE [--key FILE] [--json]`: a checkpoint from someone else
//!   against the one this client holds ([`crate::evidence::compare`]);
//! - `airlock verify --local [--repo DIR] [--json]`: the local audit files
//!   ([`super::verify_local`]).
//!
//! Exit status: 0 everything verified, 1 a check failed, 125 nothing could be checked (no
//! key, an unreadable file, not an export, the server unreachable for a needed proof).

use std::io::{BufReader, Write};
use std::path::{Path, PathBuf};

use clap::{ArgGroup, Args};

use super::Context;
use crate::evidence::compare::{self, Outcome};
use crate::evidence::export::{self, ExportReport};
use crate::evidence::{self, CheckpointAnswer, Evidence, Head};
use crate::paths::Paths;
use crate::tlog::note::{ALG_ED25519, NoteVerifier};

/// A check failed.
pub const FAILED: i32 = 1;
/// Nothing could be checked.
pub const CANNOT_CHECK: i32 = 125;

#[derive(Debug, Args)]
#[command(group(ArgGroup::new("what").required(true).args(["export", "checkpoint", "local"])))]
pub struct VerifyArgs {
    /// A JSONL export saved from the review server (`GET /api/v1/export`, the console's
    /// Export button); `-` reads standard input
    #[arg(value_name = "EXPORT")]
    pub export: Option<PathBuf>,
    /// Check a checkpoint obtained out of band (a colleague, CI, a ticket) against the one
    /// this client holds: a signed note, or the JSON answer of GET /api/v1/log/checkpoint
    #[arg(long, value_name = "FILE", conflicts_with_all = ["export", "local"])]
    pub checkpoint: Option<PathBuf>,
    /// Check the local audit files: seq gaps and each session's signed audit_root
    #[arg(long, conflicts_with_all = ["export", "checkpoint", "key"])]
    pub local: bool,
    /// With --local: only the log directory of this checkout (or a log directory itself);
    /// default: every log directory under ~/.airlock/logs
    #[arg(long, value_name = "DIR", requires = "local")]
    pub repo: Option<PathBuf>,
    /// The log's verifier key, in a file (`<name>+<id>+<base64>`); default: the key pinned
    /// at `airlock login --server`
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Print one JSON object instead of text
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &VerifyArgs, ctx: &Context<'_>) -> i32 {
    let paths = match Paths::from_env(ctx.env) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("airlock: {e}");
            return CANNOT_CHECK;
        }
    };
    if args.local {
        let repo =
            args.repo.as_ref().map(|d| if d.is_absolute() { d.clone() } else { ctx.cwd.join(d) });
        return super::verify_local::run(&paths, repo.as_deref(), args.json);
    }
    let key = match log_key(&paths, args.key.as_deref(), &ctx.cwd) {
        Ok(k) => k,
        Err(msg) => {
            eprintln!("airlock verify: {msg}");
            return CANNOT_CHECK;
        }
    };
    if let Some(file) = &args.checkpoint {
        let file = if file.is_absolute() { file.clone() } else { ctx.cwd.join(file) };
        return verify_checkpoint(&paths, &key, &file, args.json);
    }
    match &args.export {
        Some(p) => {
            let p =
                if p.as_os_str() == "-" || p.is_absolute() { p.clone() } else { ctx.cwd.join(p) };
            verify_export(&paths, &key, &p, args.json)
        }
        // clap's group requires one of the three.
        None => CANNOT_CHECK,
    }
}

/// The key from `--key FILE`, else the one pinned at login.
fn log_key(paths: &Paths, file: Option<&Path>, cwd: &Path) -> Result<NoteVerifier, String> {
    let (text, origin) = match file {
        Some(f) => {
            let f = if f.is_absolute() { f.to_path_buf() } else { cwd.join(f) };
            let text = std::fs::read_to_string(&f)
                .map_err(|e| format!("cannot read the key file {}: {e}", f.display()))?;
            (text, f.display().to_string())
        }
        None => {
            let id =
                crate::config::identity::read(&paths.identity_file()).map_err(|e| e.to_string())?;
            let pinned = id.and_then(|i| i.log_key).ok_or_else(|| {
                "no log key: pass --key FILE (the verifier key `airlockd review log-key init` \
                 printed), or run `airlock login --server URL` to pin the server's"
                    .to_owned()
            })?;
            (pinned, "the key pinned at login (~/.airlock/identity.toml)".to_owned())
        }
    };
    let key = NoteVerifier::parse(text.trim())
        .map_err(|e| format!("{origin} is not a log verifier key: {e}"))?;
    if key.alg != ALG_ED25519 {
        return Err(format!(
            "{origin} is a cosigner key (type 0x04), not a log key (type 0x01); give the log's \
             verifier key"
        ));
    }
    Ok(key)
}

/// The held checkpoint when it opens with `key` (a problem with it is a warning here).
fn held(paths: &Paths, key: &NoteVerifier, warnings: &mut Vec<String>) -> Option<Head> {
    match evidence::load_held(&paths.airlock_dir(), key) {
        Ok(h) => h,
        Err(e) => {
            warnings.push(format!("the held checkpoint is not compared: {e}"));
            None
        }
    }
}

fn verify_export(paths: &Paths, key: &NoteVerifier, path: &Path, json: bool) -> i32 {
    let mut warnings = Vec::new();
    let held = held(paths, key, &mut warnings);
    let result = if path.as_os_str() == "-" {
        export::verify_export(
            BufReader::with_capacity(1 << 20, std::io::stdin().lock()),
            key,
            held.as_ref(),
        )
    } else {
        match std::fs::File::open(path) {
            Ok(f) => {
                export::verify_export(BufReader::with_capacity(1 << 20, f), key, held.as_ref())
            }
            Err(e) => {
                eprintln!("airlock verify: cannot open {}: {e}", path.display());
                return CANNOT_CHECK;
            }
        }
    };
    let mut report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("airlock verify: {}: {e}", path.display());
            return CANNOT_CHECK;
        }
    };
    report.warnings.splice(0..0, warnings);
    print_export(&report, path, json);
    if report.ok() { 0 } else { FAILED }
}

fn print_export(r: &ExportReport, path: &Path, json: bool) {
    let mut out = std::io::stdout().lock();
    if json {
        let mut v = serde_json::to_value(r).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert("ok".into(), r.ok().into());
            o.insert("file".into(), path.display().to_string().into());
        }
        let _ = writeln!(out, "{v}");
        return;
    }
    let mut err = std::io::stderr().lock();
    for w in &r.warnings {
        let _ = writeln!(err, "airlock verify: warning: {w}");
    }
    if !r.ok() {
        let _ = writeln!(
            err,
            "airlock verify: {} FAILED: {} problem{} found",
            path.display(),
            r.failure_count,
            if r.failure_count == 1 { "" } else { "s" }
        );
        for f in &r.failures {
            let at = f.line.map(|l| format!("line {l}: ")).unwrap_or_default();
            let _ = writeln!(err, "  {at}{}", f.message);
        }
        if r.failure_count > r.failures.len() as u64 {
            let _ = writeln!(
                err,
                "  … and {} more (--json lists the first {})",
                r.failure_count - r.failures.len() as u64,
                export::MAX_LISTED
            );
        }
    }
    let head = match (r.tree_size, &r.root) {
        (Some(n), Some(root)) => format!(
            "checkpoint of {n} leaves (root {root}, signed at {})",
            r.time.map_or_else(|| "an unknown time".to_owned(), |t| t.to_string())
        ),
        _ => "no usable checkpoint".to_owned(),
    };
    let _ = writeln!(
        out,
        "{}: {head}; {} events, {} proven included, {} not covered by the checkpoint, {} \
         missing from the store; {} consistency proofs",
        if r.ok() { "verified" } else { "NOT verified" },
        r.events,
        r.verified,
        r.not_covered,
        r.missing,
        r.consistency
    );
}

fn verify_checkpoint(paths: &Paths, key: &NoteVerifier, file: &Path, json: bool) -> i32 {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("airlock verify: cannot read {}: {e}", file.display());
            return CANNOT_CHECK;
        }
    };
    let note = if text.trim_start().starts_with('{') {
        match serde_json::from_str::<CheckpointAnswer>(&text) {
            Ok(a) => a.checkpoint,
            Err(e) => {
                eprintln!(
                    "airlock verify: {} is JSON but not a checkpoint answer ({e}); give the \
                     signed note, or the answer of GET /api/v1/log/checkpoint",
                    file.display()
                );
                return CANNOT_CHECK;
            }
        }
    } else {
        text
    };
    let other = match Head::open(&note, key) {
        Ok(h) => h,
        Err(e) => {
            let msg = format!(
                "{} does not verify with the log key {key} ({e}): it is forged, altered or from \
                 another log",
                file.display()
            );
            return report_checkpoint(json, false, "invalid", &msg, None, None);
        }
    };
    let air = paths.airlock_dir();
    let held = match evidence::load_held(&air, key) {
        Ok(Some(h)) => h,
        Ok(None) => {
            eprintln!(
                "airlock verify: this client holds no checkpoint of the log yet \
                 ({}); run `airlock publish` first, then compare",
                evidence::held_path(&air).display()
            );
            return CANNOT_CHECK;
        }
        Err(e) => {
            eprintln!("airlock verify: {e}");
            return CANNOT_CHECK;
        }
    };
    let needs_server = held.cp.size != other.cp.size;
    let outcome = if needs_server {
        let client = match crate::remote::Client::from_login(paths) {
            Ok(c) => c,
            Err(e) => {
                eprintln!(
                    "airlock verify: the two checkpoints differ in size, so the server must prove \
                     them consistent, but {e}"
                );
                return CANNOT_CHECK;
            }
        };
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("airlock verify: cannot start the async runtime: {e}");
                return CANNOT_CHECK;
            }
        };
        rt.block_on(compare::compare(&client, &held, &other))
    } else {
        // Same size: offline.
        tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|e| compare::CompareError::Transient(e.to_string()))
            .and_then(|rt| rt.block_on(compare::compare(&NoNetwork, &held, &other)))
    };
    let (outcome, proof) = match outcome {
        Ok(x) => x,
        Err(e) => {
            eprintln!("airlock verify: {e}");
            return CANNOT_CHECK;
        }
    };
    match outcome {
        Outcome::Same => report_checkpoint(
            json,
            true,
            "same",
            "the checkpoint is the one this client holds",
            Some(&held),
            Some(&other),
        ),
        Outcome::Consistent { from, to } => report_checkpoint(
            json,
            true,
            "consistent",
            &format!("consistent: the server proved tree size {from} a prefix of size {to}"),
            Some(&held),
            Some(&other),
        ),
        Outcome::Split(why) => {
            let mut ev = Evidence::default();
            ev.add("held-checkpoint", held.note.clone());
            ev.add("other-checkpoint", other.note.clone());
            if let Some(p) = proof {
                ev.add("proof.json", p);
            }
            ev.add("report.txt", format!("{why}\n"));
            let saved = match ev.save(&air) {
                Ok(d) => d.display().to_string(),
                Err(e) => format!("could not be saved ({e})"),
            };
            let msg = format!(
                "SPLIT VIEW: {why}. The server showed this client and whoever holds {} different \
                 trees; keep the evidence ({saved}) and tell your security team and the \
                 server's operator",
                file.display()
            );
            report_checkpoint(json, false, "split", &msg, Some(&held), Some(&other))
        }
    }
}

fn report_checkpoint(
    json: bool,
    ok: bool,
    outcome: &str,
    message: &str,
    held: Option<&Head>,
    other: Option<&Head>,
) -> i32 {
    let desc = |h: Option<&Head>| {
        h.map(|h| {
            serde_json::json!({"tree_size": h.cp.size, "root": crate::tlog::b64(&h.cp.root),
                "time": h.cp.time()})
        })
    };
    if json {
        let v = serde_json::json!({"ok": ok, "outcome": outcome, "message": message,
            "held": desc(held), "other": desc(other)});
        println!("{v}");
    } else if ok {
        println!("verified: {message}");
        if let (Some(h), Some(o)) = (held, other) {
            println!("  held:  {}\n  other: {}", h.describe(), o.describe());
        }
    } else {
        eprintln!("airlock verify: {message}");
        if let Some(h) = held {
            eprintln!("  held:  {}", h.describe());
        }
        if let Some(o) = other {
            eprintln!("  other: {}", o.describe());
        }
    }
    if ok { 0 } else { FAILED }
}

/// The [`evidence::LogApi`] of a comparison that needs no proof (the same size).
struct NoNetwork;

impl evidence::LogApi for NoNetwork {
    async fn get(&self, _path: &str) -> Result<evidence::Answer, evidence::ApiError> {
        Err(evidence::ApiError::Transient("no server is asked for a same-size comparison".into()))
    }

    async fn post_json(
        &self,
        _path: &str,
        _body: &serde_json::Value,
    ) -> Result<evidence::Answer, evidence::ApiError> {
        Err(evidence::ApiError::Transient("no server is asked for a same-size comparison".into()))
    }
}
