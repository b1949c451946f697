//! The daemon's caches of parsed layers and built policies, keyed by content digest
//! (capability `layer_digests`, docs/service.md): a client names its user and repo layers by the
//! SHA-256 of their bytes and sends a file's text only when the daemon does not hold it, so a
//! session with a large policy costs neither a re-parse nor a rebuilt index.
//!
//! Keys are digests this daemon computed itself over the text it parsed, never a digest a
//! client merely claims: a text whose digest differs from the one sent is refused, and a
//! changed file has a different digest, so it can never be served from an older parse. Both
//! caches are bounded in entries and in bytes of source text and evict the least recently used.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use super::state::lock;
use crate::config::{BuiltPolicy, ConfigError, LayerDoc, ReviewServer};
use crate::policy::{LayerKind, Policy};
use crate::protocol as wire;

/// Parsed layers held at most (a user layer and a repo layer per checkout in use).
pub(super) const MAX_LAYERS: usize = 64;
/// Source bytes of parsed layers held at most (a layer file is at most 1 MiB).
pub(super) const MAX_LAYER_BYTES: usize = 32 << 20;
/// Built policies held at most (one per combination of managed, user and repo layer in use).
pub(super) const MAX_POLICIES: usize = 16;
/// Source bytes behind the built policies held at most.
pub(super) const MAX_POLICY_BYTES: usize = 32 << 20;

/// A map bounded in entries and in the total weight of its values (their source bytes) that
/// evicts the least recently used entry first.
#[derive(Debug)]
pub(super) struct Bounded<K, V> {
    map: HashMap<K, Slot<V>>,
    max_entries: usize,
    max_bytes: usize,
    bytes: usize,
    tick: u64,
}

#[derive(Debug)]
struct Slot<V> {
    value: Arc<V>,
    bytes: usize,
    used: u64,
}

impl<K: Eq + Hash + Clone, V> Bounded<K, V> {
    pub(super) fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self { map: HashMap::new(), max_entries, max_bytes, bytes: 0, tick: 0 }
    }

    pub(super) fn get(&mut self, key: &K) -> Option<Arc<V>> {
        self.tick += 1;
        let slot = self.map.get_mut(key)?;
        slot.used = self.tick;
        Some(Arc::clone(&slot.value))
    }

    /// Stores `value` (weighing `bytes`), evicting the least recently used entries until both
    /// bounds hold. A value heavier than the byte bound alone is not stored.
    pub(super) fn insert(&mut self, key: K, value: Arc<V>, bytes: usize) {
        if bytes > self.max_bytes || self.max_entries == 0 {
            return;
        }
        self.tick += 1;
        if let Some(old) = self.map.insert(key, Slot { value, bytes, used: self.tick }) {
            self.bytes -= old.bytes;
        }
        self.bytes += bytes;
        while self.map.len() > self.max_entries || self.bytes > self.max_bytes {
            let Some(oldest) = self.map.iter().min_by_key(|(_, s)| s.used).map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(gone) = self.map.remove(&oldest) {
                self.bytes -= gone.bytes;
            }
        }
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    #[cfg(test)]
    pub(super) fn bytes(&self) -> usize {
        self.bytes
    }
}

/// A parsed layer's identity: its kind, the file as the user sees it (it names the file in
/// decisions and errors) and the SHA-256 of its bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct LayerKey {
    kind: LayerKind,
    name: String,
    digest: String,
}

impl LayerKey {
    fn of(doc: &LayerDoc) -> Self {
        Self { kind: doc.kind, name: doc.name.clone(), digest: doc.digest.clone() }
    }
}

/// What a built policy was built from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct PolicyKey {
    managed: Option<LayerKey>,
    user: Option<LayerKey>,
    repo: Option<LayerKey>,
    review: Vec<(String, LayerKind, String)>,
}

/// A built evaluator shared by every session with the same layers.
#[derive(Debug)]
pub(super) struct SharedPolicy {
    pub(super) policy: Arc<Policy>,
}

/// Why a request's layer sources cannot be used.
#[derive(Debug, thiserror::Error)]
pub(super) enum SourceError {
    /// Sources without text that this daemon does not hold (their digests).
    #[error(
        "airlockd does not hold the layer(s) {}; resend them with their text",
        .0.join(", ")
    )]
    Unknown(Vec<String>),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// The layers a request named by content, resolved.
#[derive(Debug, Default)]
pub(super) struct Resolved {
    pub(super) user: Option<Arc<LayerDoc>>,
    pub(super) repo: Option<Arc<LayerDoc>>,
}

