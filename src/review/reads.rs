//! Bounded reads of the review API: the read slots (at most [`READS_PER_USER`] concurrent
//! reads per user and [`READS_TOTAL`] overall, more get 429), the page body cap
//! ([`PAGE_CAP`]), the event listing's cursor (which follows `order`), and the JSONL export
//! that streams in constant memory ([`export`]). docs/api.md, "Bounded reads".

pub mod export;

use super::StoredEvent;
use super::store::EventOrder;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Largest body of any response except the export: a page that would exceed it ends early
/// with `next_cursor` set. The first event of a page is always included, so a page holds at
/// least one event if one matches; such a single-event page may exceed the cap, but an item
/// is at most `ingest::MAX_ITEM` (1,000,000 bytes) when sent, so in practice it stays far below.
pub const PAGE_CAP: usize = 8 * 1024 * 1024;
/// Default concurrent reads per user (`--read-concurrency-per-user`).
pub const READS_PER_USER: usize = 4;
/// Default concurrent reads overall (`--read-concurrency`).
pub const READS_TOTAL: usize = 16;

/// Read slots: a global semaphore plus a per-user count. A read holds one [`ReadPermit`] for
/// its duration (an export for the whole stream).
#[derive(Debug)]
pub struct ReadSlots {
    total: Arc<Semaphore>,
    limit: usize,
    per_user: usize,
    users: Arc<Mutex<HashMap<String, usize>>>,
}

/// Why a read slot was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// This user already holds `per_user` reads.
    User,
    /// Every slot of the server is taken.
    Server,
}

/// One held read slot; released on drop.
#[derive(Debug)]
pub struct ReadPermit {
    _total: OwnedSemaphorePermit,
    user: String,
    users: Arc<Mutex<HashMap<String, usize>>>,
}

impl Drop for ReadPermit {
    fn drop(&mut self) {
        if let Ok(mut users) = self.users.lock()
            && let Some(n) = users.get_mut(&self.user)
        {
            *n -= 1;
            if *n == 0 {
                users.remove(&self.user);
            }
        }
    }
}

impl ReadSlots {
    pub fn new(per_user: usize, total: usize) -> Self {
        Self {
            total: Arc::new(Semaphore::new(total.max(1))),
            limit: total.max(1),
            per_user: per_user.max(1),
            users: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    /// Takes a slot for `user` now or says why not (never waits: the caller answers 429).
    pub fn try_acquire(&self, user: &str) -> Result<ReadPermit, Busy> {
        let mut users = self.users.lock().map_err(|_| Busy::Server)?;
        let held = users.get(user).copied().unwrap_or(0);
        if held >= self.per_user {
            return Err(Busy::User);
        }
        let permit = Arc::clone(&self.total).try_acquire_owned().map_err(|_| Busy::Server)?;
        users.insert(user.to_string(), held + 1);
        Ok(ReadPermit { _total: permit, user: user.to_string(), users: Arc::clone(&self.users) })
    }
}

impl ReadSlots {
    /// Slots held now, overall limit and per-user limit (for `GET /metrics`).
    pub fn usage(&self) -> (usize, usize, usize) {
        (self.limit - self.total.available_permits(), self.limit, self.per_user)
    }
}

impl Default for ReadSlots {
    fn default() -> Self {
        Self::new(READS_PER_USER, READS_TOTAL)
    }
}

/// A listing cursor: the last row's `pk`, and its `ts` under `order=ts` (written `t<ts>_<pk>`
/// so a cursor of one order is refused under the other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    pub ts: Option<i64>,
    pub pk: i64,
}

impl Cursor {
    /// The cursor after `e` under `order`.
    pub fn after(e: &StoredEvent, order: EventOrder) -> Self {
        match order {
            EventOrder::Received => Self { ts: None, pk: e.pk },
            EventOrder::Ts => Self { ts: Some(e.ts), pk: e.pk },
        }
    }

    pub fn encode(&self) -> String {
        match self.ts {
            None => self.pk.to_string(),
            Some(ts) => format!("t{ts}_{}", self.pk),
        }
    }

    /// Parses a cursor for `order`; `None` if it is not one this API returned for that order.
    pub fn parse(v: &str, order: EventOrder) -> Option<Self> {
        match order {
            EventOrder::Received => v.parse().ok().map(|pk| Self { ts: None, pk }),
            EventOrder::Ts => {
                let (ts, pk) = v.strip_prefix('t')?.split_once('_')?;
                Some(Self { ts: Some(ts.parse().ok()?), pk: pk.parse().ok()? })
            }
        }
    }
}

/// Writes a JSON page `{"events":[…],"next_cursor":…}` one event at a time (one event's
/// serialized form alive at once, never the whole page as a tree), stopping before the body
/// would pass `cap` (the first event is always written).
#[derive(Debug)]
pub struct PageWriter {
    buf: Vec<u8>,
    cap: usize,
    count: usize,
    last: Option<Cursor>,
    full: bool,
}

impl PageWriter {
    pub fn new(cap: usize) -> Self {
        let mut buf = Vec::with_capacity(64 * 1024);
        buf.extend_from_slice(b"{\"events\":[");
        Self { buf, cap, count: 0, last: None, full: false }
    }

