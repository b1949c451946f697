//! Session audit roots (docs/evidence.md, "Session audit roots"): the RFC 9162 Merkle root over
//! one session's audit lines, signed with this machine's key and written in the session's end
//! record as `audit_root`, so that an audit line edited, removed or added after the session
//! ended is evident (`airlock verify --local`, [`super::check`]).
//!
//! - **Leaves:** every audit line of the session as written (its bytes without the newline),
//!   leaf hash `SHA-256(0x00 || line)`. An audit line is a JSON object with `session`, `boot`,
//!   `seq` and a top-level `allowed` ([`leaf_line`]); a line that is not (a fragment of a
//!   short write) is no leaf, on both sides.
//! - **Order:** by `boot` (bytewise), then `seq`, then leaf hash: a function of the set of
//!   lines alone, whatever file a line landed in or in which order it was written (a tunnel's
//!   line is written at its close, long after later attempts'; a gate's steps share their
//!   attempt's `seq`; a daemon restart adds a second `boot`).
//! - **Note:** `airlock-audit/v1\nsession <id>\nlines <N>\nroot <b64>\n`, signed as a C2SP
//!   signed note ([`crate::tlog::note`]).
//!
//! The root is computed from the files when the session ends ([`seal`]), not kept in memory as
//! lines are written: one session's lines can come from more than one writer (a daemon that
//! restarts mid-session re-registers it under a new `boot`; settlement writes a dead writer's
//! open attempts as `interrupted` lines), and a tunnel's line lands after lines with higher
//! `seq`s, so only the files hold the whole, ordered set.

use std::collections::HashMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::AuditError;
use super::files::{audit_files, dated_files, for_each_line, rfind_line};
use super::journal::{journal_boot, pending_records};
use super::settle::day_before;
use crate::tlog::merkle::{CompactRange, Hash, leaf_hash};
use crate::tlog::note::{NoteError, NoteSigner};
use crate::tlog::{b64, hash_from_b64};

/// The first line of an audit-root note.
pub const NOTE_ORIGIN: &str = "airlock-audit/v1";

/// The `audit_root` of a session's end record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditRoot {
    /// How many audit lines the root covers.
    pub lines: u64,
    /// The RFC 9162 root, standard base64.
    pub hash: String,
    /// The signing machine's verifier key (`<name>+<id>+<base64>`).
    pub key: String,
    /// The signed note ([`note_text`] and its signature line).
    pub note: String,
}

#[derive(Debug, thiserror::Error)]
pub enum RootError {
    #[error(transparent)]
    Read(#[from] AuditError),
    #[error(
        "{count} attempt(s) of the session are still open in a journal of {dir}: their lines \
         come later, so the session's lines are not complete yet"
    )]
    InFlight { count: usize, dir: std::path::PathBuf },
    #[error("cannot sign the audit root: {0}")]
    Sign(#[from] NoteError),
    #[error("malformed audit-root note: {0}")]
    BadNote(String),
}

/// What the root computation reads of an audit line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafLine {
    pub session: String,
    pub boot: String,
    pub seq: u64,
    /// A `suppressed` line's exact `seq` ranges.
    pub seqs: Option<Vec<[u64; 2]>>,
    /// `tlog::leaf_hash` of the line's bytes.
    pub leaf: Hash,
}

#[derive(Deserialize)]
struct Fields {
    session: String,
    boot: String,
    seq: u64,
    // Present on every audit line and on nothing else (DESIGN §5); its value does not matter.
    #[allow(dead_code)]
    allowed: bool,
    #[serde(default)]
    seqs: Option<Vec<[u64; 2]>>,
}

/// `line` (one line of an audit file, with or without its newline) as a leaf, if it is an
/// audit line. The one rule both the daemon and `airlock verify --local` apply.
pub fn leaf_line(line: &[u8]) -> Option<LeafLine> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let f: Fields = serde_json::from_slice(line).ok()?;
    Some(LeafLine {
        session: f.session,
        boot: f.boot,
        seq: f.seq,
        seqs: f.seqs,
        leaf: leaf_hash(line),
    })
}

