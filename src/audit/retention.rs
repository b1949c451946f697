//! Log retention (`[logs] keep`, managed and user layers only): the daemon deletes whole dated
//! files (`audit-<YYYY-MM-DD>.jsonl`, `sessions-<YYYY-MM-DD>.jsonl`) of one log directory whose
//! whole day lies before the window, when a session of that checkout starts. It never deletes a
//! journal, never a dated file on or after the day of any unsettled journal entry (settlement
//! looks for the entry's id in the audit files, and a reader shows it as in flight), and never
//! a line not yet published ([`published_through`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::journal::{journal_boot, pending_records};
use super::{AuditError, utc_date};

/// How far back a published copy of the log reaches, as far as retention is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublishedThrough {
    /// Every line is published (or nothing is configured to publish it): the window alone
    /// decides.
    Everything,
    /// Lines are published up to and including this UTC date (`YYYY-MM-DD`); later files stay.
    Through(String),
}

/// How far the log directory `dir` (`~/.airlock/logs/<name>/`) has been published, from the
/// publisher's progress record (`~/.airlock/publish/state.json`, [`crate::publish::state`]):
/// without a review-plane login nothing waits for publication ([`PublishedThrough::Everything`]);
/// with one, the latest UTC date whose files (and every earlier one) are published to their
/// end, so retention never deletes an unpublished line. Reads no token.
pub fn published_through(dir: &Path) -> PublishedThrough {
    // `~/.airlock/logs/<name>` → `~/.airlock`.
    let Some(airlock_dir) = dir.parent().and_then(Path::parent) else {
        return PublishedThrough::Everything;
    };
    if !crate::publish::state::logged_in(airlock_dir) {
        return PublishedThrough::Everything;
    }
    match crate::publish::state::published_through_date(airlock_dir, dir) {
        Some(date) => PublishedThrough::Through(date),
        // Nothing published yet: every dated file is later than this.
        None => PublishedThrough::Through("0000-00-00".into()),
    }
}

/// `keep` as written: a whole number followed by `d` (days) or `h` (hours), at least `1h`.
pub fn parse_keep(s: &str) -> Result<Duration, String> {
    let bad = || {
        format!(
            "{s:?} is not a retention period: write a whole number of days or hours, like \"90d\" \
             or \"36h\""
        )
    };
    let t = s.trim();
    let (num, secs) = if let Some(n) = t.strip_suffix('d') {
        (n, 86_400u64)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3_600)
    } else {
        return Err(bad());
    };
    if num.is_empty() || !num.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let n: u64 = num.parse().map_err(|_| bad())?;
    if n == 0 {
        return Err(format!(
            "{s:?} would delete every log as soon as it is written; keep at least 1h"
        ));
    }
    // 100 000 years is "forever" for a log; larger numbers are typos.
    match n.checked_mul(secs).filter(|s| *s <= 100_000 * 365 * 86_400) {
        Some(total) => Ok(Duration::from_secs(total)),
        None => Err(format!("{s:?} is longer than any log can be kept; omit keep to keep forever")),
    }
}

/// What one retention pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionReport {
    pub deleted: Vec<PathBuf>,
    /// Old files kept because an unsettled journal entry or publication needs them.
    pub held: usize,
}

/// The date of a dated file name (`audit-2026-07-24.jsonl`, `sessions-…`), if it is one.
fn dated(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("audit-").or_else(|| name.strip_prefix("sessions-"))?;
    let date = rest.strip_suffix(".jsonl")?;
    let b = date.as_bytes();
    let shape = b.len() == 10
        && b.iter()
            .enumerate()
            .all(|(i, c)| if i == 4 || i == 7 { *c == b'-' } else { c.is_ascii_digit() });
    shape.then_some(date)
}

