//! The checks behind `airlock verify --local` (docs/evidence.md), over one log directory:
//!
//! - **`seq` gaps** within each (session, boot): a `suppressed` line's `seqs` and attempts
//!   still open in a journal count as present.
//! - **Each end record's `audit_root`:** the root recomputed from the lines on disk
//!   ([`super::root`]) against the signed one; the note's signature under the record's key;
//!   the key against this machine's.
//!
//! **Retention** (`[logs] keep`, [`super::retention`]) deletes whole dated files, oldest first,
//! audit and session files of a date alike: every file it ever deleted is older than every
//! dated file left. A session's lines are all written on or after its start record, so if
//! retention removed any of them it removed the start record too. Hence: a session whose
//! start record is present has every line (a difference is an edit); one whose start record is
//! gone and that has fewer lines than its root counts, or gaps, "cannot be checked" — that
//! is what retention leaves, and it cannot be told apart from a hand that removed the same.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::AuditError;
use super::files::{audit_files, dated_files, for_each_line};
use super::journal::{journal_boot, pending_records};
use super::root::{AuditRoot, Leaves, leaf_line, parse_note_text};
use crate::tlog::b64;
use crate::tlog::merkle::Hash;
use crate::tlog::note::{Note, NoteVerifier};

/// At most this many "not an audit line" warnings per directory are listed one by one.
const MAX_WARNINGS: usize = 20;

/// This machine's key, as the check needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MachineKey {
    Known(NoteVerifier),
    /// `~/.airlock/keys/machine.key` does not exist.
    Missing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// The lines on disk are the signed ones, signed by this machine.
    Ok,
    /// Something differs: see `problems`.
    Failed,
    /// Lines were removed by retention (`reason`).
    CannotCheck,
    /// The end record has no `audit_root` (`reason`: its `audit_root_error`, or an older daemon).
    NotRooted,
}

