//! `airlock verify --local [--json]` (docs/evidence.md, "Session audit roots"): checks this
//! machine's audit files — every log directory under `~/.airlock/logs`, or one checkout's — for
//! `seq` gaps and against each session end record's signed `audit_root`
//! ([`crate::audit::check`]). Exit 0: all good; 1: a failure (each named); 125: something
//! could not be read (and nothing failed).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::audit::check::{DirCheck, GapStatus, MachineKey, Status, check_dir};
use crate::audit::escape_for_terminal;
use crate::audit::logdir;
use crate::config::machine_key;
use crate::paths::Paths;
use crate::repo::Repo;

/// The whole report (`--json` prints it as one object).
#[derive(Debug, Serialize)]
struct Report {
    /// No failure and nothing unreadable.
    ok: bool,
    logs_root: PathBuf,
    /// This machine's verifier key, if it has one.
    machine_key: Option<String>,
    dirs: Vec<DirCheck>,
    /// Failed sessions, missing `seq`s and unreadable session records, over all directories.
    failures: usize,
    /// What could not be read.
    errors: Vec<String>,
}

/// Runs the check and prints the report; returns the exit code.
pub fn run(paths: &Paths, repo: Option<&Path>, json: bool) -> i32 {
    let report = check(paths, repo);
    let mut out = std::io::stdout().lock();
    let printed = if json {
        serde_json::to_writer(&mut out, &report)
            .map_err(std::io::Error::other)
            .and_then(|()| writeln!(out))
    } else {
        print_text(&mut out, &report)
    };
    if let Err(e) = printed.and_then(|()| out.flush()) {
        eprintln!("airlock: cannot write the report: {e}");
        return 125;
    }
    if !json {
        for e in &report.errors {
            eprintln!("airlock: {e}");
        }
    }
    exit_code(&report)
}

fn exit_code(report: &Report) -> i32 {
    if report.failures > 0 {
        1
    } else if !report.errors.is_empty() {
        125
    } else {
        0
    }
}

/// The log directories to check: `repo` is one checkout (its log directory, found as every
/// reader and writer finds it) or a log directory under the logs root itself; without it,
/// every directory under the root.
fn dirs(root: &Path, repo: Option<&Path>) -> Result<Vec<PathBuf>, String> {
    let Some(repo) = repo else {
        return logdir::all(root)
            .map(|all| all.into_iter().map(|(dir, _)| dir).collect())
            .map_err(|e| e.to_string());
    };
    let cwd =
        std::env::current_dir().map_err(|e| format!("cannot read the working directory: {e}"))?;
    let given = if repo.is_absolute() { repo.to_owned() } else { cwd.join(repo) };
    if let (Ok(dir), Ok(root)) = (std::fs::canonicalize(&given), std::fs::canonicalize(root))
        && dir.parent() == Some(root.as_path())
    {
        return Ok(vec![dir]);
    }
    let repo = Repo::resolve(Some(&given), &cwd).map_err(|e| e.to_string())?;
    match logdir::locate(root, &repo.name, &repo.path).map_err(|e| e.to_string())? {
        Some(dir) => Ok(vec![dir]),
        None => Ok(Vec::new()),
    }
}

fn check(paths: &Paths, repo: Option<&Path>) -> Report {
    let logs_root = paths.logs_root();
    let mut report = Report {
        ok: false,
        logs_root: logs_root.clone(),
        machine_key: None,
        dirs: Vec::new(),
        failures: 0,
        errors: Vec::new(),
    };
    let machine = match machine_key::load(paths) {
        Ok(Some(k)) => {
            let v = k.verifier();
            report.machine_key = Some(v.to_string());
            MachineKey::Known(v)
        }
        Ok(None) => MachineKey::Missing,
        Err(e) => {
            report.errors.push(e.to_string());
            return report;
        }
    };
    let dirs = match dirs(&logs_root, repo) {
        Ok(d) => d,
        Err(e) => {
            report.errors.push(e);
            return report;
        }
    };
    for dir in dirs {
        match check_dir(&dir, &machine) {
            Ok(c) => report.dirs.push(c),
            Err(e) => report.errors.push(e.to_string()),
        }
    }
    report.failures = report.dirs.iter().map(DirCheck::failures).sum();
    report.ok = report.failures == 0 && report.errors.is_empty();
    report
}

fn label(dir: &Path) -> String {
    escape_for_terminal(&dir.file_name().map(|n| n.to_string_lossy()).unwrap_or_default())
        .into_owned()
}

