//! The review log's server side (docs/evidence.md): the signing key, the sequencer loop that
//! appends stored events to the tree and signs checkpoints, proofs computed from the stored
//! tiers (full tiles cached, since they never change), and the `/api/v1/log/…` endpoints.
//! The tree itself lives in the store ([`Store::log_sequence`] and friends); the Merkle code
//! is [`crate::tlog`].

// Handlers return the error *response* itself as `Err`, as in server.rs.
#![allow(clippy::result_large_err)]

use super::gate_api::refusal;
use super::server::{AppState, Resp, error, json_resp, query_params, store_error};
use super::store::{LogHead, NewCosignature, Store, StoreError, StoredCheckpoint};
use super::{Micros, User, format_micros, now_micros};
use crate::tlog::b64;
use crate::tlog::merkle::{Hash, Need, ProofError, Prover, StoredHashes, TILE_WIDTH};
use crate::tlog::note::{Checkpoint, Note, NoteSigner, NoteVerifier, parse_sig_line};
use crate::tlog::tile::{TilePath, TilePathError};
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::Full;
use hyper::body::Incoming;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// Events appended per sequencing transaction.
pub const SEQUENCE_BATCH: usize = 1000;
/// A checkpoint is signed at least this often, even when nothing changed.
pub const RESIGN_EVERY: Duration = Duration::from_secs(60);
/// How often the sequencer runs when nothing wakes it (PostgreSQL instances that do not hold
/// the sequencer lock retry it at this pace).
pub const SEQUENCER_TICK: Duration = Duration::from_secs(1);
/// The longest the log promises to take to sequence an event: an ingest receipt's
/// `deadline` is `received_at` plus this.
pub const MERGE_DELAY: Duration = Duration::from_secs(60);
/// How long an export waits for a checkpoint covering what is stored when it starts (the
/// sequencer signs right after each commit; an ingest never waits).
pub const EXPORT_WAIT: Duration = Duration::from_secs(2);
/// Full tiles kept in memory (8 KiB each): 64 MiB at most.
pub const TILE_CACHE: usize = 8192;

/// The log's state on one server instance.
#[derive(Debug)]
pub struct LogHub {
    signer: Option<NoteSigner>,
    /// Wakes the sequencer (after an ingest commits).
    wake: Notify,
    /// The latest checkpoint this instance signed or read, for waiters on a size.
    signed: watch::Sender<Option<Arc<StoredCheckpoint>>>,
    /// Serializes signing on this instance.
    signing: tokio::sync::Mutex<()>,
    tiles: Mutex<TileMap>,
}

/// Tiles by (tier, tile index).
type TileMap = HashMap<(u8, u64), Arc<Vec<Hash>>>;

impl Default for LogHub {
    fn default() -> Self {
        Self::new(None)
    }
}

impl LogHub {
    pub fn new(signer: Option<NoteSigner>) -> Self {
        Self {
            signer,
            wake: Notify::new(),
            signed: watch::channel(None).0,
            signing: tokio::sync::Mutex::new(()),
            tiles: Mutex::new(HashMap::new()),
        }
    }

    /// The log's verifier key, when it has a signing key.
    pub fn verifier(&self) -> Option<NoteVerifier> {
        self.signer.as_ref().map(NoteSigner::verifier)
    }