    /// Adds `e` unless the page is full; returns false (and marks the page full) if it did
    /// not fit.
    pub fn push(
        &mut self,
        e: &StoredEvent,
        with_view: bool,
        order: EventOrder,
    ) -> Result<bool, serde_json::Error> {
        if self.full {
            return Ok(false);
        }
        let item = serde_json::to_vec(&e.api_json(with_view))?;
        // Room for the separator and the tail (`],"next_cursor":"t…_…"}`, under 64 bytes).
        if self.count > 0 && self.buf.len() + 1 + item.len() + 64 > self.cap {
            self.full = true;
            return Ok(false);
        }
        if self.count > 0 {
            self.buf.push(b',');
        }
        self.buf.extend_from_slice(&item);
        self.count += 1;
        self.last = Some(Cursor::after(e, order));
        Ok(true)
    }

    /// Whether a push was refused for lack of room.
    pub fn is_full(&self) -> bool {
        self.full
    }

    /// The body, with `next_cursor` after the last written event when `more` (or when the
    /// cap cut the page), else `null`.
    pub fn finish(mut self, more: bool) -> Vec<u8> {
        self.buf.extend_from_slice(b"],\"next_cursor\":");
        match self.last.filter(|_| more || self.full) {
            Some(c) => {
                self.buf.push(b'"');
                self.buf.extend_from_slice(c.encode().as_bytes());
                self.buf.push(b'"');
            }
            None => self.buf.extend_from_slice(b"null"),
        }
        self.buf.push(b'}');
        self.buf
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::review::Source;

    fn ev(pk: i64, payload: &str) -> StoredEvent {
        StoredEvent {
            pk,
            user_id: "u".into(),
            source: Source::External,
            id: format!("e{pk}"),
            kind: "t".into(),
            ts: 1000 + pk,
            session: None,
            seq: None,
            boot: None,
            received_at: 5,
            payload: payload.into(),
            conflict_of: None,
            airlock_session: None,
            file: None,
            offset: None,
        }
    }

    #[test]
    fn read_slots_cap_per_user_and_overall_and_release_on_drop() {
        let slots = ReadSlots::new(2, 3);
        let a1 = slots.try_acquire("a").unwrap();
        let _a2 = slots.try_acquire("a").unwrap();
        assert_eq!(slots.try_acquire("a").unwrap_err(), Busy::User);
        let _b1 = slots.try_acquire("b").unwrap();
        assert_eq!(slots.try_acquire("c").unwrap_err(), Busy::Server);
        drop(a1);
        let _c1 = slots.try_acquire("c").unwrap();
        assert_eq!(slots.try_acquire("a").unwrap_err(), Busy::Server);
    }

    #[test]
    fn cursors_round_trip_and_are_refused_under_the_other_order() {
        let c = Cursor { ts: Some(-5), pk: 9 };
        assert_eq!(Cursor::parse(&c.encode(), EventOrder::Ts), Some(c));
        assert_eq!(Cursor::parse(&c.encode(), EventOrder::Received), None);
        assert_eq!(Cursor::parse("17", EventOrder::Received), Some(Cursor { ts: None, pk: 17 }));
        assert_eq!(Cursor::parse("17", EventOrder::Ts), None);
    }

    #[test]
    fn a_page_stops_before_the_cap_but_always_holds_one_event() {
        let big = format!("[{}]", vec!["0"; 400].join(","));
        let mut w = PageWriter::new(2400);
        assert!(w.push(&ev(1, &big), false, EventOrder::Received).unwrap());
        assert!(w.push(&ev(2, &big), false, EventOrder::Received).unwrap());
        assert!(!w.push(&ev(3, &big), false, EventOrder::Received).unwrap());
        let body = w.finish(false);
        assert!(body.len() <= 2400, "{}", body.len());
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["events"].as_array().unwrap().len(), 2);
        assert_eq!(v["next_cursor"], "2");
        // One event larger than the cap still goes out, alone.
        let mut w = PageWriter::new(100);
        assert!(w.push(&ev(7, &big), false, EventOrder::Ts).unwrap());
        assert!(!w.push(&ev(8, "{}"), false, EventOrder::Ts).unwrap());
        let v: serde_json::Value = serde_json::from_slice(&w.finish(false)).unwrap();
        assert_eq!(v["events"][0]["payload"].as_array().unwrap().len(), 400);
        assert_eq!(v["next_cursor"], "t1007_7");
        // An empty page and a last page have no cursor.
        let v: serde_json::Value =
            serde_json::from_slice(&PageWriter::new(100).finish(true)).unwrap();
        assert_eq!(v, serde_json::json!({"events": [], "next_cursor": null}));
    }
}