fn print_text(out: &mut impl Write, report: &Report) -> std::io::Result<()> {
    let t = |s: &str| escape_for_terminal(s).into_owned();
    let mut sessions = 0;
    for d in &report.dirs {
        let repo = label(&d.dir);
        for s in &d.sessions {
            sessions += 1;
            let id = t(&s.session);
            match s.status {
                Status::Ok => writeln!(
                    out,
                    "ok      {repo}: session {id}: {} lines match the root signed by this machine",
                    s.lines_on_disk
                )?,
                Status::Failed => {
                    for p in &s.problems {
                        writeln!(out, "FAILED  {repo}: session {id}: {}", t(p))?;
                    }
                }
                Status::CannotCheck | Status::NotRooted => writeln!(
                    out,
                    "note    {repo}: session {id}: {}",
                    t(s.reason.as_deref().unwrap_or_default())
                )?,
            }
        }
        for g in &d.gaps {
            let (tag, what) = match g.status {
                GapStatus::Missing => ("FAILED ", "missing"),
                GapStatus::Open => {
                    ("note   ", "not written yet (the session may still be running)")
                }
                GapStatus::Retention => (
                    "note   ",
                    "cannot check: lines removed by retention (the session's start record is gone)",
                ),
            };
            let seqs = if g.from == g.to {
                format!("seq {}", g.from)
            } else {
                format!("seq {}..{}", g.from, g.to)
            };
            writeln!(
                out,
                "{tag} {repo}: session {}: {}: boot {}: {seqs} {what}",
                t(&g.session),
                label(&g.file),
                t(&g.boot)
            )?;
        }
        for p in &d.problems {
            writeln!(out, "FAILED  {repo}: {}", t(p))?;
        }
        for w in &d.warnings {
            writeln!(out, "warning {repo}: {}", t(w))?;
        }
    }
    let dirs = report.dirs.len();
    if report.failures > 0 {
        writeln!(
            out,
            "verify --local: FAILED: {} failure(s) in {dirs} log director{} ({sessions} session \
             end record(s))",
            report.failures,
            if dirs == 1 { "y" } else { "ies" }
        )
    } else if report.errors.is_empty() {
        writeln!(
            out,
            "verify --local: ok: {sessions} session end record(s) in {dirs} log director{}",
            if dirs == 1 { "y" } else { "ies" }
        )
    } else {
        writeln!(out, "verify --local: could not check everything (see the errors)")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::audit::root::seal;
    use crate::audit::{AuditSink, RepoLog, SessionInfo};

    /// A machine with a key and one sealed session in `logs/r`.
    fn machine() -> (tempfile::TempDir, Paths, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let paths = Paths::with_home(tmp.path().to_owned());
        let key = machine_key::load_or_create(&paths).unwrap();
        let dir = paths.logs_root().join("r");
        let log = RepoLog::open(&dir, "b").unwrap();
        let sink = log.session_sink(SessionInfo { session: "s1".into(), ..Default::default() });
        let start = serde_json::json!({"id": "s1:start", "kind": "start", "session": "s1"});
        crate::audit::append_record(&dir, "sessions", &start).unwrap();
        for host in ["a.test", "b.test"] {
            sink.append(&sink.line(host, Some(443), "CONNECT")).unwrap();
        }
        drop(sink);
        drop(log);
        let root = seal(&dir, "s1", &key).unwrap();
        let end =
            serde_json::json!({"id": "s1:end", "kind": "end", "session": "s1", "audit_root": root});
        crate::audit::append_record(&dir, "sessions", &end).unwrap();
        (tmp, paths, dir)
    }

    fn text(report: &Report) -> String {
        let mut out = Vec::new();
        print_text(&mut out, report).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn all_good_then_a_changed_line_fails_naming_the_session() {
        let (_tmp, paths, dir) = machine();
        let r = check(&paths, None);
        assert_eq!((exit_code(&r), r.failures), (0, 0), "{}", text(&r));
        assert!(text(&r).contains("ok      r: session s1: 2 lines match"), "{}", text(&r));
        // The log directory itself names that one directory.
        assert_eq!(exit_code(&check(&paths, Some(&dir))), 0);
        assert_eq!(check(&paths, Some(&dir)).dirs.len(), 1);
        let file = crate::audit::audit_files(&dir).unwrap().pop().unwrap().1;
        let body = std::fs::read_to_string(&file).unwrap();
        std::fs::write(&file, body.replacen("a.test", "A.test", 1)).unwrap();
        let r = check(&paths, None);
        assert_eq!(exit_code(&r), 1);
        let out = text(&r);
        assert!(out.contains("FAILED  r: session s1: the 2 lines on disk do not hash"), "{out}");
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["ok"], false);
        assert_eq!(json["dirs"][0]["sessions"][0]["status"], "failed");
        assert_eq!(json["dirs"][0]["sessions"][0]["session"], "s1");
    }

    #[test]
    fn an_unreadable_machine_key_is_125() {
        use std::os::unix::fs::PermissionsExt;
        let (_tmp, paths, _dir) = machine();
        let key = machine_key::path(&paths);
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let r = check(&paths, None);
        assert_eq!(exit_code(&r), 125);
        assert!(r.errors[0].contains("machine key"), "{:?}", r.errors);
    }
}