/// The earliest UTC date of any unsettled entry in `dir`'s journals (live or dead). `Err` when
/// a journal cannot be read or an entry's time is unreadable: then nothing may be deleted.
fn earliest_pending(dir: &Path, names: &[String]) -> Result<Option<String>, AuditError> {
    let mut earliest: Option<String> = None;
    for name in names.iter().filter(|n| journal_boot(n).is_some()) {
        let path = dir.join(name);
        let file = match std::fs::File::open(&path) {
            Ok(f) => f,
            // Settled and deleted since the listing.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(AuditError::Read { path, source }),
        };
        let (open, _bad) = pending_records(&file, &path)?;
        for line in open {
            let date = line.ts.get(..10).filter(|d| dated(&format!("audit-{d}.jsonl")).is_some());
            let Some(date) = date else {
                return Err(AuditError::Read {
                    path,
                    source: std::io::Error::other(format!(
                        "journal entry {} has no readable time",
                        line.id
                    )),
                });
            };
            if earliest.as_deref().is_none_or(|e| date < e) {
                earliest = Some(date.to_owned());
            }
        }
    }
    Ok(earliest)
}

/// Deletes `dir`'s dated files whose whole UTC day ended at or before `now - keep`, except those
/// an unsettled journal entry or `published` still needs.
pub fn apply(
    dir: &Path,
    keep: Duration,
    now: SystemTime,
    published: &PublishedThrough,
) -> Result<RetentionReport, AuditError> {
    let mut report = RetentionReport::default();
    let names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries.flatten().filter_map(|e| e.file_name().into_string().ok()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(report),
        Err(source) => return Err(AuditError::Read { path: dir.to_owned(), source }),
    };
    // A file of day D holds nothing newer than the window's start iff D < the start's date.
    let window_start = utc_date(now.checked_sub(keep).unwrap_or(SystemTime::UNIX_EPOCH));
    let old: Vec<&String> =
        names.iter().filter(|n| dated(n).is_some_and(|d| d < window_start.as_str())).collect();
    if old.is_empty() {
        return Ok(report);
    }
    let pending = earliest_pending(dir, &names)?;
    for name in old {
        let Some(date) = dated(name) else { continue };
        let needed_by_journal = pending.as_deref().is_some_and(|p| date >= p);
        let unpublished = match published {
            PublishedThrough::Everything => false,
            PublishedThrough::Through(through) => date > through.as_str(),
        };
        if needed_by_journal || unpublished {
            report.held += 1;
            continue;
        }
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => report.deleted.push(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(AuditError::Write { path, source }),
        }
    }
    report.deleted.sort();
    Ok(report)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const DAY: u64 = 86_400;

    fn at(date: &str) -> SystemTime {
        let d = time::Date::parse(date, time::macros::format_description!("[year]-[month]-[day]"))
            .unwrap();
        SystemTime::UNIX_EPOCH
            + Duration::from_secs(d.midnight().assume_utc().unix_timestamp() as u64)
    }

    fn touch(dir: &Path, name: &str) {
        std::fs::write(dir.join(name), "{}\n").unwrap();
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn keep_accepts_days_and_hours_only() {
        assert_eq!(parse_keep("90d").unwrap(), Duration::from_secs(90 * DAY));
        assert_eq!(parse_keep("36h").unwrap(), Duration::from_secs(36 * 3600));
        for bad in ["", "d", "90", "90 days", "-1d", "1.5d", "0d", "90m", "1w", "99999999999999d"] {
            assert!(parse_keep(bad).is_err(), "{bad:?}");
        }
        assert!(parse_keep("0h").unwrap_err().contains("at least 1h"));
    }

    proptest! {
        #[test]
        fn keep_parser_never_panics_and_round_trips(s in ".{0,12}", n in 1u64..100_000) {
            let _ = parse_keep(&s);
            prop_assert_eq!(parse_keep(&format!("{n}d")).unwrap(), Duration::from_secs(n * DAY));
        }
    }

    #[test]
    fn deletes_whole_old_days_only() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        for n in [
            "audit-2026-01-01.jsonl",
            "audit-2026-01-09.jsonl",
            "audit-2026-01-10.jsonl",
            "audit-2026-01-11.jsonl",
            "sessions-2026-01-01.jsonl",
            "journal-live.jsonl",
            ".repo-path",
            "audit-notadate.jsonl",
        ] {
            touch(d, n);
        }
        // Window of 10 days from 2026-01-20 12:00 starts 2026-01-10 12:00: the 10th stays.
        let now = at("2026-01-20") + Duration::from_secs(DAY / 2);
        let r = apply(d, Duration::from_secs(10 * DAY), now, &PublishedThrough::Everything);
        let r = r.unwrap();
        assert_eq!(r.deleted.len(), 3, "{r:?}");
        assert_eq!(
            names(d),
            [
                ".repo-path",
                "audit-2026-01-10.jsonl",
                "audit-2026-01-11.jsonl",
                "audit-notadate.jsonl",
                "journal-live.jsonl"
            ]
        );
    }

    #[test]
    fn unsettled_journal_entries_and_unpublished_days_are_held() {
        let tmp = tempfile::tempdir().unwrap();
        let d = tmp.path();
        for n in ["audit-2026-01-01.jsonl", "audit-2026-01-05.jsonl", "audit-2026-01-07.jsonl"] {
            touch(d, n);
        }
        let mut line = crate::audit::test_sample_line();
        line.ts = "2026-01-05T10:00:00.000Z".into();
        let rec = crate::audit::JournalRecord::Open { id: "x-1".into(), line: Box::new(line) };
        let mut text = serde_json::to_string(&rec).unwrap();
        text.push('\n');
        std::fs::write(d.join("journal-dead.jsonl"), text).unwrap();
        let now = at("2026-03-01");
        let keep = Duration::from_secs(DAY);
        let r = apply(d, keep, now, &PublishedThrough::Through("2026-01-06".into())).unwrap();
        // The 1st goes; the 5th is needed by the open entry; the 7th is not published yet.
        assert_eq!(r.deleted, vec![d.join("audit-2026-01-01.jsonl")]);
        assert_eq!(r.held, 2);
        assert!(d.join("journal-dead.jsonl").exists());
        // Once the entry is closed the 5th may go; publication still holds the 7th.
        let close = serde_json::to_string(&crate::audit::JournalRecord::Close { id: "x-1".into() });
        let mut f = std::fs::OpenOptions::new().append(true).open(d.join("journal-dead.jsonl"));
        use std::io::Write;
        writeln!(f.as_mut().unwrap(), "{}", close.unwrap()).unwrap();
        let r = apply(d, keep, now, &PublishedThrough::Through("2026-01-06".into())).unwrap();
        assert_eq!(r.deleted, vec![d.join("audit-2026-01-05.jsonl")]);
        assert_eq!(published_through(d), PublishedThrough::Everything);
    }

    #[test]
    fn with_a_server_login_only_published_days_go() {
        let tmp = tempfile::tempdir().unwrap();
        let air = tmp.path().join(".airlock");
        let dir = air.join("logs/r");
        std::fs::create_dir_all(&dir).unwrap();
        touch(&dir, "audit-2026-01-01.jsonl");
        touch(&dir, "audit-2026-01-02.jsonl");
        assert_eq!(published_through(&dir), PublishedThrough::Everything);
        std::fs::write(
            air.join("identity.toml"),
            "email = \"a@b\"\nuser_id = \"u\"\nserver = \"https://r.test:8443\"\n",
        )
        .unwrap();
        assert_eq!(published_through(&dir), PublishedThrough::Through("0000-00-00".into()));
        let mut st = crate::publish::state::State::default();
        st.files.insert(
            dir.join("audit-2026-01-01.jsonl").to_string_lossy().into_owned(),
            crate::publish::state::FileState { offset: 3, ..Default::default() },
        );
        st.save(&air).unwrap();
        assert_eq!(published_through(&dir), PublishedThrough::Through("2026-01-01".into()));
        let r = apply(&dir, Duration::from_secs(DAY), at("2026-02-01"), &published_through(&dir))
            .unwrap();
        assert_eq!(r.deleted, [dir.join("audit-2026-01-01.jsonl")]);
        assert_eq!(r.held, 1);
    }
}
