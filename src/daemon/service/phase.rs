//! Phases of a running session (`[phase.NAME.network]`, docs/configuration.md "Phases"): the
//! layers a session started with, kept so a switch uses them as they were trusted then (a repo
//! file edited since is never re-read); the switch itself (`phase_set`), which builds the
//! phase's policy, writes the `phase` audit line and swaps the session's policy whole; and the
//! switches so far, for the end record's `phases`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;

use super::connection::error;
use super::state::{Daemon, blocking, lock};
use crate::audit::{AuditLine, Stamp};
use crate::config::{LayerDoc, ReviewServer};
use crate::policy::Policy;
use crate::protocol::{ErrorCode, Response};
use crate::proxy::SessionProxy;

/// The audit `method` of a phase line.
pub const PHASE_METHOD: &str = "PHASE";

/// The layers a session's policy was built from, as they were at its start.
#[derive(Debug, Default)]
pub(crate) struct PhaseSource {
    pub(crate) managed: Option<Arc<LayerDoc>>,
    pub(crate) user: Option<Arc<LayerDoc>>,
    pub(crate) repo: Option<Arc<LayerDoc>>,
    pub(crate) review: Vec<ReviewServer>,
}

impl PhaseSource {
    /// The session's policy with `phase` in force (`None`: the plain lists), built by the
    /// same code as every other policy. The error says what was wrong and which phases exist.
    pub(crate) fn build(&self, phase: Option<&str>) -> Result<Arc<Policy>, String> {
        crate::config::build_client_policy_in_phase(
            self.managed.as_deref(),
            self.user.as_deref(),
            self.repo.as_deref(),
            &self.review,
            phase,
        )
        .map(|b| Arc::new(b.policy))
        .map_err(|e| e.to_string())
    }

    /// Every phase the layers define (sorted).
    pub(crate) fn defined(&self) -> Vec<String> {
        let docs: Vec<&LayerDoc> =
            [&self.managed, &self.user, &self.repo].into_iter().flatten().map(|d| &**d).collect();
        crate::config::phase::defined_phases(&docs).into_iter().map(|(n, _)| n).collect()
    }
}

/// One entry of the end record's `phases`: a switch (or the phase fixed at start).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PhaseRecord {
    /// The phase switched to; `null`: the plain `[network]` lists.
    pub phase: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous: Option<String>,
    /// `start` or `cli`.
    pub by: String,
    /// When, RFC 3339 UTC with milliseconds (the line's `ts`).
    pub at: String,
    /// The `seq` of its `phase` line.
    pub seq: u64,
}

/// A session's phase state: its layers at start and the switches so far.
#[derive(Debug)]
pub(crate) struct SessionPhases {
    pub(crate) source: PhaseSource,
    /// Held across a whole switch, so two switches of one session are ordered.
    pub(crate) log: Mutex<Vec<PhaseRecord>>,
    /// The phase in force, for the session's own connection: its supervisor is told of each
    /// switch ([`crate::protocol::Response::PhaseChanged`]).
    pub(crate) changed: tokio::sync::watch::Sender<Option<String>>,
    /// Set (under `log`) when the session's end seals its audit root: a switch after it would
    /// write a line outside the rooted ones and report success for a session that is gone.
    pub(crate) ended: AtomicBool,
}

impl SessionPhases {
    pub(crate) fn new(source: PhaseSource) -> Self {
        Self {
            source,
            log: Mutex::default(),
            changed: tokio::sync::watch::channel(None).0,
            ended: AtomicBool::new(false),
        }
    }
}

/// Why a switch did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SwitchError {
    #[error("the session has ended; nothing was switched")]
    Ended,
    #[error("the phase line could not be written, so the phase is unchanged: {0}")]
    Line(String),
}

impl Default for SessionPhases {
    fn default() -> Self {
        Self::new(PhaseSource::default())
    }
}

/// The `phase` audit line (docs/audit-format.md "Phase lines"): attributed like the session's
/// attempts, `method: "PHASE"`, `host` empty, `allowed: false`, `phase` the phase switched to
/// (absent: back to the plain lists), `previous`, `by`.
fn phase_line(
    proxy: &SessionProxy,
    stamp: Stamp,
    phase: Option<&str>,
    previous: Option<&str>,
    by: &str,
) -> AuditLine {
    let id = &proxy.identity;
    AuditLine {
        user_id: id.user_id.clone(),
        repo: id.repo.clone(),
        repo_path: id.repo_path.clone(),
        repo_key: id.repo_key.clone(),
        phase: phase.map(str::to_owned),
        previous: previous.map(str::to_owned),
        by: Some(by.to_owned()),
        ..AuditLine::attempt(
            crate::timefmt::rfc3339_ms(std::time::SystemTime::now()),
            stamp,
            "",
            None,
            PHASE_METHOD,
        )
    }
}

