//! The audit trail: one JSON line per connection attempt in
//! `~/.airlock/logs/<repo>/audit-<YYYY-MM-DD>.jsonl`, the in-flight journal that makes a crash
//! visible, settlement of journals left by dead writers, and the reader behind `airlock logs`
//! (DESIGN §5, SECURITY §5). `docs/audit-format.md` is the field reference.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::policy::{LayerKind, Reason};

pub mod check;
mod files;
mod format;
mod journal;
pub mod logdir;
mod reader;
pub mod retention;
pub mod root;
mod settle;
pub mod volume;
mod writer;

pub(crate) use files::dated_files;
pub use files::{Clock, JsonlAppender, MAX_RECORD, SystemClock, append_record, audit_files};
#[cfg(test)]
pub(crate) use format::tests::sample as test_sample_line;
pub use format::{
    MAX_LINE, console_line, encode_line, escape_for_terminal, fit_line, format_host_port,
    text_from_bytes,
};
pub use journal::{Journal, JournalRecord};
pub use reader::{Entry, Follower, read_dir};
pub use settle::{SettleReport, settle_all, settle_journals};
pub use writer::{FileAuditSink, LogRegistry, RepoLog, SessionInfo, StopNotice};

/// One audit line. Field names and meanings are a public contract (`docs/audit-format.md`);
/// the first eight are the product page's format, the rest are ours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditLine {
    /// Attempt start, RFC 3339 with milliseconds, UTC (`2026-07-24T18:03:11.482Z`).
    pub ts: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    pub repo: String,
    pub host: String,
    /// `CONNECT`, or the HTTP method of a plain-HTTP request.
    pub method: String,
    pub allowed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_sent: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes_recv: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Unique per line: `<session>-<boot>-<seq>` is not required; any globally unique string.
    pub id: String,
    /// Globally unique session id.
    pub session: String,
    /// The writer instance (daemon boot or standalone proxy run).
    pub boot: String,
    /// Per (session, boot), from 1, assigned at attempt start.
    pub seq: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The address actually dialed (`ip:port`), for allowed attempts that got that far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_path: Option<String>,
    /// The checkout's repo key (`<repo>-<8 hex>`): tells two checkouts of one name apart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo_key: Option<String>,
    /// Plain-HTTP requests: the absolute-form target (length-capped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Plain-HTTP requests: the upstream's status code.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layer: Option<LayerKind>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    /// Set on lines settled from a journal left by a writer that died.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupted: Option<bool>,
    /// Set when a hostile or oversized field was cut to fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated: Option<bool>,
    /// A `suppressed` line ([`volume`]): the exact `seq` values of the identical refusals it
    /// stands for, as inclusive `[from, to]` ranges in increasing order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seqs: Option<Vec<[u64; 2]>>,
    /// A `suppressed` line: how many attempts `seqs` holds (the sum of the ranges' sizes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// How a connection that did not ask the proxy reached it (`"transparent"`: redirected
    /// inside the sandbox, its destination recovered from conntrack). Unset for the explicit
    /// proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<Capture>,
    /// DNS lines (`method: "DNS"`): the query type (`A`, `AAAA`, `HTTPS`, `TYPE99`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qtype: Option<String>,
    /// DNS lines: what the resolver answered — the synthetic address, `NXDOMAIN`, `NODATA`,
    /// `SERVFAIL`, `REFUSED` or `FORMERR`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The policy entry that decided, as written in its file (allowed and denied lines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// `private_address` / `blocked_address` / `review_plane` answer refusals: the resolved
    /// answers the address guard refused (at most [`MAX_REFUSED_ADDRS`], `ip` form).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_addrs: Option<Vec<String>>,
    /// `sni_mismatch` / `sni_missing` lines: the SNI the agent's ClientHello carried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sni: Option<String>,
    /// `inbound` lines (`method: "INBOUND"`): the host-side client of a `--port`, `ip:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// `inbound` lines: the host address the client connected to, `ip:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// A held attempt's gate (docs/gates.md): on each step line and on the attempt's final
    /// line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateRecord>,
    /// The phase in force when the attempt started (`[phase.NAME.network]`): on every line
    /// of an attempt decided under a phase; on a `phase` line (`method: "PHASE"`), the phase
    /// switched to (absent: back to the plain `[network]` lists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// `phase` lines: the phase in force before the switch (absent: the plain lists).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// `phase` lines: who switched — `start` (`airlock run --phase`) or `cli`
    /// (`airlock phase set`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
}