    /// Asks the sequencer to run now.
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Signs a checkpoint for `head` and stores it, unless the latest stored one already
    /// has this size and is younger than [`RESIGN_EVERY`]. Nothing without a signing key.
    async fn sign<S: Store>(&self, store: &S, head: LogHead) -> Result<(), StoreError> {
        let Some(signer) = &self.signer else { return Ok(()) };
        let _one = self.signing.lock().await;
        let now = now_micros();
        let mut time = now.div_euclid(1_000_000);
        if let Some(latest) = store.log_checkpoint(None).await? {
            // A head signed under another key (the server restarted with a new --log-key)
            // is re-signed at once: clients that pinned this key cannot use it.
            let opened = crate::tlog::note::open_checkpoint(&latest.note, &signer.verifier()).ok();
            let fresh = now - latest.signed_at < RESIGN_EVERY.as_micros() as Micros;
            if let Some((c, _)) = &opened {
                if latest.size > head.size || (latest.size == head.size && fresh) {
                    self.announce(&latest);
                    return Ok(());
                }
                // Clients refuse a head older than one they hold: never let `time` go back,
                // even when the signer's clock does (another instance took the lock).
                time = time.max(c.time().map_or(0, |t| t as i64));
            }
        }
        let cp = Checkpoint {
            origin: signer.name().to_string(),
            size: head.size,
            root: head.root,
            extensions: vec![format!("time {time}")],
        };
        let note = signer
            .sign_note(&cp.body())
            .map_err(|e| StoreError::Other(format!("cannot sign the checkpoint: {e}")))?;
        let stored = StoredCheckpoint { size: head.size, root: head.root, note, signed_at: now };
        store.log_add_checkpoint(&stored).await?;
        self.announce(&stored);
        Ok(())
    }

    /// Makes `cp` this instance's latest known checkpoint (for [`LogHub::current`]).
    fn announce(&self, cp: &StoredCheckpoint) {
        self.signed.send_if_modified(|cur| {
            if cur.as_ref().is_some_and(|c| c.size >= cp.size && c.signed_at >= cp.signed_at) {
                return false;
            }
            *cur = Some(Arc::new(cp.clone()));
            true
        });
    }

    /// One sequencer pass: append every unsequenced event, then sign when the tree grew or
    /// the latest checkpoint is older than [`RESIGN_EVERY`]. `false` when another instance
    /// holds the sequencer lock (it signs, not this one).
    pub async fn sequence_once<S: Store>(&self, store: &S) -> Result<bool, StoreError> {
        let head = loop {
            match store.log_sequence(SEQUENCE_BATCH).await? {
                None => return Ok(false),
                Some(h) if h.appended < SEQUENCE_BATCH as u64 => break h,
                Some(_) => {}
            }
        };
        self.sign(store, head).await?;
        Ok(true)
    }

    /// The latest checkpoint this instance signed or read, if it covers `size` leaves.
    pub fn current(&self, size: u64) -> Option<Arc<StoredCheckpoint>> {
        self.signer.as_ref()?;
        self.signed.borrow().clone().filter(|cp| cp.size >= size)
    }