/// One end record's check.
#[derive(Debug, Clone, Serialize)]
pub struct SessionCheck {
    pub session: String,
    pub status: Status,
    /// Where the end record is: `sessions-<date>.jsonl:<line>`.
    pub record: String,
    /// What the signed root covers.
    pub lines: Option<u64>,
    pub hash: Option<String>,
    /// What the lines on disk give.
    pub lines_on_disk: u64,
    pub hash_on_disk: String,
    /// The record's key (verifier key text).
    pub key: Option<String>,
    /// Each difference, in words.
    pub problems: Vec<String>,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GapStatus {
    /// Lines that should be there are not.
    Missing,
    /// The session has no end record and its writer's journal is still there: it may be
    /// running, with lines (pending summaries, open tunnels) still to come.
    Open,
    /// The session's start record is gone: retention may have removed these lines.
    Retention,
}

/// `seq` values `from..=to` of one (session, boot) have no line.
#[derive(Debug, Clone, Serialize)]
pub struct Gap {
    /// The file of the first line after the gap.
    pub file: PathBuf,
    pub session: String,
    pub boot: String,
    pub from: u64,
    pub to: u64,
    pub status: GapStatus,
}

/// Everything found in one log directory.
#[derive(Debug, Clone, Serialize)]
pub struct DirCheck {
    pub dir: PathBuf,
    pub sessions: Vec<SessionCheck>,
    pub gaps: Vec<Gap>,
    /// Failures that belong to no session: session-record lines that cannot be read (one may
    /// have been an end record).
    pub problems: Vec<String>,
    /// Audit-file lines that are not audit lines (a write cut short leaves one; no session's
    /// root counts them).
    pub warnings: Vec<String>,
}

impl DirCheck {
    /// Failed sessions, missing `seq`s and unreadable session records.
    pub fn failures(&self) -> usize {
        self.sessions.iter().filter(|s| s.status == Status::Failed).count()
            + self.gaps.iter().filter(|g| g.status == GapStatus::Missing).count()
            + self.problems.len()
    }
}

/// An end record as read.
struct EndSeen {
    session: String,
    record: String,
    audit_root: Option<serde_json::Value>,
    audit_root_error: Option<String>,
}

/// Present `seq` ranges of one (session, boot): `(from, to, file index)`.
type Coverage = Vec<(u64, u64, usize)>;

fn file_label(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn open_file(path: &Path) -> Result<Option<std::fs::File>, AuditError> {
    match std::fs::File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(AuditError::Read { path: path.to_owned(), source }),
    }
}

/// Checks the log directory `dir` against this machine's key.
pub fn check_dir(dir: &Path, machine: &MachineKey) -> Result<DirCheck, AuditError> {
    let mut out = DirCheck {
        dir: dir.to_owned(),
        sessions: Vec::new(),
        gaps: Vec::new(),
        problems: Vec::new(),
        warnings: Vec::new(),
    };

    // Session records: which sessions started here, and every end record.
    let mut starts: HashSet<String> = HashSet::new();
    let mut ends: Vec<EndSeen> = Vec::new();
    for (_, path) in dated_files(dir, "sessions")? {
        let Some(file) = open_file(&path)? else { continue };
        let label = file_label(&path);
        let mut lineno = 0usize;
        for_each_line(file, &path, |buf| {
            lineno += 1;
            if buf.iter().all(u8::is_ascii_whitespace) {
                return;
            }
            let rec: serde_json::Value = match serde_json::from_slice(buf) {
                Ok(v) => v,
                Err(e) => {
                    out.problems.push(format!(
                        "{label}:{lineno}: unreadable session record ({e}): an edit, or a write \
                         cut short; if it was an end record, its session's audit root is lost"
                    ));
                    return;
                }
            };
            let Some(session) = rec.get("session").and_then(|s| s.as_str()) else { return };
            match rec.get("kind").and_then(|k| k.as_str()) {
                Some("start") => {
                    starts.insert(session.to_owned());
                }
                Some("end") => ends.push(EndSeen {
                    session: session.to_owned(),
                    record: format!("{label}:{lineno}"),
                    audit_root: rec.get("audit_root").cloned(),
                    audit_root_error: rec
                        .get("audit_root_error")
                        .and_then(|e| e.as_str())
                        .map(str::to_owned),
                }),
                _ => {}
            }
        })?;
    }

    // Audit lines: each session's leaves and each (session, boot)'s present seqs.
    let mut files: Vec<PathBuf> = Vec::new();
    let mut leaves: HashMap<String, Leaves> = HashMap::new();
    let mut coverage: BTreeMap<(String, String), Coverage> = BTreeMap::new();
    let mut not_lines = 0usize;
    for (_, path) in audit_files(dir)? {
        let Some(file) = open_file(&path)? else { continue };
        let f = files.len();
        files.push(path.clone());
        let label = file_label(&path);
        let mut lineno = 0usize;
        for_each_line(file, &path, |buf| {
            lineno += 1;
            if buf.iter().all(u8::is_ascii_whitespace) {
                return;
            }
            let Some(l) = leaf_line(buf) else {
                not_lines += 1;
                if out.warnings.len() < MAX_WARNINGS {
                    out.warnings.push(format!(
                        "{label}:{lineno}: not an audit line (a write cut short, or an edit)"
                    ));
                }
                return;
            };
            leaves.entry(l.session.clone()).or_default().push(&l.boot, l.seq, l.leaf);
            let cov = coverage.entry((l.session, l.boot)).or_default();
            cov.push((l.seq, l.seq, f));
            for [a, b] in l.seqs.unwrap_or_default() {
                if a <= b {
                    cov.push((a, b, f));
                }
            }
        })?;
    }
    if not_lines > MAX_WARNINGS {
        out.warnings.push(format!(
            "… and {} more lines that are not audit lines",
            not_lines - MAX_WARNINGS
        ));
    }

    // Journals: writers that may be live, and attempts in flight (their seqs are taken).
    let mut journal_boots: HashSet<String> = HashSet::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        let mut journals: Vec<(String, PathBuf)> = entries
            .flatten()
            .filter_map(|e| {
                let boot = e.file_name().to_str().and_then(journal_boot).map(str::to_owned)?;
                Some((boot, e.path()))
            })
            .collect();
        journals.sort();
        for (boot, path) in journals {
            let Some(file) = open_file(&path)? else { continue };
            journal_boots.insert(boot);
            let (open, _bad) = pending_records(&file, &path)?;
            let f = files.len();
            files.push(path.clone());
            for l in open {
                coverage.entry((l.session, l.boot)).or_default().push((l.seq, l.seq, f));
            }
        }
    }