/// Puts `policy` in force on `proxy` and records it: the line first (fail closed), then the
/// swap, then the end record's entry. `start`: the phase fixed at session start (`previous`
/// is then absent: nothing was in force before). Blocking (one append).
pub(crate) fn switch(
    proxy: &SessionProxy,
    phases: &SessionPhases,
    policy: Arc<Policy>,
    start: bool,
) -> Result<PhaseRecord, SwitchError> {
    let mut log = lock(&phases.log);
    if phases.ended.load(Ordering::SeqCst) {
        return Err(SwitchError::Ended);
    }
    let phase = policy.phase().map(str::to_owned);
    let by = if start { "start" } else { "cli" };
    let line = proxy
        .switch_policy(policy, |stamp, previous| {
            let previous = if start { None } else { previous };
            phase_line(proxy, stamp, phase.as_deref(), previous, by)
        })
        .map_err(|e| SwitchError::Line(e.to_string()))?;
    let rec = PhaseRecord {
        phase,
        previous: line.previous.clone(),
        by: by.to_owned(),
        at: line.ts.clone(),
        seq: line.seq,
    };
    log.push(rec.clone());
    phases.changed.send_replace(rec.phase.clone());
    Ok(rec)
}

/// `phase_set`: switches session `id` to `phase` (`None`: the plain lists), with the layers
/// it started with.
pub(super) async fn phase_set(daemon: &Arc<Daemon>, id: &str, phase: Option<String>) -> Response {
    let Some(session) = lock(&daemon.sessions).get(id) else {
        return error(
            ErrorCode::Session,
            format!("no live session {id:?}; `airlock status` lists the live sessions"),
        );
    };
    if let Some(c) = &session.spec.container {
        // Its policy is evaluated in its proxy container, which this switch cannot reach.
        return error(
            ErrorCode::Phase,
            format!(
                "session {id:?} runs in {} containers, whose proxy ({}) fixes its phase at start; \
                 start a new session with --phase instead",
                c.engine, c.proxy
            ),
        );
    }
    if let Some(name) = phase.as_deref()
        && !crate::config::phase::is_phase_name(name)
    {
        return error(
            ErrorCode::Phase,
            format!("{name:?} is not a phase name ({})", crate::config::phase::PHASE_NAME_SYNTAX),
        );
    }
    let s = Arc::clone(&session);
    let done = blocking(move || {
        let policy = s.phases.source.build(phase.as_deref()).map_err(|m| (ErrorCode::Phase, m))?;
        switch(&s.proxy, &s.phases, policy, false).map_err(|e| match e {
            SwitchError::Ended => {
                (ErrorCode::Session, format!("session {:?} has ended; nothing was switched", s.id))
            }
            e @ SwitchError::Line(_) => (ErrorCode::Internal, e.to_string()),
        })
    })
    .await;
    match done {
        Ok(Ok(rec)) => {
            daemon.notify_status();
            Response::PhaseSet {
                session: session.id.clone(),
                phase: rec.phase,
                previous: rec.previous,
                seq: rec.seq,
            }
        }
        Ok(Err((code, m))) => error(code, m),
        Err(e) => error(ErrorCode::Internal, e),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::audit::{AuditError, AuditSink};
    use crate::policy::{LayerKind, LocalAddrs, Reason, canonicalize_host};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    /// Keeps every appended line; fails appends while `fail` is set.
    #[derive(Default)]
    struct Sink {
        seq: AtomicU64,
        fail: AtomicBool,
        lines: Mutex<Vec<AuditLine>>,
    }

    impl AuditSink for Sink {
        fn stamp(&self) -> Stamp {
            let seq = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
            Stamp { id: format!("l{seq}"), session: "s".into(), boot: "b".into(), seq }
        }
        fn append(&self, line: &AuditLine) -> Result<(), AuditError> {
            if self.fail.load(Ordering::SeqCst) {
                return Err(AuditError::TooLarge { id: line.id.clone(), len: 0 });
            }
            lock(&self.lines).push(line.clone());
            Ok(())
        }
        fn journal_open(&self, _: &AuditLine) -> Result<(), AuditError> {
            Ok(())
        }
        fn journal_close(&self, _: &AuditLine) -> Result<(), AuditError> {
            Ok(())
        }
    }

    fn source() -> PhaseSource {
        let user = crate::config::parse_layer(
            LayerKind::User,
            "~/.airlock/config.toml",
            b"[network]\nallow = [\"plain.test\"]\n[phase.build.network]\nallow = [\"build.test\"]\n",
        )
        .unwrap()
        .doc;
        PhaseSource { user: Some(Arc::new(user)), ..Default::default() }
    }

    fn reason(p: &Policy, host: &str) -> Reason {
        p.decide(&canonicalize_host(host).unwrap(), 443, &LocalAddrs::none()).reason
    }

    #[test]
    fn a_switch_writes_its_line_then_swaps_the_policy_whole_and_is_recorded() {
        let src = source();
        assert_eq!(src.defined(), ["build"]);
        let sink = Arc::new(Sink::default());
        let proxy = SessionProxy::new(
            src.build(None).unwrap(),
            sink.clone(),
            Arc::new(crate::proxy::SystemResolver),
            crate::proxy::Limits::default(),
            LocalAddrs::none(),
            crate::proxy::Identity { repo: "r".into(), ..Default::default() },
        );
        let phases = SessionPhases { source: src, ..Default::default() };
        // An attempt that started before the switch keeps its snapshot (and its phase).
        let before = proxy.policy();
        let (first, _) = crate::proxy::respond::begin(&proxy, "build.test", Some(443), "CONNECT");
        assert_eq!(first.phase, None);

        let rec =
            switch(&proxy, &phases, phases.source.build(Some("build")).unwrap(), false).unwrap();
        assert_eq!(
            (rec.phase.as_deref(), rec.previous.as_deref(), rec.seq),
            (Some("build"), None, 2)
        );
        assert_eq!(rec.by, "cli");
        assert_eq!(reason(&before, "build.test"), Reason::NotAllowed);
        assert_eq!(reason(&proxy.policy(), "build.test"), Reason::Allowed);
        let (after, policy) = crate::proxy::respond::begin(&proxy, "build.test", Some(443), "GET");
        assert_eq!((after.seq, after.phase.as_deref()), (3, Some("build")));
        assert_eq!(policy.phase(), Some("build"));
        let line = lock(&sink.lines)[0].clone();
        assert_eq!((line.method.as_str(), line.host.as_str(), line.allowed), ("PHASE", "", false));
        assert_eq!(
            (line.phase.as_deref(), line.by.as_deref(), line.seq),
            (Some("build"), Some("cli"), 2)
        );

        // A line that cannot be written: no switch (fail closed), no record.
        sink.fail.store(true, Ordering::SeqCst);
        let err = switch(&proxy, &phases, phases.source.build(None).unwrap(), false).unwrap_err();
        assert!(err.to_string().contains("the phase is unchanged"), "{err}");
        assert_eq!(proxy.policy().phase(), Some("build"));
        sink.fail.store(false, Ordering::SeqCst);
        let back = switch(&proxy, &phases, phases.source.build(None).unwrap(), false).unwrap();
        assert_eq!((back.phase, back.previous.as_deref()), (None, Some("build")));

        // Regression: a switch racing the session's end wrote its line after the audit root
        // was sealed. Once the end has begun, nothing switches and no line is written.
        let lines = sink.lines.lock().unwrap().len();
        phases.ended.store(true, Ordering::SeqCst);
        let err = switch(&proxy, &phases, phases.source.build(Some("build")).unwrap(), false);
        assert!(matches!(err, Err(SwitchError::Ended)), "{err:?}");
        assert_eq!(proxy.policy().phase(), None);
        assert_eq!(sink.lines.lock().unwrap().len(), lines);
        assert_eq!(lock(&phases.log).len(), 2);

        // Unknown and empty phases are refused with the defined ones named.
        let e = phases.source.build(Some("nope")).unwrap_err();
        assert!(
            e.contains("unknown phase \"nope\"") && e.contains("build (~/.airlock/config.toml)"),
            "{e}"
        );
    }
}