    /// Runs `f` against the stored tiers, loading the tiles it names until it completes.
    async fn prove<S: Store, T>(
        &self,
        store: &S,
        f: impl Fn(&Prover<'_, Loaded>) -> Result<T, Need>,
    ) -> Result<T, StoreError> {
        let mut loaded = Loaded::default();
        loop {
            match f(&Prover::new(&loaded)) {
                Ok(t) => return Ok(t),
                Err(need) => {
                    if loaded.0.contains_key(&(need.level, need.tile)) {
                        return Err(StoreError::Other(format!(
                            "the stored tree lacks hashes of tier {} tile {}: the log's tables \
                             are incomplete or were edited",
                            need.level, need.tile
                        )));
                    }
                    let tile = self.tile(store, need.level, need.tile).await?;
                    loaded.0.insert((need.level, need.tile), tile);
                }
            }
        }
    }

    /// Tier `level`, tile `tile` as stored (full tiles from the cache).
    async fn tile<S: Store>(
        &self,
        store: &S,
        level: u8,
        tile: u64,
    ) -> Result<Arc<Vec<Hash>>, StoreError> {
        if let Ok(c) = self.tiles.lock()
            && let Some(t) = c.get(&(level, tile))
        {
            return Ok(Arc::clone(t));
        }
        let start = tile * TILE_WIDTH;
        let hashes = Arc::new(store.log_tier(level, start, start + TILE_WIDTH).await?);
        if hashes.len() as u64 == TILE_WIDTH
            && let Ok(mut c) = self.tiles.lock()
        {
            if c.len() >= TILE_CACHE {
                // Any entry will do: all are equally cheap to reload.
                if let Some(k) = c.keys().next().copied() {
                    c.remove(&k);
                }
            }
            c.insert((level, tile), Arc::clone(&hashes));
        }
        Ok(hashes)
    }

    /// The inclusion proof of leaf `index` in the tree of `size`.
    pub async fn inclusion<S: Store>(
        &self,
        store: &S,
        index: u64,
        size: u64,
    ) -> Result<Result<Vec<Hash>, ProofError>, StoreError> {
        self.prove(store, |p| p.inclusion(index, size)).await
    }

    /// The consistency proof from tree size `from` to `to`.
    pub async fn consistency<S: Store>(
        &self,
        store: &S,
        from: u64,
        to: u64,
    ) -> Result<Result<Vec<Hash>, ProofError>, StoreError> {
        self.prove(store, |p| p.consistency(from, to)).await
    }

    /// The root of the tree of `size` as the stored tiers give it.
    pub async fn root<S: Store>(&self, store: &S, size: u64) -> Result<Hash, StoreError> {
        self.prove(store, |p| p.root(size)).await
    }
}

/// Tiles loaded for one proof.
#[derive(Debug, Default)]
struct Loaded(TileMap);

impl StoredHashes for Loaded {
    fn stored(&self, level: u8, index: u64) -> Option<Hash> {
        let t = self.0.get(&(level, index / TILE_WIDTH))?;
        t.get((index % TILE_WIDTH) as usize).copied()
    }
}

/// Keeps the log sequenced and signed: runs after every ingest commit and every
/// [`SEQUENCER_TICK`].
pub async fn sequencer_loop<S: Store>(st: Arc<AppState<S>>) {
    let mut failing = false;
    loop {
        match st.log.sequence_once(&st.store).await {
            Ok(_) => failing = false,
            Err(e) => {
                // Logged once per outage, not once per second.
                if !failing {
                    tracing::warn!("the review log's sequencer failed (retrying): {e}");
                }
                failing = true;
            }
        }
        tokio::select! {
            _ = st.log.wake.notified() => {}
            _ = tokio::time::sleep(SEQUENCER_TICK) => {}
        }
    }
}

fn no_key() -> Resp {
    refusal(
        StatusCode::NOT_FOUND,
        "no_log_key",
        "this review server signs no log: start it with --log-key FILE \
         (make one with `airlockd review log-key init --out FILE`)",
    )
}

fn not_ready() -> Resp {
    let mut r = refusal(
        StatusCode::SERVICE_UNAVAILABLE,
        "log_not_ready",
        "no checkpoint has been signed yet; retry in a second",
    );
    r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    r
}

/// `u64` query parameters by name; unknown names are refused.
fn numbers(req: &Request<Incoming>, names: &[&str]) -> Result<Vec<u64>, Resp> {
    let mut out: Vec<Option<u64>> = vec![None; names.len()];
    for (k, v) in query_params(req.uri().query())? {
        let Some(i) = names.iter().position(|n| *n == k) else {
            return Err(error(StatusCode::BAD_REQUEST, format!("unknown query parameter {k:?}")));
        };
        let n = v.parse::<u64>().map_err(|_| {
            error(StatusCode::BAD_REQUEST, format!("`{k}` must be a non-negative integer"))
        })?;
        out[i] = Some(n);
    }
    out.into_iter()
        .zip(names)
        .map(|(v, n)| v.ok_or_else(|| error(StatusCode::BAD_REQUEST, format!("`{n}` is required"))))
        .collect()
}

fn hashes_json(h: &[Hash]) -> Vec<String> {
    h.iter().map(|h| b64(h)).collect()
}

/// Routes `/api/v1/log/…` (the caller is authenticated).
pub async fn route<S: Store>(st: &AppState<S>, user: &User, req: Request<Incoming>) -> Resp {
    let path = req.uri().path().to_string();
    let Some(rest) = path.strip_prefix("/api/v1/log/") else {
        return error(StatusCode::NOT_FOUND, format!("no such endpoint {path}"));
    };
    let method = req.method().clone();
    if let Some(tile) = rest.strip_prefix("tile/") {
        if method != http::Method::GET {
            return error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this endpoint");
        }
        return get_tile(st, tile).await;
    }
    match (method, rest) {
        (http::Method::GET, "key") => match st.log.verifier() {
            Some(v) => json_resp(StatusCode::OK, &json!({"key": v.to_string(), "origin": v.name})),
            None => no_key(),
        },
        (http::Method::GET, "checkpoint") => get_checkpoint(st, &req).await,
        (http::Method::GET, "proof/inclusion") => get_inclusion(st, &req).await,
        (http::Method::GET, "proof/consistency") => get_consistency(st, &req).await,
        (http::Method::GET, "leaf") => get_leaf(st, user, &req).await,
        (http::Method::POST, "cosignature") => post_cosignature(st, user, req).await,
        (
            _,
            "key" | "checkpoint" | "proof/inclusion" | "proof/consistency" | "leaf" | "cosignature",
        ) => error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed on this endpoint"),
        _ => error(StatusCode::NOT_FOUND, format!("no such endpoint {path}")),
    }
}

/// The methods a `/api/v1/log/…` path serves (for `Allow`).
pub fn allowed_methods(path: &str) -> Option<&'static str> {
    let rest = path.strip_prefix("/api/v1/log/")?;
    match rest {
        "key" | "checkpoint" | "proof/inclusion" | "proof/consistency" | "leaf" => Some("GET"),
        "cosignature" => Some("POST"),
        r if r.starts_with("tile/") => Some("GET"),
        _ => None,
    }
}