    // Each end record against the lines on disk.
    let ended: HashSet<&str> = ends.iter().map(|e| e.session.as_str()).collect();
    let mut roots: HashMap<String, (u64, Hash)> = HashMap::new();
    for end in &ends {
        let disk = *roots
            .entry(end.session.clone())
            .or_insert_with(|| leaves.remove(&end.session).unwrap_or_default().finish());
        out.sessions.push(judge(end, disk, machine, starts.contains(&end.session)));
    }

    // Gaps.
    for ((session, boot), mut cov) in coverage {
        cov.sort_unstable();
        let mut next = 1u64;
        for (a, b, f) in cov {
            if a > next {
                let status = if !ended.contains(session.as_str()) && journal_boots.contains(&boot) {
                    GapStatus::Open
                } else if !starts.contains(&session) {
                    GapStatus::Retention
                } else {
                    GapStatus::Missing
                };
                out.gaps.push(Gap {
                    file: files[f].clone(),
                    session: session.clone(),
                    boot: boot.clone(),
                    from: next,
                    to: a - 1,
                    status,
                });
            }
            next = next.max(b.saturating_add(1));
        }
    }
    Ok(out)
}

/// One end record's verdict.
fn judge(end: &EndSeen, disk: (u64, Hash), machine: &MachineKey, started: bool) -> SessionCheck {
    let mut c = SessionCheck {
        session: end.session.clone(),
        status: Status::Ok,
        record: end.record.clone(),
        lines: None,
        hash: None,
        lines_on_disk: disk.0,
        hash_on_disk: b64(&disk.1),
        key: None,
        problems: Vec::new(),
        reason: None,
    };
    let Some(value) = &end.audit_root else {
        c.status = Status::NotRooted;
        c.reason = Some(match &end.audit_root_error {
            Some(e) => format!("the daemon wrote no audit root: {e}"),
            None => "the end record has no audit root (written before audit roots existed)".into(),
        });
        return c;
    };
    let root: AuditRoot = match serde_json::from_value(value.clone()) {
        Ok(r) => r,
        Err(e) => {
            c.status = Status::Failed;
            c.problems.push(format!("its audit_root is malformed: {e}"));
            return c;
        }
    };
    c.lines = Some(root.lines);
    c.hash = Some(root.hash.clone());
    c.key = Some(root.key.clone());

    let key = match NoteVerifier::parse(&root.key) {
        Ok(k) => Some(k),
        Err(e) => {
            c.problems.push(format!("its key is malformed: {e}"));
            None
        }
    };
    // What was signed: the note's text, once its signature verifies.
    let mut signed = None;
    match Note::parse(&root.note) {
        Err(e) => c.problems.push(format!("its note is malformed: {e}")),
        Ok(note) => {
            if let Some(k) = &key
                && let Err(e) = note.verify(k)
            {
                c.problems.push(format!("its note's signature does not verify: {e}"));
            }
            match parse_note_text(&note.text) {
                Err(e) => c.problems.push(e.to_string()),
                Ok(body) => signed = Some(body),
            }
        }
    }
    if let Some(k) = &key {
        match machine {
            MachineKey::Known(mine) if mine == k => {}
            MachineKey::Known(_) => {
                c.problems.push(format!("signed by another machine key ({})", k.name))
            }
            MachineKey::Missing => c.problems.push(format!(
                "signed by another machine key ({}): this machine has no key",
                k.name
            )),
        }
    }
    let Some(body) = signed else {
        c.status = Status::Failed;
        return c;
    };
    if body.session != end.session {
        c.problems.push(format!("its signed note is for session {}", body.session));
    }
    if body.lines != root.lines || b64(&body.root) != root.hash {
        c.problems.push(format!(
            "its lines and hash ({}, {}) are not what its note signs ({}, {})",
            root.lines,
            root.hash,
            body.lines,
            b64(&body.root)
        ));
    }
    if (body.lines, body.root) != disk {
        if c.problems.is_empty() && !started && disk.0 < body.lines {
            c.status = Status::CannotCheck;
            c.reason = Some(format!(
                "cannot check: lines removed by retention ({} of the {} signed lines are on \
                 disk, and the session's start record is gone with the oldest files)",
                disk.0, body.lines
            ));
            return c;
        }
        c.problems.push(if disk.0 == body.lines {
            format!(
                "the {} lines on disk do not hash to the signed root: a line was changed",
                disk.0
            )
        } else if disk.0 < body.lines {
            format!(
                "{} lines on disk, the signed root covers {}: lines were removed (or changed)",
                disk.0, body.lines
            )
        } else {
            format!(
                "{} lines on disk, the signed root covers {}: lines were added (or changed)",
                disk.0, body.lines
            )
        });
    }
    if !c.problems.is_empty() {
        c.status = Status::Failed;
    }
    c
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::audit::root::seal;
    use crate::audit::writer::tests::info;
    use crate::audit::{AuditSink, RepoLog, SessionInfo};
    use crate::tlog::note::NoteSigner;

    /// A directory with one finished session `s` of `n` refusals (start and end records, the
    /// end record sealed with `signer`) and the path of its audit file.
    fn session(dir: &Path, signer: &NoteSigner, n: usize) -> PathBuf {
        let log = RepoLog::open(dir, "boot").unwrap();
        let sink = log.session_sink(SessionInfo { session: "s".into(), ..info() });
        let start =
            serde_json::json!({"id": "s:start", "kind": "start", "session": "s", "ts": "t"});
        crate::audit::append_record(dir, "sessions", &start).unwrap();
        for i in 0..n {
            let mut l = sink.line(&format!("h{i}.test"), Some(443), "CONNECT");
            l.reason = Some(crate::policy::Reason::NotAllowed);
            sink.append(&l).unwrap();
        }
        drop(sink);
        drop(log);
        let root = seal(dir, "s", signer).unwrap();
        let end =
            serde_json::json!({"id": "s:end", "kind": "end", "session": "s", "audit_root": root});
        crate::audit::append_record(dir, "sessions", &end).unwrap();
        audit_files(dir).unwrap().pop().unwrap().1
    }

    fn only(c: &DirCheck) -> &SessionCheck {
        assert_eq!(c.sessions.len(), 1, "{c:?}");
        &c.sessions[0]
    }

    fn edit(path: &Path, f: impl FnOnce(&mut Vec<String>)) {
        let mut lines: Vec<String> =
            std::fs::read_to_string(path).unwrap().lines().map(str::to_owned).collect();
        f(&mut lines);
        let mut text = lines.join("\n");
        text.push('\n');
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn an_untouched_session_checks_and_every_edit_is_named() {
        let signer = NoteSigner::generate("airlock-machine/here").unwrap();
        let mine = MachineKey::Known(signer.verifier());
        let tmp = tempfile::tempdir().unwrap();
        let file = session(tmp.path(), &signer, 4);
        let c = check_dir(tmp.path(), &mine).unwrap();
        assert_eq!(only(&c).status, Status::Ok, "{c:?}");
        assert_eq!((only(&c).lines, only(&c).lines_on_disk), (Some(4), 4));
        assert_eq!(c.failures(), 0);
        assert!(c.gaps.is_empty() && c.warnings.is_empty(), "{c:?}");
        let pristine = std::fs::read_to_string(&file).unwrap();

        // One byte changed: same count, another root.
        edit(&file, |l| l[1] = l[1].replace("h1.test", "h1.tesT"));
        let c = check_dir(tmp.path(), &mine).unwrap();
        assert_eq!(only(&c).status, Status::Failed);
        assert!(only(&c).problems[0].contains("a line was changed"), "{c:?}");

        // A line removed: fewer lines, and a seq gap (the start record is there).
        std::fs::write(&file, &pristine).unwrap();
        edit(&file, |l| {
            l.remove(1);
        });
        let c = check_dir(tmp.path(), &mine).unwrap();
        assert!(only(&c).problems[0].contains("3 lines on disk, the signed root covers 4"));
        assert_eq!(c.gaps.len(), 1, "{c:?}");
        assert_eq!((c.gaps[0].from, c.gaps[0].to, c.gaps[0].status), (2, 2, GapStatus::Missing));
        assert_eq!(c.gaps[0].file, file);
        assert_eq!(c.failures(), 2);

        // A line appended by hand (a copy with a fresh seq): more lines.
        std::fs::write(&file, &pristine).unwrap();
        edit(&file, |l| {
            let extra = l[0].replace("\"seq\":1", "\"seq\":5");
            l.push(extra);
        });
        let c = check_dir(tmp.path(), &mine).unwrap();
        assert!(only(&c).problems[0].contains("lines were added"), "{c:?}");

        // Reordered lines in the file: the root does not depend on the file's order.
        std::fs::write(&file, &pristine).unwrap();
        edit(&file, |l| l.reverse());
        assert_eq!(only(&check_dir(tmp.path(), &mine).unwrap()).status, Status::Ok);
    }

    #[test]
    fn another_machines_key_and_a_forged_record_fail() {
        let signer = NoteSigner::generate("airlock-machine/there").unwrap();
        let tmp = tempfile::tempdir().unwrap();
        session(tmp.path(), &signer, 2);
        let other = NoteSigner::generate("airlock-machine/here").unwrap();
        let c = check_dir(tmp.path(), &MachineKey::Known(other.verifier())).unwrap();
        assert_eq!(only(&c).status, Status::Failed);
        assert_eq!(
            only(&c).problems,
            ["signed by another machine key (airlock-machine/there)".to_owned()]
        );
        let c = check_dir(tmp.path(), &MachineKey::Missing).unwrap();
        assert!(only(&c).problems[0].contains("this machine has no key"), "{c:?}");

        // The record's count raised by hand to hide an added line: the note does not say so.
        let mine = MachineKey::Known(signer.verifier());
        let sessions = dated_files(tmp.path(), "sessions").unwrap().pop().unwrap().1;
        edit(&sessions, |l| {
            let last = l.len() - 1;
            l[last] = l[last].replace("\"lines\":2", "\"lines\":3");
        });
        let c = check_dir(tmp.path(), &mine).unwrap();
        assert!(only(&c).problems[0].contains("are not what its note signs"), "{c:?}");

        // A note signed by another key does not verify under the record's key.
        edit(&sessions, |l| {
            let last = l.len() - 1;
            let forged =
                other.sign_note("airlock-audit/v1\nsession s\nlines 3\nroot AAAA\n").unwrap();
            let mut rec: serde_json::Value = serde_json::from_str(&l[last]).unwrap();
            rec["audit_root"]["note"] = serde_json::Value::String(forged);
            l[last] = rec.to_string();
        });
        let c = check_dir(tmp.path(), &mine).unwrap();
        assert_eq!(only(&c).status, Status::Failed);
        assert!(only(&c).problems.iter().any(|p| p.contains("signature does not verify")), "{c:?}");

        // An end record made unreadable is a failure of the directory.
        edit(&sessions, |l| {
            let last = l.len() - 1;
            l[last].truncate(40);
        });
        let c = check_dir(tmp.path(), &mine).unwrap();
        assert!(c.sessions.is_empty());
        assert_eq!(c.problems.len(), 1, "{c:?}");
        assert_eq!(c.failures(), 1);
    }

    /// Retention deleted the session's first day (its start record with it): fewer lines and a
    /// leading gap cannot be checked, and are not reported as tampering. More lines than were
    /// signed still fail.
    #[test]
    fn lines_removed_by_retention_cannot_be_checked_and_are_no_failure() {
        let signer = NoteSigner::generate("airlock-machine/here").unwrap();
        let mine = MachineKey::Known(signer.verifier());
        let tmp = tempfile::tempdir().unwrap();
        let file = session(tmp.path(), &signer, 4);
        let sessions = dated_files(tmp.path(), "sessions").unwrap().pop().unwrap().1;
        edit(&sessions, |l| {
            l.remove(0);
        });
        edit(&file, |l| {
            l.drain(..2);
        });
        let c = check_dir(tmp.path(), &mine).unwrap();
        assert_eq!(only(&c).status, Status::CannotCheck, "{c:?}");
        assert!(only(&c).reason.as_deref().unwrap().contains("removed by retention"));
        assert_eq!((c.gaps.len(), c.gaps[0].status), (1, GapStatus::Retention));
        assert_eq!(c.failures(), 0);
        edit(&file, |l| {
            for seq in 5..8 {
                l.push(l[0].replace("\"seq\":3", &format!("\"seq\":{seq}")));
            }
        });
        let c = check_dir(tmp.path(), &mine).unwrap();
        assert_eq!(only(&c).status, Status::Failed, "{c:?}");
    }

    #[test]
    fn suppressed_ranges_and_open_attempts_are_no_gaps_and_a_live_sessions_gap_is_open() {
        let tmp = tempfile::tempdir().unwrap();
        let log = RepoLog::open(tmp.path(), "live").unwrap();
        let sink = log.session_sink(SessionInfo { session: "s".into(), ..info() });
        let start = serde_json::json!({"id": "s:start", "kind": "start", "session": "s"});
        crate::audit::append_record(tmp.path(), "sessions", &start).unwrap();
        let mut first = sink.line("a.test", Some(443), "CONNECT");
        first.reason = Some(crate::policy::Reason::NotAllowed);
        sink.append(&first).unwrap();
        // seq 2: a tunnel still open; seqs 3..5 in a summary line (written as the sink does).
        let mut open = sink.line("b.test", Some(443), "CONNECT");
        open.allowed = true;
        sink.journal_open(&open).unwrap();
        let mut sup = sink.line("c.test", Some(443), "CONNECT");
        sup.reason = Some(crate::policy::Reason::NotAllowed);
        sup.seqs = Some(vec![[3, 5]]);
        sup.count = Some(3);
        log.audit().append_encoded(&crate::audit::encode_line(&sup).unwrap()).unwrap();
        for _ in 0..2 {
            sink.stamp();
        }
        // seq 6 lost (e.g. a summary a killed writer held); seq 7 written.
        sink.stamp();
        let mut last = sink.line("d.test", Some(443), "CONNECT");
        last.reason = Some(crate::policy::Reason::NotAllowed);
        sink.append(&last).unwrap();
        let c = check_dir(tmp.path(), &MachineKey::Missing).unwrap();
        assert_eq!(c.gaps.len(), 1, "{c:?}");
        assert_eq!((c.gaps[0].from, c.gaps[0].to), (6, 6));
        assert_eq!(c.gaps[0].status, GapStatus::Open, "the writer's journal is there");
        assert_eq!(c.failures(), 0);
        // The writer gone (journal retired): the gap is missing lines.
        log.simulate_crash();
        drop(sink);
        drop(log);
        crate::audit::settle::wait_until_unlocked(&tmp.path().join("journal-live.jsonl"));
        crate::audit::settle_journals(tmp.path()).unwrap();
        let c = check_dir(tmp.path(), &MachineKey::Missing).unwrap();
        assert_eq!(c.gaps.len(), 1, "{c:?}");
        assert_eq!(c.gaps[0].status, GapStatus::Missing);
    }
}
