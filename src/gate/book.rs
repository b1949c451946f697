//! The daemon's book of pending gates. A held attempt [`GateBook::open`]s a gate and waits on
//! its [`Ticket`]; a decider lists the book (optionally waiting for a change) and
//! [`GateBook::decide`]s one gate, once, bound to the digest it saw. A gate leaves the book
//! when it is decided, or when its ticket is dropped (the attempt expired, its client went
//! away, the session or daemon is stopping): a decision can never reach another attempt.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use crate::protocol::{GateDecision, GateInfo, GateRelaySpec};

/// A decision as the held attempt receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub approve: bool,
    pub by: String,
    pub note: String,
    /// The decider is the requester.
    pub self_decided: bool,
    /// RFC 3339 UTC with milliseconds.
    pub at: String,
    /// A relayed session's review server could not decide (unreachable, or it refused the
    /// gate): the attempt is refused `gate_unavailable`, `note` says why.
    pub unavailable: bool,
    /// The review server's id of the gate, for a relayed decision.
    pub server_gate: Option<String>,
}

/// Why a gate could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("this session already has {max} attempts waiting for a gate decision")]
    Limit { max: usize },
}

/// Why [`GateBook::open_recorded`] opened nothing.
#[derive(Debug)]
pub enum Opening<E> {
    Limit(OpenError),
    /// The `record` callback failed; nothing was opened.
    Record(E),
}

/// Why a decision was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    #[error(
        "no pending gate {0}: it was decided, expired or abandoned already (`airlock gate list` \
         shows the pending ones)"
    )]
    Unknown(String),
    #[error(
        "gate {id} is for action {held}, not {given}: the decision was refused; look at the gate \
         again (`airlock gate show {id}`) and decide what it holds"
    )]
    Digest { id: String, held: String, given: String },
    #[error(
        "gate {id} is decided on the review server {server}, not here: a reviewer decides it in \
         the console's /gates page or with `airlock gate approve` while logged in to that server"
    )]
    Relayed { id: String, server: String },
    #[error("gate {0} is decided here, not on a review server: the relayed decision was refused")]
    NotRelayed(String),
}

struct Pending {
    info: GateInfo,
    tx: oneshot::Sender<Decided>,
    /// A relayed session's key hash ([`GateRelaySpec::key_sha256`]): only a decision carrying
    /// that key is taken.
    relay_key_sha256: Option<String>,
}

#[derive(Default)]
struct Inner {
    /// By id; ids sort in opening order ([`GateBook::open`]).
    pending: BTreeMap<String, Pending>,
    opened: u64,
}

/// The pending gates of every session of one daemon.
pub struct GateBook {
    inner: Mutex<Inner>,
    /// Bumped on every change; [`GateBook::wait_change`] waits on it.
    version: watch::Sender<u64>,
    max_per_session: usize,
}

impl std::fmt::Debug for GateBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GateBook")
            .field("pending", &self.lock().pending.len())
            .field("version", &*self.version.borrow())
            .finish()
    }
}

/// A held attempt's claim on its gate; dropping it takes the gate out of the book if it is
/// still pending (so a late decision finds nothing).
#[derive(Debug)]
pub struct Ticket {
    book: Arc<GateBook>,
    id: String,
    rx: oneshot::Receiver<Decided>,
}

impl Ticket {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The decision; `None` when the gate was abandoned from the book's side
    /// ([`GateBook::abandon_session`]).
    pub async fn decided(&mut self) -> Option<Decided> {
        (&mut self.rx).await.ok()
    }
}

impl Ticket {
    /// Ends the wait from the attempt's side (expiry, hang-up, stop). If a decision won the
    /// race (the book no longer holds the gate because it was decided), that decision is
    /// returned, so what the decider was told is what the attempt does.
    pub async fn withdraw(&mut self) -> Option<Decided> {
        if self.book.remove(&self.id) {
            return None;
        }
        // Decided or abandoned: `decide` sends right after taking it out of the book.
        (&mut self.rx).await.ok()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.book.remove(&self.id);
    }
}