/// The stored tree's size, for bounding proof requests.
async fn tree_size<S: Store>(st: &AppState<S>) -> Result<u64, Resp> {
    st.store.log_head().await.map(|h| h.size).map_err(store_error)
}

/// `GET /api/v1/log/checkpoint[?tree_size=N]`: the latest head, or the latest one signed for
/// tree size `N` (so anyone can see how many clients witnessed any head).
async fn get_checkpoint<S: Store>(st: &AppState<S>, req: &Request<Incoming>) -> Resp {
    let Some(key) = st.log.verifier() else { return no_key() };
    let mut size = None;
    let params = match query_params(req.uri().query()) {
        Ok(p) => p,
        Err(r) => return r,
    };
    for (k, v) in params {
        if k != "tree_size" {
            return error(StatusCode::BAD_REQUEST, format!("unknown query parameter {k:?}"));
        }
        match v.parse::<u64>() {
            Ok(n) => size = Some(n),
            Err(_) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    "`tree_size` must be a non-negative integer",
                );
            }
        }
    }
    let cp = match st.store.log_checkpoint(size).await {
        Ok(Some(cp)) => cp,
        Ok(None) if size.is_some() => {
            return error(StatusCode::NOT_FOUND, "this log signed no head of that tree size");
        }
        Ok(None) => return not_ready(),
        Err(e) => return store_error(e),
    };
    // Signed under an earlier key (the server was restarted with a new one): the sequencer
    // re-signs it within a second; until then there is no head a client of this key can use.
    if crate::tlog::note::open_checkpoint(&cp.note, &key).is_err() {
        return not_ready();
    }
    let witnesses = match st.store.log_witnesses(cp.size).await {
        Ok(n) => n,
        Err(e) => return store_error(e),
    };
    let witnessed = match st.store.log_witnessed().await {
        Ok(w) => w,
        Err(e) => return store_error(e),
    };
    json_resp(
        StatusCode::OK,
        &json!({
            "checkpoint": cp.note,
            "tree_size": cp.size,
            "root_hash": b64(&cp.root),
            "signed_at": format_micros(cp.signed_at),
            "witnesses": witnesses,
            "witnessed_size": witnessed.map(|w| w.0),
            "witnessed_by": witnessed.map_or(0, |w| w.1),
        }),
    )
}