/// The `gate` object of an audit line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateRecord {
    /// The gate's id (`airlock gate show ID`).
    pub id: String,
    pub step: GateStep,
    /// `sha256:<hex>` of the canonical action: what a decision was bound to.
    pub digest: String,
    pub severity: crate::gate::Severity,
    /// `requested` lines: the held attempt's method (the step line's own is `GATE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// `requested` lines: when the gate expires unless decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// `approved`/`denied` lines: who decided, and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// The decider was the requester (always so without a review server).
    #[serde(rename = "self", default, skip_serializing_if = "Option::is_none")]
    pub self_decided: Option<bool>,
    /// Decided on a review server: the server's id of the gate (`gt_…`), under which its
    /// `gate.*` events and the decider are recorded there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
}

impl GateRecord {
    /// The record as the attempt's own final line carries it: which gate, its last step and
    /// digest; who decided and why are on the step line (this keeps the final line's other
    /// evidence, such as `sni`, within the line cap).
    pub fn on_final_line(&self) -> Self {
        Self {
            deadline: None,
            method: None,
            by: None,
            decided_at: None,
            note: None,
            server: None,
            ..self.clone()
        }
    }
}

/// One step of a gate's life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GateStep {
    Requested,
    Approved,
    Denied,
    Expired,
    /// The session ended, the daemon stopped or the agent closed the connection first.
    Abandoned,
}

impl GateStep {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Requested => "requested",
            Self::Approved => "approved",
            Self::Denied => "denied",
            Self::Expired => "expired",
            Self::Abandoned => "abandoned",
        }
    }
}

/// At most this many refused answers are listed in `refused_addrs`.
pub const MAX_REFUSED_ADDRS: usize = 8;

/// The `capture` field of an audit line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Capture {
    /// A TCP connection to a non-loopback address, redirected to the capture listener.
    Transparent,
}

impl AuditLine {
    /// A new attempt's line: `ts` and `stamp` as given, `host`, `port`, `method`, `allowed:
    /// false`, and every optional field unset. Attribution (`repo`, `user_id`, `repo_path`) is
    /// the caller's to fill in, e.g. `AuditLine { repo, ..AuditLine::attempt(…) }`.
    pub fn attempt(ts: String, stamp: Stamp, host: &str, port: Option<u16>, method: &str) -> Self {
        Self {
            ts,
            user_id: None,
            repo: String::new(),
            host: host.to_owned(),
            method: method.to_owned(),
            allowed: false,
            bytes_sent: None,
            bytes_recv: None,
            duration_ms: None,
            id: stamp.id,
            session: stamp.session,
            boot: stamp.boot,
            seq: stamp.seq,
            port,
            addr: None,
            repo_path: None,
            repo_key: None,
            url: None,
            status: None,
            reason: None,
            layer: None,
            policy: None,
            interrupted: None,
            truncated: None,
            seqs: None,
            count: None,
            capture: None,
            qtype: None,
            answer: None,
            rule: None,
            refused_addrs: None,
            sni: None,
            peer: None,
            listen: None,
            gate: None,
            phase: None,
            previous: None,
            by: None,
        }
    }
}

/// Where the proxy sends its records. Implementations must be cheap to call from many tasks.
///
/// Ordering contract (DESIGN §5): a denial is `append`ed before the refusal is sent; an allowed
/// attempt is `journal_open`ed before anything is forwarded (an error means 503, nothing
/// forwarded) and `journal_close`d with its final line when it ends (the line is appended to the
/// audit file and the journal record is marked done; on error the journal record stays, so a
/// later writer settles it as interrupted).
pub trait AuditSink: Send + Sync {
    /// Fresh `id`, `seq` (per session and boot, from 1), `session` and `boot` for a new attempt.
    fn stamp(&self) -> Stamp;
    /// Appends a finished line (denials, malformed requests) with one `write(2)`.
    fn append(&self, line: &AuditLine) -> Result<(), AuditError>;
    /// Records an allowed attempt as in flight.
    fn journal_open(&self, line: &AuditLine) -> Result<(), AuditError>;
    /// Writes the attempt's final line and retires its journal record.
    fn journal_close(&self, line: &AuditLine) -> Result<(), AuditError>;
    /// Writes the `suppressed` summaries whose interval has ended ([`volume`]); the proxy
    /// calls it about once a second. Sinks without rate limiting have nothing to do.
    fn tick(&self) -> Result<(), AuditError> {
        Ok(())
    }
    /// Writes every pending `suppressed` summary now (session end, shutdown drain), so no
    /// count is lost.
    fn flush(&self) -> Result<(), AuditError> {
        Ok(())
    }
    /// Whether this session's refusals are being suppressed right now (within the current or
    /// the previous interval): the session floods, and the proxy paces its accepts
    /// ([`crate::proxy::FLOOD_ACCEPT_PACE`]) so one session's flood cannot take the CPU other
    /// sessions need. Sinks without rate limiting never flood.
    fn flooding(&self) -> bool {
        false
    }
}