/// One session's leaves, collected in any order; [`Leaves::finish`] orders them and computes
/// the root. Memory: one boot index, `seq` and hash (44 bytes) per line.
#[derive(Debug, Default, Clone)]
pub struct Leaves {
    boots: Vec<String>,
    index: HashMap<String, u32>,
    items: Vec<(u32, u64, Hash)>,
}

impl Leaves {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn push(&mut self, boot: &str, seq: u64, leaf: Hash) {
        let b = match self.index.get(boot) {
            Some(b) => *b,
            None => {
                let b = self.boots.len() as u32;
                self.boots.push(boot.to_owned());
                self.index.insert(boot.to_owned(), b);
                b
            }
        };
        self.items.push((b, seq, leaf));
    }

    pub fn len(&self) -> u64 {
        self.items.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The number of leaves and their root, in (boot, seq, leaf hash) order.
    pub fn finish(mut self) -> (u64, Hash) {
        let mut order: Vec<u32> = (0..self.boots.len() as u32).collect();
        order.sort_by(|a, b| {
            self.boots[*a as usize].as_bytes().cmp(self.boots[*b as usize].as_bytes())
        });
        let mut rank = vec![0u32; order.len()];
        for (r, b) in order.iter().enumerate() {
            rank[*b as usize] = r as u32;
        }
        self.items.sort_unstable_by(|x, y| {
            (rank[x.0 as usize], x.1, x.2).cmp(&(rank[y.0 as usize], y.1, y.2))
        });
        let mut tree = CompactRange::new();
        for (_, _, leaf) in &self.items {
            tree.push(*leaf);
        }
        (tree.size(), tree.root())
    }
}

/// The leaves of `session` in the audit files of `dir`, as [`leaf_line`] sees them. Lines that
/// do not hold the session id's bytes are skipped unparsed (ids are `[A-Za-z0-9_-]`; a line
/// whose writer escaped it is not one the daemon wrote, and `airlock verify` then finds it).
/// Files dated more than a day before the session's start record are not read: every line of
/// the session was written after it (the day covers a clock stepped back over midnight).
pub fn session_leaves(dir: &Path, session: &str) -> Result<Leaves, AuditError> {
    let since = start_date(dir, session)?.map(|d| day_before(&d));
    let finder = finder(dir, session)?;
    let mut leaves = Leaves::new();
    for (date, path) in audit_files(dir)? {
        if since.as_deref().is_some_and(|s| date.as_str() < s) {
            continue;
        }
        let Some(file) = open_if_there(&path)? else { continue };
        for_each_line(file, &path, |buf| {
            if !finder.is_match(buf) {
                return;
            }
            if let Some(l) = leaf_line(buf).filter(|l| l.session == session) {
                leaves.push(&l.boot, l.seq, l.leaf);
            }
        })?;
    }
    Ok(leaves)
}

fn finder(dir: &Path, needle: &str) -> Result<aho_corasick::AhoCorasick, AuditError> {
    aho_corasick::AhoCorasick::new([needle])
        .map_err(|e| AuditError::Read { path: dir.to_owned(), source: std::io::Error::other(e) })
}

/// `path` opened for reading; `None` if it is gone (removed by retention since the listing).
fn open_if_there(path: &Path) -> Result<Option<std::fs::File>, AuditError> {
    match std::fs::File::open(path) {
        Ok(f) => Ok(Some(f)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(AuditError::Read { path: path.to_owned(), source }),
    }
}

/// The date of the session file that holds `session`'s start record, if one is left (newest
/// files first: a session ends soon after it starts, mostly).
fn start_date(dir: &Path, session: &str) -> Result<Option<String>, AuditError> {
    let id = format!("{session}:start");
    let finder = finder(dir, &format!("\"{id}\""))?;
    for (date, path) in dated_files(dir, "sessions")?.into_iter().rev() {
        let Some(file) = open_if_there(&path)? else { continue };
        // From the end of the file: the start record is among the last ones when the session
        // ends, so this does not read the whole day's records at every session's end.
        let found = rfind_line(&file, &path, |buf| {
            if !finder.is_match(buf) {
                return false;
            }
            let rec: Option<serde_json::Value> = serde_json::from_slice(buf).ok();
            rec.is_some_and(|r| r.get("id").and_then(|i| i.as_str()) == Some(id.as_str()))
        })?;
        if found {
            return Ok(Some(date));
        }
    }
    Ok(None)
}

/// Attempts of `session` still open (no close marker) in any journal of `dir`: their lines are
/// yet to be written (by their writer, or by settlement once it is gone).
pub fn open_attempts(dir: &Path, session: &str) -> Result<usize, AuditError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(source) => return Err(AuditError::Read { path: dir.to_owned(), source }),
    };
    let mut open = 0;
    for entry in entries.flatten() {
        if entry.file_name().to_str().and_then(journal_boot).is_none() {
            continue;
        }
        let path = entry.path();
        // Settled and deleted since the listing: nothing open there.
        let Ok(file) = std::fs::File::open(&path) else { continue };
        let (records, _bad) = pending_records(&file, &path)?;
        open += records.iter().filter(|l| l.session == session).count();
    }
    Ok(open)
}