fn proof_error(e: ProofError) -> Resp {
    error(StatusCode::BAD_REQUEST, e.to_string())
}

async fn get_inclusion<S: Store>(st: &AppState<S>, req: &Request<Incoming>) -> Resp {
    let [index, size] = match numbers(req, &["index", "tree_size"]) {
        Ok(v) => [v[0], v[1]],
        Err(r) => return r,
    };
    let have = match tree_size(st).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    if size > have {
        return error(
            StatusCode::BAD_REQUEST,
            format!("tree_size {size} is larger than the log ({have} leaves)"),
        );
    }
    match st.log.inclusion(&st.store, index, size).await {
        Ok(Ok(h)) => json_resp(
            StatusCode::OK,
            &json!({"index": index, "tree_size": size, "hashes": hashes_json(&h)}),
        ),
        Ok(Err(e)) => proof_error(e),
        Err(e) => store_error(e),
    }
}

async fn get_consistency<S: Store>(st: &AppState<S>, req: &Request<Incoming>) -> Resp {
    let [from, to] = match numbers(req, &["from", "to"]) {
        Ok(v) => [v[0], v[1]],
        Err(r) => return r,
    };
    let have = match tree_size(st).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    if to > have {
        return error(
            StatusCode::BAD_REQUEST,
            format!("`to` {to} is larger than the log ({have} leaves)"),
        );
    }
    match st.log.consistency(&st.store, from, to).await {
        Ok(Ok(h)) => {
            json_resp(StatusCode::OK, &json!({"from": from, "to": to, "hashes": hashes_json(&h)}))
        }
        Ok(Err(e)) => proof_error(e),
        Err(e) => store_error(e),
    }
}

async fn get_tile<S: Store>(st: &AppState<S>, path: &str) -> Resp {
    let t = match TilePath::parse(path) {
        Ok(t) => t,
        Err(TilePathError::Entries) => {
            return refusal(
                StatusCode::NOT_FOUND,
                "entry_tiles_not_served",
                TilePathError::Entries.to_string(),
            );
        }
        Err(e) => return error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let have = match tree_size(st).await {
        Ok(n) => n,
        Err(r) => return r,
    };
    // Tier L holds `have >> 8L` hashes; a tile is served only once the tree holds all of it.
    let tier_len = have.checked_shr(8 * u32::from(t.level)).unwrap_or(0);
    let end = t.index.saturating_mul(TILE_WIDTH).saturating_add(t.width);
    if end > tier_len {
        return error(
            StatusCode::NOT_FOUND,
            format!("the log does not hold tile {} yet ({have} leaves)", t.to_path()),
        );
    }
    let hashes = match st.log.tile(&st.store, t.level, t.index).await {
        Ok(h) => h,
        Err(e) => return store_error(e),
    };
    if (hashes.len() as u64) < t.width {
        return store_error(StoreError::Other(format!(
            "the stored tier {} has fewer hashes than the tree's size says",
            t.level
        )));
    }
    let mut body = Vec::with_capacity(t.width as usize * 32);
    hashes[..t.width as usize].iter().for_each(|h| body.extend_from_slice(h));
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    // A full tile never changes (C2SP tlog-tiles); a partial one grows.
    if t.width == TILE_WIDTH {
        r.headers_mut().insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("public, max-age=31536000, immutable"),
        );
    }
    r
}