/// The daemon's parsed layers and built policies.
#[derive(Debug)]
pub(super) struct LayerCache {
    layers: Bounded<LayerKey, LayerDoc>,
    policies: Bounded<PolicyKey, SharedPolicy>,
}

impl Default for LayerCache {
    fn default() -> Self {
        Self::with_bounds(MAX_LAYERS, MAX_LAYER_BYTES, MAX_POLICIES, MAX_POLICY_BYTES)
    }
}

fn kind_of(kind: wire::LayerKind) -> LayerKind {
    match kind {
        wire::LayerKind::Managed => LayerKind::Managed,
        wire::LayerKind::User => LayerKind::User,
        wire::LayerKind::Repo => LayerKind::Repo,
        wire::LayerKind::Operator => LayerKind::Operator,
        wire::LayerKind::None => LayerKind::None,
    }
}

impl LayerCache {
    pub(super) fn with_bounds(
        layers: usize,
        layer_bytes: usize,
        policies: usize,
        policy_bytes: usize,
    ) -> Self {
        Self {
            layers: Bounded::new(layers, layer_bytes),
            policies: Bounded::new(policies, policy_bytes),
        }
    }

    /// (held layers, their source bytes, held policies).
    #[cfg(test)]
    pub(super) fn sizes(&self) -> (usize, usize, usize) {
        (self.layers.len(), self.layers.bytes(), self.policies.len())
    }
}

/// Resolves `sources` (at most one user and one repo layer) against `cache`, parsing each text
/// the cache does not hold. The lock is taken only around lookups and inserts, never around a
/// parse. Every source without text that is not held is listed in one
/// [`SourceError::Unknown`], so one resend settles them all.
pub(super) fn resolve(
    cache: &std::sync::Mutex<LayerCache>,
    sources: &[wire::LayerSource],
) -> Result<Resolved, SourceError> {
    let mut out = Resolved::default();
    let mut unknown = Vec::new();
    for source in sources {
        let kind = kind_of(source.kind);
        let slot = match kind {
            LayerKind::User => &mut out.user,
            LayerKind::Repo => &mut out.repo,
            other => {
                return Err(SourceError::Invalid(format!(
                    "layer source {} claims kind {other}; a client sends only its user and repo \
                     layers (the daemon reads the managed layer itself)",
                    source.name
                )));
            }
        };
        if slot.is_some() {
            return Err(SourceError::Invalid(format!(
                "two {kind} layer sources in one request ({})",
                source.name
            )));
        }
        let doc = match &source.text {
            Some(text) => {
                // Keyed by what this daemon computes over the bytes it parses.
                let digest = crate::config::digest(text.as_bytes());
                if digest != source.digest {
                    return Err(SourceError::Invalid(format!(
                        "layer source {}: its text has SHA-256 {digest}, not the {} sent with it",
                        source.name, source.digest
                    )));
                }
                let key = LayerKey { kind, name: source.name.clone(), digest };
                let held = lock(cache).layers.get(&key);
                match held {
                    Some(doc) => doc,
                    None => {
                        let parsed =
                            crate::config::parse_layer(kind, &source.name, text.as_bytes())?;
                        let doc = Arc::new(parsed.doc);
                        lock(cache).layers.insert(key, Arc::clone(&doc), text.len());
                        doc
                    }
                }
            }
            None => {
                let key =
                    LayerKey { kind, name: source.name.clone(), digest: source.digest.clone() };
                match lock(cache).layers.get(&key) {
                    Some(doc) => doc,
                    None => {
                        unknown.push(source.digest.clone());
                        continue;
                    }
                }
            }
        };
        *slot = Some(doc);
    }
    if unknown.is_empty() { Ok(out) } else { Err(SourceError::Unknown(unknown)) }
}

/// The built policy for `managed` (read by the daemon) over `resolved` and the client's
/// review-plane servers: from the cache when the same layers were built before, else built
/// (by the same code as every other path, [`crate::config::build_client_policy`]) and kept.
pub(super) fn policy(
    cache: &std::sync::Mutex<LayerCache>,
    managed: Option<&LayerDoc>,
    resolved: &Resolved,
    review: &[ReviewServer],
) -> Result<Arc<SharedPolicy>, ConfigError> {
    let key = PolicyKey {
        managed: managed.map(LayerKey::of),
        user: resolved.user.as_deref().map(LayerKey::of),
        repo: resolved.repo.as_deref().map(LayerKey::of),
        review: review.iter().map(|r| (r.server.clone(), r.layer, r.policy.clone())).collect(),
    };
    if let Some(hit) = lock(cache).policies.get(&key) {
        return Ok(hit);
    }
    let BuiltPolicy { policy, .. } = crate::config::build_client_policy(
        managed,
        resolved.user.as_deref(),
        resolved.repo.as_deref(),
        review,
    )?;
    let shared = Arc::new(SharedPolicy { policy: Arc::new(policy) });
    let bytes = [managed, resolved.user.as_deref(), resolved.repo.as_deref()]
        .into_iter()
        .flatten()
        .map(source_bytes)
        .sum();
    lock(cache).policies.insert(key, Arc::clone(&shared), bytes);
    Ok(shared)
}