/// The note text for `session`'s root.
pub fn note_text(session: &str, lines: u64, root: &Hash) -> String {
    format!("{NOTE_ORIGIN}\nsession {session}\nlines {lines}\nroot {}\n", b64(root))
}

/// What an audit-root note's text says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoteBody {
    pub session: String,
    pub lines: u64,
    pub root: Hash,
}

/// Parses [`note_text`]'s format (exactly those four lines).
pub fn parse_note_text(text: &str) -> Result<NoteBody, RootError> {
    let bad = |m: &str| RootError::BadNote(m.to_owned());
    let mut it = text.strip_suffix('\n').ok_or_else(|| bad("no final newline"))?.split('\n');
    if it.next() != Some(NOTE_ORIGIN) {
        return Err(bad(&format!("the first line is not {NOTE_ORIGIN}")));
    }
    let mut field = |name: &str| {
        it.next()
            .and_then(|l| l.strip_prefix(name))
            .and_then(|l| l.strip_prefix(' '))
            .map(str::to_owned)
            .ok_or_else(|| bad(&format!("no {name} line")))
    };
    let session = field("session")?;
    let lines = field("lines")?;
    let root = field("root")?;
    if it.next().is_some() {
        return Err(bad("more than four lines"));
    }
    let lines = lines
        .parse::<u64>()
        .ok()
        .filter(|_| lines.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| bad("the lines count is not a number"))?;
    let root = hash_from_b64(&root).ok_or_else(|| bad("the root is not a base64 SHA-256"))?;
    Ok(NoteBody { session, lines, root })
}