async fn get_leaf<S: Store>(st: &AppState<S>, user: &User, req: &Request<Incoming>) -> Resp {
    let mut source = None;
    let mut id = None;
    let params = match query_params(req.uri().query()) {
        Ok(p) => p,
        Err(r) => return r,
    };
    for (k, v) in params {
        match k.as_str() {
            "source" => source = Some(v),
            "id" => id = Some(v),
            other => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("unknown query parameter {other:?}"),
                );
            }
        }
    }
    let (Some(source), Some(id)) = (source, id) else {
        return error(StatusCode::BAD_REQUEST, "`source` and `id` are required");
    };
    if let Err(e) = source.parse::<super::Source>() {
        return error(StatusCode::BAD_REQUEST, e);
    }
    let found = match st.store.log_event_leaf(&user.id, &source, &id).await {
        Ok(f) => f,
        Err(e) => return store_error(e),
    };
    let Some((_pk, received_at, leaf)) = found else {
        return error(StatusCode::NOT_FOUND, format!("you have no event {source}/{id}"));
    };
    let Some(leaf) = leaf else {
        return json_resp(
            StatusCode::OK,
            &json!({"leaf_pending": true,
                "deadline": format_micros(received_at + MERGE_DELAY.as_micros() as Micros)}),
        );
    };
    let cp = match st.store.log_checkpoint(None).await {
        Ok(cp) => cp.filter(|c| c.size > leaf.index),
        Err(e) => return store_error(e),
    };
    json_resp(
        StatusCode::OK,
        &json!({
            "leaf_index": leaf.index,
            "leaf_hash": b64(&leaf.hash),
            "received_at": format_micros(leaf.received_at),
            "tree_size": cp.as_ref().map(|c| c.size),
            "checkpoint": cp.map(|c| c.note),
        }),
    )
}

/// Largest cosignature request body.
const MAX_COSIGNATURE_BODY: usize = 64 * 1024;

async fn post_cosignature<S: Store>(st: &AppState<S>, user: &User, req: Request<Incoming>) -> Resp {
    let Some(log_key) = st.log.verifier() else { return no_key() };
    let body = match super::server::read_body(req, MAX_COSIGNATURE_BODY).await {
        Ok(b) => b,
        Err(r) => return r,
    };
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        checkpoint: String,
        cosignature: String,
        key: String,
    }
    let b: Body = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the body must be {{\"checkpoint\", \"cosignature\", \"key\"}}: {e}"),
            );
        }
    };
    let bad = |m: String| refusal(StatusCode::BAD_REQUEST, "bad_cosignature", m);
    let key = match NoteVerifier::parse(&b.key) {
        Ok(k) if k.alg == crate::tlog::note::ALG_COSIGNATURE_V1 => k,
        Ok(_) => return bad("`key` must be a cosignature/v1 verifier key (type 0x04)".into()),
        Err(e) => return bad(format!("`key`: {e}")),
    };
    let note = match Note::parse(&b.checkpoint) {
        Ok(n) => n,
        Err(e) => return bad(format!("`checkpoint`: {e}")),
    };
    if note.verify(&log_key).is_err() {
        return refusal(
            StatusCode::CONFLICT,
            "unknown_checkpoint",
            "`checkpoint` is not signed by this log's key",
        );
    }
    let cp = match Checkpoint::parse(&note.text) {
        Ok(c) => c,
        Err(e) => return bad(format!("`checkpoint`: {e}")),
    };
    let sig = match parse_sig_line(&b.cosignature) {
        Ok(s) => s,
        Err(e) => return bad(format!("`cosignature`: {e}")),
    };
    let time = match crate::tlog::note::verify_cosignature_line(&note.text, &sig, &key) {
        Ok(t) => t,
        Err(e) => return bad(format!("the cosignature does not verify under `key`: {e}")),
    };
    // The body must be one this server signed and stored (same size and root).
    match st.store.log_checkpoint(Some(cp.size)).await {
        Ok(Some(ours)) if ours.root == cp.root => {}
        Ok(_) => {
            return refusal(
                StatusCode::CONFLICT,
                "unknown_checkpoint",
                format!("this log never stored a checkpoint of size {} with that root", cp.size),
            );
        }
        Err(e) => return store_error(e),
    }
    let key_text = key.to_string();
    let line = sig.to_line();
    let c = NewCosignature {
        user_id: &user.id,
        key: &key_text,
        size: cp.size,
        root: cp.root,
        time,
        line: &line,
        at: now_micros(),
    };
    match st.store.log_add_cosignature(&c).await {
        Ok(n) => json_resp(StatusCode::OK, &json!({"tree_size": cp.size, "witnesses": n})),
        Err(StoreError::Conflict(m)) => refusal(StatusCode::CONFLICT, "key_taken", m),
        Err(e) => store_error(e),
    }
}