/// Identifiers for one attempt, assigned when it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub id: String,
    pub session: String,
    pub boot: String,
    pub seq: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error(
        "cannot write audit log {path}: {source}; check the directory's permissions and free space"
    )]
    Write {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("audit line for {id} does not fit in one write ({len} bytes)")]
    TooLarge { id: String, len: usize },
    /// The in-flight journal could not be created, locked, written or read.
    #[error(
        "cannot use audit journal {path}: {source}; check the directory's permissions and free space"
    )]
    Journal {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The session was stopped (`audit_budget`, `low_space`): nothing more is forwarded.
    #[error("{detail}")]
    Stopped { reason: crate::policy::Reason, detail: String },
    /// Too little free space to start a session.
    #[error(
        "refusing to start the session: only {free} bytes are free on the file system of {}, \
         below [audit] min_free ({min} bytes); free some space (or lower min_free in \
         ~/.airlock/config.toml) and start again",
        path.display()
    )]
    LowSpace { path: std::path::PathBuf, free: u64, min: u64 },
    /// An audit, journal or session file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// `ts` format: RFC 3339, milliseconds, UTC, `Z` suffix (`2026-07-24T18:03:11.482Z`), from
/// the crate's one formatter.
pub use crate::timefmt::rfc3339_ms;

/// The UTC date of `t` as `YYYY-MM-DD`: the date part of audit and session file names.
pub fn utc_date(t: SystemTime) -> String {
    let dt = time::OffsetDateTime::from(t.max(SystemTime::UNIX_EPOCH));
    format!("{:04}-{:02}-{:02}", dt.year(), u8::from(dt.month()), dt.day())
}

/// A fresh 128-bit random id as 32 lowercase hex digits (session ids, line-id prefixes).
pub fn new_id() -> String {
    let mut buf = [0u8; 16];
    if getrandom::fill(&mut buf).is_err() {
        // getrandom(2) does not fail on Linux ≥ 3.17 once the pool is initialised; should it
        // ever, fall back to a hash of the clock, pid and a process-wide counter, which is still
        // unique per process (ids need uniqueness, not secrecy).
        use sha2::{Digest, Sha256};
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let digest = Sha256::digest(format!("{:?}:{}:{n}", now, std::process::id()));
        buf.copy_from_slice(&digest[..16]);
    }
    hex::encode(buf)
}

/// A fresh writer-instance id (`boot`): also names the writer's `journal-<boot>.jsonl`.
pub fn new_boot_id() -> String {
    new_id()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_ms_matches_the_page_format() {
        // 2026-07-24T18:03:11.482Z
        let t = SystemTime::UNIX_EPOCH + Duration::from_millis(1_784_916_191_482);
        assert_eq!(rfc3339_ms(t), "2026-07-24T18:03:11.482Z");
        assert_eq!(utc_date(t), "2026-07-24");
        assert_eq!(rfc3339_ms(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    }

    const FORMAT_DOC: &str = include_str!("../../docs/audit-format.md");

    /// The reason table of docs/audit-format.md is exactly the closed list.
    #[test]
    fn every_reason_code_is_documented_with_its_status() {
        let section = FORMAT_DOC
            .split("## Reason codes")
            .nth(1)
            .and_then(|s| s.split("\n## ").next())
            .unwrap_or_default();
        let rows: Vec<&str> =
            section.lines().filter_map(|l| l.strip_prefix("| `")?.split('`').next()).collect();
        let codes: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(rows, codes, "docs/audit-format.md reason table vs policy::Reason::ALL");
        for reason in Reason::ALL {
            let json = serde_json::to_string(reason).unwrap_or_default();
            assert_eq!(json, format!("\"{reason}\""), "serde name of {reason:?}");
        }
    }

    /// Every field an audit line can carry is in the field table.
    #[test]
    fn every_field_is_documented() {
        let mut line = format::tests::sample();
        line.url = Some(String::new());
        line.status = Some(200);
        line.interrupted = Some(true);
        line.truncated = Some(true);
        line.seqs = Some(vec![[1, 2]]);
        line.count = Some(2);
        line.qtype = Some("A".into());
        line.answer = Some("NXDOMAIN".into());
        line.capture = Some(Capture::Transparent);
        line.refused_addrs = Some(vec!["127.0.0.3".into()]);
        line.sni = Some("example.test".into());
        let value = serde_json::to_value(&line).unwrap_or_default();
        let fields = value.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
        let fields = fields.unwrap_or_default();
        assert_eq!(fields.len(), 32, "{fields:?}");
        for field in fields {
            assert!(FORMAT_DOC.contains(&format!("| `{field}` |")), "{field} undocumented");
        }
    }

    #[test]
    fn ids_are_hex_and_distinct() {
        let a = new_id();
        let b = new_id();
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
        assert_ne!(new_boot_id(), new_boot_id());
    }
}