/// About the bytes of the file a parsed layer came from (its entries' text), for the bound.
fn source_bytes(doc: &LayerDoc) -> usize {
    let n = &doc.network;
    n.allow.iter().chain(&n.block).map(|e| e.len() + 4).sum::<usize>() + 64
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    fn source(kind: wire::LayerKind, text: &str, with_text: bool) -> wire::LayerSource {
        wire::LayerSource {
            kind,
            name: match kind {
                wire::LayerKind::Repo => "/src/app/.airlock.toml".into(),
                _ => "~/.airlock/config.toml".into(),
            },
            digest: crate::config::digest(text.as_bytes()),
            text: with_text.then(|| text.to_owned()),
        }
    }

    const USER: &str = "[network]\nallow = [\"a.test\"]\n";

    #[test]
    fn bounded_evicts_the_least_recently_used_by_entries_and_by_bytes() {
        let mut b: Bounded<&str, u8> = Bounded::new(2, 10);
        b.insert("a", Arc::new(1), 3);
        b.insert("b", Arc::new(2), 3);
        assert!(b.get(&"a").is_some(), "a is now the most recent");
        b.insert("c", Arc::new(3), 3);
        assert!(b.get(&"b").is_none(), "b was least recently used");
        assert!(b.get(&"a").is_some() && b.get(&"c").is_some());
        assert_eq!((b.len(), b.bytes()), (2, 6));
        // Bytes: 6 + 8 > 10 evicts the oldest (a), then c, leaving only d.
        b.insert("d", Arc::new(4), 8);
        assert_eq!((b.len(), b.bytes()), (1, 8));
        assert!(b.get(&"d").is_some());
        // Heavier than the whole bound: not stored, nothing evicted.
        b.insert("e", Arc::new(5), 11);
        assert!(b.get(&"e").is_none() && b.get(&"d").is_some());
        // Replacing a key re-weighs it.
        b.insert("d", Arc::new(6), 2);
        assert_eq!((b.len(), b.bytes()), (1, 2));
        assert_eq!(*b.get(&"d").unwrap(), 6);
    }

    #[test]
    fn a_source_without_text_is_unknown_until_its_text_was_parsed() {
        let cache = Mutex::new(LayerCache::default());
        let bare = [source(wire::LayerKind::User, USER, false)];
        let err = resolve(&cache, &bare).unwrap_err();
        assert!(matches!(&err, SourceError::Unknown(d) if d == &[bare[0].digest.clone()]), "{err}");
        // The text parses once (a miss), then the bare digest is a hit on the same document.
        let first = resolve(&cache, &[source(wire::LayerKind::User, USER, true)]).unwrap();
        let hit = resolve(&cache, &bare).unwrap();
        assert!(Arc::ptr_eq(first.user.as_ref().unwrap(), hit.user.as_ref().unwrap()));
        assert_eq!(hit.user.as_ref().unwrap().network.allow, ["a.test"]);
        assert_eq!(cache.lock().unwrap().sizes().0, 1);
    }

    #[test]
    fn changed_bytes_are_a_miss_never_the_old_parse() {
        let cache = Mutex::new(LayerCache::default());
        resolve(&cache, &[source(wire::LayerKind::User, USER, true)]).unwrap();
        // One byte more (a trailing newline) is another file.
        let changed = format!("{USER}\n");
        let err = resolve(&cache, &[source(wire::LayerKind::User, &changed, false)]).unwrap_err();
        assert!(matches!(err, SourceError::Unknown(_)), "{err}");
        let other = "[network]\nallow = [\"b.test\"]\n";
        let got = resolve(&cache, &[source(wire::LayerKind::User, other, true)]).unwrap();
        assert_eq!(got.user.unwrap().network.allow, ["b.test"]);
        // The same bytes under another file name are another key (names attribute decisions).
        let mut renamed = source(wire::LayerKind::User, USER, false);
        renamed.name = "~/elsewhere.toml".into();
        assert!(matches!(resolve(&cache, &[renamed]), Err(SourceError::Unknown(_))));
    }

    #[test]
    fn a_text_whose_digest_is_not_the_one_sent_is_refused() {
        let cache = Mutex::new(LayerCache::default());
        let mut lying = source(wire::LayerKind::User, USER, true);
        lying.digest = crate::config::digest(b"something else");
        let err = resolve(&cache, &[lying.clone()]).unwrap_err();
        assert!(matches!(err, SourceError::Invalid(_)), "{err}");
        // Nothing was stored under either digest.
        lying.text = None;
        assert!(matches!(resolve(&cache, &[lying]), Err(SourceError::Unknown(_))));
        assert_eq!(cache.lock().unwrap().sizes(), (0, 0, 0));
    }

    #[test]
    fn sources_are_parsed_as_their_layer_and_only_user_and_repo_are_accepted() {
        let cache = Mutex::new(LayerCache::default());
        // A repo file may not carry [review]: the daemon's parse refuses it with file:line:col.
        let repo = "[review]\nservers = [\"r.test\"]\n";
        let err = resolve(&cache, &[source(wire::LayerKind::Repo, repo, true)]).unwrap_err();
        assert!(err.to_string().contains("/src/app/.airlock.toml:1:2"), "{err}");
        for kind in [wire::LayerKind::Managed, wire::LayerKind::Operator] {
            let err = resolve(&cache, &[source(kind, USER, true)]).unwrap_err();
            assert!(matches!(err, SourceError::Invalid(_)), "{err}");
        }
        let twice =
            [source(wire::LayerKind::User, USER, true), source(wire::LayerKind::User, USER, true)];
        assert!(matches!(resolve(&cache, &twice), Err(SourceError::Invalid(_))));
    }

    #[test]
    fn the_layer_cache_is_bounded_in_entries_and_bytes() {
        let cache = Mutex::new(LayerCache::with_bounds(2, 1 << 20, 1, 1 << 20));
        let texts: Vec<String> =
            (0..3).map(|i| format!("[network]\nallow = [\"h{i}.test\"]\n")).collect();
        for t in &texts {
            resolve(&cache, &[source(wire::LayerKind::User, t, true)]).unwrap();
        }
        assert_eq!(cache.lock().unwrap().sizes().0, 2);
        // The first was evicted and must be resent; the last two are held.
        let bare = |t: &str| [source(wire::LayerKind::User, t, false)];
        assert!(matches!(resolve(&cache, &bare(&texts[0])), Err(SourceError::Unknown(_))));
        assert!(resolve(&cache, &bare(&texts[2])).is_ok());
        // A byte bound smaller than one file keeps nothing, and still serves the request.
        let tiny = Mutex::new(LayerCache::with_bounds(8, 10, 8, 10));
        assert!(resolve(&tiny, &[source(wire::LayerKind::User, &texts[0], true)]).is_ok());
        assert_eq!(tiny.lock().unwrap().sizes(), (0, 0, 0));
    }

    #[test]
    fn built_policies_are_shared_per_combination_of_layers() {
        let cache = Mutex::new(LayerCache::default());
        let user = resolve(&cache, &[source(wire::LayerKind::User, USER, true)]).unwrap();
        let a = policy(&cache, None, &user, &[]).unwrap();
        let b = policy(&cache, None, &user, &[]).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "the second session reuses the built policy");
        // Another review server (or managed layer) is another policy.
        let review = [ReviewServer {
            server: "review.test".into(),
            layer: LayerKind::User,
            policy: "~/.airlock/identity.toml".into(),
        }];
        let c = policy(&cache, None, &user, &review).unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        let t = crate::policy::parse_target("review.test").unwrap();
        let d = c.policy.decide(&t.host, 443, &crate::policy::LocalAddrs::none());
        assert_eq!(d.reason, crate::policy::Reason::ReviewPlane);
        let managed = crate::config::parse_layer(
            LayerKind::Managed,
            "/etc/airlock/policy.toml",
            b"[network]\nblock = [\"a.test\"]\n",
        )
        .unwrap()
        .doc;
        let m = policy(&cache, Some(&managed), &user, &[]).unwrap();
        let t = crate::policy::parse_target("a.test").unwrap();
        let d = m.policy.decide(&t.host, 443, &crate::policy::LocalAddrs::none());
        assert_eq!(d.verdict, crate::policy::Verdict::Deny);
        assert_eq!(cache.lock().unwrap().sizes().2, 3);
        // An empty allowlist is refused as on every other path.
        let empty = resolve(&cache, &[source(wire::LayerKind::User, "", true)]).unwrap();
        let err = policy(&cache, None, &empty, &[]).unwrap_err();
        assert!(matches!(err, ConfigError::EmptyAllowlist { .. }), "{err}");
    }
}