/// What a created or duplicate ingest item says about its leaf (docs/evidence.md
/// "Receipts").
pub fn receipt(item: &mut serde_json::Value, leaf_index: Option<u64>, received_at: Micros) {
    match leaf_index {
        Some(i) => item["leaf_index"] = json!(i),
        None => {
            item["leaf_pending"] = json!(true);
            item["deadline"] =
                json!(format_micros(received_at + MERGE_DELAY.as_micros() as Micros));
        }
    }
}

/// The log's part of an export of `q` (docs/evidence.md "Exports"): the header's `log`
/// object and what the stream adds per event. Without a signing key or a checkpoint: `null`
/// and nothing.
pub async fn export_part<S: Store>(
    st: &AppState<S>,
    q: &super::store::EventQuery,
) -> Result<(serde_json::Value, Option<super::reads::export::ExportLog>), StoreError> {
    let Some(key) = st.log.verifier() else { return Ok((serde_json::Value::Null, None)) };
    // Cover what is stored now when the sequencer signs it within moments. Read from the
    // store, not this instance's memory: with PostgreSQL another instance may be the signer.
    let head = st.store.log_head().await?;
    let mut latest = st.store.log_checkpoint(None).await?;
    if latest.as_ref().is_none_or(|c| c.size < head.size) {
        st.log.wake();
        let until = tokio::time::Instant::now() + EXPORT_WAIT;
        while latest.as_ref().is_none_or(|c| c.size < head.size)
            && tokio::time::Instant::now() < until
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
            latest = st.store.log_checkpoint(None).await?;
        }
    }
    let Some(cp) = latest else {
        return Ok((serde_json::Value::Null, None));
    };
    let mut consistency = Vec::new();
    if let Some((w, _)) = st.store.log_witnessed().await?
        && w < cp.size
        && w > 0
        && let Some(from) = st.store.log_checkpoint(Some(w)).await?
    {
        match st.log.consistency(&st.store, w, cp.size).await? {
            Ok(h) => consistency.push(json!({"checkpoint": from.note, "hashes": hashes_json(&h)})),
            Err(e) => return Err(StoreError::Other(format!("consistency proof: {e}"))),
        }
    }
    // A leaf holds user, source, id and received_at only: orphans are looked for only when
    // nothing else narrows the export.
    let whole = q.source.is_none()
        && q.session.is_none()
        && q.any_session.is_none()
        && q.since.is_none()
        && q.until.is_none()
        && q.ts_since.is_none()
        && q.ts_until.is_none()
        && q.flagged.is_none()
        && q.kinds.is_empty()
        && q.after.is_none();
    let orphan_users = if whole {
        Some(match &q.user_id {
            Some(u) => vec![u.clone()],
            None => st.store.list_users().await?.into_iter().map(|u| u.id).collect(),
        })
    } else {
        None
    };
    let header = json!({
        "key": key.to_string(),
        "checkpoint": cp.note,
        "tree_size": cp.size,
        "consistency": consistency,
        "orphans_checked": orphan_users.is_some(),
    });
    Ok((header, Some(super::reads::export::ExportLog { size: cp.size, orphan_users })))
}