/// The session's root over the lines in `dir`, signed with `signer`. Refuses while an attempt
/// of the session is still open in a journal (its line would land after the root).
pub fn seal(dir: &Path, session: &str, signer: &NoteSigner) -> Result<AuditRoot, RootError> {
    let count = open_attempts(dir, session)?;
    if count > 0 {
        return Err(RootError::InFlight { count, dir: dir.to_owned() });
    }
    let (lines, root) = session_leaves(dir, session)?.finish();
    let note = signer.sign_note(&note_text(session, lines, &root))?;
    Ok(AuditRoot { lines, hash: b64(&root), key: signer.verifier().to_string(), note })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::audit::writer::tests::info;
    use crate::audit::{AuditSink, RepoLog, SessionInfo};
    use crate::tlog::merkle::root;
    use crate::tlog::note::Note;

    fn line(session: &str, boot: &str, seq: u64, extra: &str) -> String {
        format!(
            r#"{{"ts":"t","repo":"r","host":"h","method":"CONNECT","allowed":false,"id":"i{seq}","session":"{session}","boot":"{boot}","seq":{seq}{extra}}}"#
        )
    }

    #[test]
    fn only_audit_lines_are_leaves_and_the_leaf_is_the_line_without_its_newline() {
        let l = line("s", "b", 3, "");
        let got = leaf_line(format!("{l}\n").as_bytes()).unwrap();
        assert_eq!((got.session.as_str(), got.boot.as_str(), got.seq), ("s", "b", 3));
        assert_eq!(got.leaf, leaf_hash(l.as_bytes()));
        assert_eq!(leaf_line(l.as_bytes()).unwrap().leaf, got.leaf);
        // Session records, journal records, fragments and blank lines are not.
        assert!(leaf_line(br#"{"id":"s:end","kind":"end","session":"s","boot":"b"}"#).is_none());
        assert!(leaf_line(br#"{"journal":"open","id":"x","line":{"allowed":true}}"#).is_none());
        assert!(leaf_line(&l.as_bytes()[..l.len() - 1]).is_none());
        assert!(leaf_line(b"\n").is_none());
        let sup = line("s", "b", 5, r#","seqs":[[5,9]],"count":5"#);
        assert_eq!(leaf_line(sup.as_bytes()).unwrap().seqs, Some(vec![[5, 9]]));
    }

    #[test]
    fn the_order_is_boot_then_seq_then_hash_whatever_the_input_order() {
        let hs: Vec<Hash> = (0..6u8).map(|i| leaf_hash(&[i])).collect();
        let pushes = [("b2", 1, hs[0]), ("b1", 2, hs[1]), ("b1", 1, hs[2]), ("b1", 2, hs[3])];
        let mut a = Leaves::new();
        for (b, s, h) in pushes {
            a.push(b, s, h);
        }
        let mut z = Leaves::new();
        for (b, s, h) in pushes.iter().rev() {
            z.push(b, *s, *h);
        }
        let (n, ra) = a.finish();
        assert_eq!(n, 4);
        assert_eq!(z.finish().1, ra);
        let (lo, hi) = if hs[1] < hs[3] { (hs[1], hs[3]) } else { (hs[3], hs[1]) };
        assert_eq!(ra, root(&[hs[2], lo, hi, hs[0]]));
        assert_eq!(Leaves::new().finish(), (0, crate::tlog::merkle::empty_root()));
    }

    #[test]
    fn note_text_round_trips_and_refuses_other_shapes() {
        let r = leaf_hash(b"x");
        let t = note_text("abc", 7, &r);
        assert_eq!(t, format!("airlock-audit/v1\nsession abc\nlines 7\nroot {}\n", b64(&r)));
        assert_eq!(
            parse_note_text(&t).unwrap(),
            NoteBody { session: "abc".into(), lines: 7, root: r }
        );
        for bad in [
            t.trim_end().to_owned(),
            t.replace("lines 7", "lines +7"),
            t.replace("airlock-audit/v1", "airlock-audit/v2"),
            format!("{t}extra 1\n"),
            t.replace("root ", "root x"),
        ] {
            assert!(parse_note_text(&bad).is_err(), "{bad:?}");
        }
    }

    /// Lines of two sessions and two boots, written through real sinks (with a gate-like shared
    /// `seq` and a line of another session in between): the sealed root is the RFC 9162 root of
    /// exactly this session's lines in (boot, seq, hash) order, signed over the note text.
    #[test]
    fn seal_roots_the_sessions_lines_across_boots_and_signs_the_note() {
        let tmp = tempfile::tempdir().unwrap();
        let mine = SessionInfo { session: "mine".into(), ..info() };
        for boot in ["zz-boot", "aa-boot"] {
            let log = RepoLog::open(tmp.path(), boot).unwrap();
            let sink = log.session_sink(mine.clone());
            let other = log.session_sink(SessionInfo { session: "other".into(), ..info() });
            for host in ["a.test", "b.test"] {
                let mut l = sink.line(host, Some(443), "CONNECT");
                l.reason = Some(crate::policy::Reason::NotAllowed);
                sink.append(&l).unwrap();
                let mut step = l.clone();
                step.id = format!("{}-gate-requested", l.id);
                sink.append(&step).unwrap();
                other.append(&other.line("o.test", Some(1), "CONNECT")).unwrap();
            }
        }
        let mut mine_lines: Vec<(String, u64, Hash)> = Vec::new();
        for (_, path) in audit_files(tmp.path()).unwrap() {
            for l in std::fs::read_to_string(path).unwrap().lines() {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                if v["session"] == "mine" {
                    let b = v["boot"].as_str().unwrap().to_owned();
                    mine_lines.push((b, v["seq"].as_u64().unwrap(), leaf_hash(l.as_bytes())));
                }
            }
        }
        assert_eq!(mine_lines.len(), 8);
        mine_lines.sort();
        let want = root(&mine_lines.iter().map(|x| x.2).collect::<Vec<_>>());

        let signer = NoteSigner::generate("airlock-machine/test").unwrap();
        let sealed = seal(tmp.path(), "mine", &signer).unwrap();
        assert_eq!(sealed.lines, 8);
        assert_eq!(sealed.hash, b64(&want));
        assert_eq!(sealed.key, signer.verifier().to_string());
        let note = Note::parse(&sealed.note).unwrap();
        note.verify(&signer.verifier()).unwrap();
        assert_eq!(note.text, note_text("mine", 8, &want));
        // A session with no lines has the empty tree's root.
        let none = seal(tmp.path(), "nobody", &signer).unwrap();
        assert_eq!((none.lines, none.hash), (0, b64(&crate::tlog::merkle::empty_root())));
    }

    /// Files dated more than a day before the start record are not read; without a start
    /// record every file is.
    #[test]
    fn files_from_before_the_session_started_are_not_read() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        let l = line("s", "b", 1, "");
        for date in ["2026-07-20", "2026-07-23", "2026-07-24"] {
            std::fs::write(d.join(format!("audit-{date}.jsonl")), format!("{l}\n")).unwrap();
        }
        assert_eq!(session_leaves(d, "s").unwrap().len(), 3);
        let start = r#"{"id":"s:start","kind":"start","session":"s"}"#;
        std::fs::write(d.join("sessions-2026-07-24.jsonl"), format!("{start}\n")).unwrap();
        std::fs::write(d.join("sessions-2026-07-25.jsonl"), "{\"id\":\"t:start\"}\n").unwrap();
        assert_eq!(start_date(d, "s").unwrap().as_deref(), Some("2026-07-24"));
        assert_eq!(session_leaves(d, "s").unwrap().len(), 2);
        assert_eq!(start_date(d, "t").unwrap().as_deref(), Some("2026-07-25"));
        assert_eq!(start_date(d, "u").unwrap(), None);
    }

    #[test]
    fn an_attempt_still_open_in_a_journal_refuses_the_seal() {
        let tmp = tempfile::tempdir().unwrap();
        let log = RepoLog::open(tmp.path(), "b").unwrap();
        let sink = log.session_sink(SessionInfo { session: "s".into(), ..info() });
        let mut open = sink.line("a.test", Some(443), "CONNECT");
        open.allowed = true;
        sink.journal_open(&open).unwrap();
        let signer = NoteSigner::generate("k").unwrap();
        assert!(matches!(
            seal(tmp.path(), "s", &signer),
            Err(RootError::InFlight { count: 1, .. })
        ));
        // Another session's open attempt does not hold this one up.
        assert!(seal(tmp.path(), "t", &signer).is_ok());
        sink.journal_close(&open).unwrap();
        assert_eq!(seal(tmp.path(), "s", &signer).unwrap().lines, 1);
    }
}