impl GateBook {
    pub fn new(max_per_session: usize) -> Arc<Self> {
        Arc::new(Self {
            inner: Mutex::new(Inner::default()),
            version: watch::channel(0).0,
            max_per_session: max_per_session.max(1),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update is one insert or remove: a panicking holder leaves the map consistent.
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn bump(&self) {
        self.version.send_modify(|v| *v += 1);
    }

    /// Opens a gate for `info` (its `id` is assigned here: `g` + a sequence number + random
    /// hex, so ids sort in opening order and cannot be guessed from another session).
    pub fn open(self: &Arc<Self>, info: GateInfo) -> Result<Ticket, OpenError> {
        self.open_recorded(info, None, |_| Ok::<(), std::convert::Infallible>(())).map_err(|e| {
            match e {
                Opening::Limit(e) => e,
                Opening::Record(never) => match never {},
            }
        })
    }

    /// [`Self::open`], calling `record` with the new id before the gate becomes visible: a
    /// gate that cannot be recorded (its `requested` audit line) is never listed, notified or
    /// decidable. `record` runs under the book's lock, so keep it short (one `write(2)`).
    /// `relay`: the session's gates are decided on a review server (its decisions only).
    pub fn open_recorded<E>(
        self: &Arc<Self>,
        mut info: GateInfo,
        relay: Option<&GateRelaySpec>,
        record: impl FnOnce(&str) -> Result<(), E>,
    ) -> Result<Ticket, Opening<E>> {
        info.relay = relay.map(|r| r.server.clone());
        let relay_key_sha256 = relay.map(|r| r.key_sha256.clone());
        let (tx, rx) = oneshot::channel();
        let id = {
            let mut inner = self.lock();
            let held = inner.pending.values().filter(|p| p.info.session == info.session).count();
            if held >= self.max_per_session {
                return Err(Opening::Limit(OpenError::Limit { max: self.max_per_session }));
            }
            inner.opened += 1;
            let id = format!("g{:06}-{}", inner.opened, random_hex());
            record(&id).map_err(Opening::Record)?;
            info.id = id.clone();
            inner.pending.insert(id.clone(), Pending { info, tx, relay_key_sha256 });
            id
        };
        self.bump();
        Ok(Ticket { book: Arc::clone(self), id, rx })
    }

    /// Takes `id` out of the book; false if it was no longer there.
    fn remove(&self, id: &str) -> bool {
        let removed = self.lock().pending.remove(id).is_some();
        if removed {
            self.bump();
        }
        removed
    }

    /// The pending gates, oldest first, and the book's version.
    pub fn list(&self) -> (u64, Vec<GateInfo>) {
        let version = *self.version.borrow();
        let gates = self.lock().pending.values().map(|p| p.info.clone()).collect();
        (version, gates)
    }

    /// [`Self::list`] once the version is past `after`, or after `wait`, whichever is first.
    pub async fn wait_change(&self, after: u64, wait: Duration) -> (u64, Vec<GateInfo>) {
        let mut rx = self.version.subscribe();
        let _ = tokio::time::timeout(wait, rx.wait_for(|v| *v > after)).await;
        self.list()
    }

    /// Decides the pending gate `d.id` if its digest is `d.digest`; the held attempt is told
    /// at once. A local decision (the session is not relayed) is the requester's own, marked
    /// so; a relayed session's gate takes only a decision carrying its relay key, marked as the
    /// server marked it. Returns the gate decided.
    pub fn decide(&self, d: &GateDecision, at: String) -> Result<GateInfo, DecideError> {
        let pending = {
            let mut inner = self.lock();
            let Some(p) = inner.pending.get(&d.id) else {
                return Err(DecideError::Unknown(d.id.clone()));
            };
            match (&p.relay_key_sha256, &d.relay) {
                (None, None) => {}
                (Some(want), Some(r)) if key_matches(want, &r.key) => {}
                (Some(_), _) => {
                    return Err(DecideError::Relayed {
                        id: d.id.clone(),
                        server: p.info.relay.clone().unwrap_or_default(),
                    });
                }
                (None, Some(_)) => return Err(DecideError::NotRelayed(d.id.clone())),
            }
            if p.info.digest != d.digest {
                return Err(DecideError::Digest {
                    id: d.id.clone(),
                    held: p.info.digest.clone(),
                    given: d.digest.clone(),
                });
            }
            inner.pending.remove(&d.id)
        };
        self.bump();
        let Some(Pending { info, tx, .. }) = pending else {
            return Err(DecideError::Unknown(d.id.clone()));
        };
        let unavailable = d.relay.as_ref().is_some_and(|r| r.unavailable);
        let decided = Decided {
            approve: d.approve && !unavailable,
            by: d.by.clone(),
            note: super::clean_note(&d.note),
            self_decided: d.relay.as_ref().is_none_or(|r| r.self_decided),
            at,
            unavailable,
            server_gate: d.relay.as_ref().map(|r| r.server_gate.clone()),
        };
        // The attempt may have given up in between (its ticket is being dropped): then the
        // decision reaches no one, which is what a late decision must do.
        if tx.send(decided).is_err() {
            return Err(DecideError::Unknown(d.id.clone()));
        }
        Ok(info)
    }

    /// Abandons every pending gate of `session` (it is ending): their attempts see `None`.
    pub fn abandon_session(&self, session: &str) {
        let removed = {
            let mut inner = self.lock();
            let ids: Vec<String> = inner
                .pending
                .iter()
                .filter(|(_, p)| p.info.session == session)
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| inner.pending.remove(id)).count()
        };
        if removed > 0 {
            self.bump();
        }
    }
}

/// Whether `key` hashes to `want_sha256` (lowercase hex); compared in constant time.
fn key_matches(want_sha256: &str, key: &str) -> bool {
    use sha2::{Digest, Sha256};
    let got = hex::encode(Sha256::digest(key.as_bytes()));
    got.len() == want_sha256.len()
        && got.bytes().zip(want_sha256.bytes()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
}

fn random_hex() -> String {
    let mut b = [0u8; 6];
    // Ids need only be unique within the book (the sequence number does that); the random
    // part keeps them from being guessed, and a failure leaves it zero.
    let _ = getrandom::fill(&mut b);
    hex::encode(b)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn info(session: &str, digest: &str) -> GateInfo {
        GateInfo {
            id: String::new(),
            kind: "egress".into(),
            session: session.into(),
            repo: "r".into(),
            repo_key: None,
            user_id: None,
            method: "CONNECT".into(),
            host: "api.stripe.test".into(),
            port: 443,
            request: None,
            action: "{}".into(),
            digest: digest.into(),
            severity: "medium".into(),
            rule: "api.stripe.test".into(),
            layer: "user".into(),
            policy: "~/.airlock/config.toml".into(),
            requested_at: "2026-12-04T00:00:00.000Z".into(),
            deadline: "2026-12-04T00:01:50.000Z".into(),
            relay: None,
        }
    }

    fn decision(id: &str, digest: &str, approve: bool) -> GateDecision {
        GateDecision {
            id: id.into(),
            digest: digest.into(),
            approve,
            note: "ok".into(),
            by: "dev@example.test".into(),
            relay: None,
        }
    }

    #[tokio::test]
    async fn a_decision_reaches_its_attempt_once() {
        let book = GateBook::new(4);
        let mut t = book.open(info("s", "sha256:a")).unwrap();
        let id = t.id().to_owned();
        let (v, list) = book.list();
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].id, id);
        let got = book.decide(&decision(&id, "sha256:a", true), "t".into()).unwrap();
        assert_eq!(got.id, id);
        let d = t.decided().await.unwrap();
        assert!(d.approve && d.self_decided && d.by == "dev@example.test");
        assert!(book.list().1.is_empty());
        assert!(book.list().0 > v);
        // Single use: the same decision again finds nothing.
        let again = book.decide(&decision(&id, "sha256:a", true), "t".into());
        assert!(matches!(again, Err(DecideError::Unknown(_))), "{again:?}");
    }

    #[tokio::test]
    async fn a_decision_for_another_digest_is_refused_and_the_gate_stays() {
        let book = GateBook::new(4);
        let t = book.open(info("s", "sha256:a")).unwrap();
        let err = book.decide(&decision(t.id(), "sha256:b", true), "t".into()).unwrap_err();
        assert!(matches!(err, DecideError::Digest { .. }), "{err}");
        assert_eq!(book.list().1.len(), 1, "still pending");
    }

    #[tokio::test]
    async fn a_dropped_ticket_leaves_the_book_and_a_late_decision_finds_nothing() {
        let book = GateBook::new(4);
        let t = book.open(info("s", "sha256:a")).unwrap();
        let id = t.id().to_owned();
        drop(t);
        assert!(book.list().1.is_empty());
        let late = book.decide(&decision(&id, "sha256:a", true), "t".into());
        assert!(matches!(late, Err(DecideError::Unknown(_))), "{late:?}");
    }

    #[tokio::test]
    async fn each_session_holds_at_most_the_cap() {
        let book = GateBook::new(2);
        let _a = book.open(info("s", "sha256:a")).unwrap();
        let _b = book.open(info("s", "sha256:b")).unwrap();
        assert_eq!(book.open(info("s", "sha256:c")).unwrap_err(), OpenError::Limit { max: 2 });
        let _other = book.open(info("t", "sha256:d")).expect("another session has its own cap");
    }

    #[tokio::test]
    async fn abandoning_a_session_wakes_its_attempts_only() {
        let book = GateBook::new(4);
        let mut a = book.open(info("s", "sha256:a")).unwrap();
        let b = book.open(info("t", "sha256:b")).unwrap();
        book.abandon_session("s");
        assert_eq!(a.decided().await, None);
        let (_, left) = book.list();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].id, b.id());
    }

    #[tokio::test]
    async fn a_watcher_wakes_on_a_change_and_ids_sort_in_opening_order() {
        let book = GateBook::new(8);
        let (v, _) = book.list();
        let waiter = {
            let book = Arc::clone(&book);
            tokio::spawn(async move { book.wait_change(v, Duration::from_secs(30)).await })
        };
        tokio::task::yield_now().await;
        let t1 = book.open(info("s", "sha256:a")).unwrap();
        let (v2, list) =
            tokio::time::timeout(Duration::from_secs(5), waiter).await.unwrap().unwrap();
        assert!(v2 > v);
        assert_eq!(list.len(), 1);
        let t2 = book.open(info("s", "sha256:b")).unwrap();
        assert!(t1.id() < t2.id(), "{} {}", t1.id(), t2.id());
        // No change: the wait ends at its bound.
        let (v3, _) = book.list();
        let (v4, _) = book.wait_change(v3, Duration::from_millis(20)).await;
        assert_eq!(v3, v4);
    }

    #[tokio::test]
    async fn a_decision_that_won_the_race_is_what_the_attempt_does() {
        let book = GateBook::new(4);
        let mut t = book.open(info("s", "sha256:a")).unwrap();
        let d = GateDecision {
            id: t.id().to_owned(),
            digest: "sha256:a".into(),
            approve: true,
            note: String::new(),
            by: "me".into(),
            relay: None,
        };
        book.decide(&d, "t".into()).unwrap();
        // The attempt had just given up: it still gets the decision the decider was told of.
        assert!(t.withdraw().await.unwrap().approve);
        // Withdrawn first: a late decision finds nothing.
        let mut t = book.open(info("s", "sha256:b")).unwrap();
        let id = t.id().to_owned();
        assert!(t.withdraw().await.is_none());
        let late = GateDecision { id, digest: "sha256:b".into(), ..d };
        assert!(matches!(book.decide(&late, "t".into()), Err(DecideError::Unknown(_))));
    }

    #[test]
    fn a_gate_that_cannot_be_recorded_is_never_visible() {
        let book = GateBook::new(4);
        let r = book.open_recorded(info("s", "sha256:a"), None, |_| Err("disk full"));
        assert!(matches!(r, Err(Opening::Record("disk full"))));
        assert!(book.list().1.is_empty());
        assert_eq!(book.list().0, 0, "no change was announced");
    }

    #[tokio::test]
    async fn a_relayed_gate_takes_only_its_supervisors_relayed_decision() {
        use crate::protocol::RelayedDecision;
        use sha2::{Digest, Sha256};
        let book = GateBook::new(4);
        let spec = GateRelaySpec {
            server: "https://review.example.test".into(),
            key_sha256: hex::encode(Sha256::digest(b"the-key")),
        };
        let mut t =
            book.open_recorded(info("s", "sha256:a"), Some(&spec), |_| Ok::<(), ()>(())).unwrap();
        let id = t.id().to_owned();
        assert_eq!(book.list().1[0].relay.as_deref(), Some("https://review.example.test"));
        // A local decision (`airlock gate approve` on the host) is refused.
        let local = book.decide(&decision(&id, "sha256:a", true), "t".into());
        assert!(matches!(local, Err(DecideError::Relayed { .. })), "{local:?}");
        // So is a relayed one with another key.
        let relayed = |key: &str, unavailable| GateDecision {
            relay: Some(RelayedDecision {
                key: key.into(),
                server_gate: "gt_1".into(),
                self_decided: false,
                unavailable,
            }),
            ..decision(&id, "sha256:a", true)
        };
        let wrong = book.decide(&relayed("another-key", false), "t".into());
        assert!(matches!(wrong, Err(DecideError::Relayed { .. })), "{wrong:?}");
        assert_eq!(book.list().1.len(), 1, "still pending");
        book.decide(&relayed("the-key", false), "t".into()).unwrap();
        let d = t.decided().await.unwrap();
        assert!(d.approve && !d.self_decided && !d.unavailable);
        assert_eq!(d.server_gate.as_deref(), Some("gt_1"));
        // Unavailable: never an approval, whatever `approve` says.
        let mut t =
            book.open_recorded(info("s", "sha256:b"), Some(&spec), |_| Ok::<(), ()>(())).unwrap();
        let d = GateDecision {
            id: t.id().to_owned(),
            digest: "sha256:b".into(),
            ..relayed("the-key", true)
        };
        book.decide(&d, "t".into()).unwrap();
        let d = t.decided().await.unwrap();
        assert!(!d.approve && d.unavailable);
        // A relayed decision on a local gate is refused too.
        let t = book.open(info("s", "sha256:c")).unwrap();
        let d = GateDecision {
            id: t.id().to_owned(),
            digest: "sha256:c".into(),
            ..relayed("the-key", false)
        };
        assert!(matches!(book.decide(&d, "t".into()), Err(DecideError::NotRelayed(_))));
    }
}
