//! What a session needs from its layers, cached by the layers' content digests so that
//! `airlock exec` with a large policy neither re-parses it nor rebuilds its index (issue 15):
//! [`load_session`].
//!
//! A session needs from the applied layers only their `[env]`, `[mcp]`, `[terminal]` and
//! `[review]` tables, the knowledge that the policy builds (an empty allowlist refuses to
//! start), and the layer files themselves, which go to the daemon by digest (capability
//! `layer_digests`) — the daemon parses and builds them itself. So the cache holds, per
//! combination of layer files, those documents *without* their network entries ("slim"), in
//! `~/.airlock/parsed/<key>.json`. `<key>` is a SHA-256 over this build's version and each
//! applied file's name and SHA-256: a changed byte in any file, a change of trust or identity
//! server, or another airlock build is another key, never a stale entry.
//!
//! The cache is a convenience, never an authority: an entry is used only if it is a private
//! file (ours, mode 0600), parses, and names exactly the key and the layers (kind, file name,
//! digest) just read; anything else is ignored and rebuilt from the files. Even a forged entry
//! could not widen what a session may reach: the daemon builds the policy from the files'
//! bytes itself. `~/.airlock` is never bound into a sandbox, so no agent can write here.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{
    ConfigError, Identity, LayerDoc, Loaded, RawLayers, ReviewServer, fsutil, identity_server,
    read_layers, review_servers_of,
};
use crate::paths::Paths;
use crate::policy::LayerKind;
use crate::protocol as wire;
use crate::repo::Repo;

/// Bumped whenever what an entry holds changes meaning.
const FORMAT: u32 = 3;
/// Entries kept at most; the least recently written beyond it are removed.
const MAX_ENTRIES: usize = 32;
/// An entry larger than this is not read (a slim entry is a few KiB).
const MAX_ENTRY_BYTES: u64 = 1 << 20;

/// `~/.airlock/parsed/`: the CLI's cache of slim layer documents.
pub fn cache_dir(paths: &Paths) -> PathBuf {
    paths.airlock_dir().join("parsed")
}

/// One cache file.
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    format: u32,
    key: String,
    /// The applied layers (managed, user, trusted repo) without network entries.
    slim: Vec<LayerDoc>,
}

/// What one session takes from its configuration.
#[derive(Debug, Clone, Default)]
pub struct SessionLayers {
    /// The applied layers in order (managed, user, trusted repo) *without their network
    /// entries*: enough for [`super::sandbox_env`] and [`super::terminal_policy`], never for a
    /// policy.
    pub slim: Vec<LayerDoc>,
    /// The user layer and the trusted repo layer by content, each with its text.
    pub sources: Vec<wire::LayerSource>,
    /// The review-plane servers the client sends (user layer and identity).
    pub review_servers: Vec<ReviewServer>,
    /// The fully parsed layers, when they were parsed (a cache miss).
    pub loaded: Option<Loaded>,
}

impl SessionLayers {
    /// True when the layers came from the cache (nothing was parsed).
    pub fn from_cache(&self) -> bool {
        self.loaded.is_none()
    }
}

/// Reads the layer files once and returns what a session needs: from the cache when an entry
/// for exactly these bytes exists, else parsed, checked (the policy must build) and cached.
pub fn load_session(
    paths: &Paths,
    repo: &Repo,
    identity: Option<&Identity>,
) -> Result<SessionLayers, ConfigError> {
    let raw = read_layers(paths, Some(repo))?;
    let server = identity_server(paths, identity)?;
    let expected = expected_layers(&raw);
    let key = key(&expected, server.as_ref());
    let sources = sources(&raw);
    let client_review = |slim: &[LayerDoc]| {
        let mut review: Vec<ReviewServer> =
            slim.iter().filter(|d| d.kind == LayerKind::User).flat_map(review_servers_of).collect();
        review.extend(server.clone());
        review
    };
    if let Some(sources) = &sources
        && let Some(slim) = read_entry(paths, &key, &expected)
    {
        let review_servers = client_review(&slim);
        return Ok(SessionLayers { slim, sources: sources.clone(), review_servers, loaded: None });
    }
    let loaded = raw.parse(paths, identity)?;
    loaded.build_policy()?;
    let slim: Vec<LayerDoc> = loaded.applied().into_iter().map(slim_of).collect();
    if sources.is_some() {
        write_entry(paths, &key, &slim);
    }
    let review_servers = client_review(&slim);
    Ok(SessionLayers {
        slim,
        sources: sources.unwrap_or_default(),
        review_servers,
        loaded: Some(loaded),
    })
}

/// (kind, name, digest) of each layer that applies: managed, user, and the repo file when
/// trusted.
fn expected_layers(raw: &RawLayers) -> Vec<(LayerKind, String, String)> {
    let mut out = Vec::new();
    if let Some((name, bytes)) = &raw.managed {
        out.push((LayerKind::Managed, name.clone(), super::digest(bytes)));
    }
    if let Some((name, bytes)) = &raw.user {
        out.push((LayerKind::User, name.clone(), super::digest(bytes)));
    }
    if let Some(file) = raw.repo.as_ref().filter(|f| f.trust.is_trusted()) {
        out.push((LayerKind::Repo, file.name.clone(), file.digest.clone()));
    }
    out
}

/// The user and trusted repo files as sources with their text; `None` when one is not UTF-8
/// (the parse then reports it with its position).
fn sources(raw: &RawLayers) -> Option<Vec<wire::LayerSource>> {
    let mut out = Vec::new();
    let user = raw.user.as_ref().map(|(n, b)| (wire::LayerKind::User, n, b));
    let repo = raw
        .repo
        .as_ref()
        .filter(|f| f.trust.is_trusted())
        .map(|f| (wire::LayerKind::Repo, &f.name, &f.bytes));
    for (kind, name, bytes) in user.into_iter().chain(repo) {
        let text = std::str::from_utf8(bytes).ok()?;
        out.push(wire::LayerSource {
            kind,
            name: name.clone(),
            digest: super::digest(bytes),
            text: Some(text.to_owned()),
        });
    }
    Some(out)
}

fn key(expected: &[(LayerKind, String, String)], server: Option<&ReviewServer>) -> String {
    let mut h = Sha256::new();
    // Length-prefixed fields: no two different inputs hash the same bytes.
    let mut field = |s: &str| {
        h.update((s.len() as u64).to_be_bytes());
        h.update(s.as_bytes());
    };
    field("airlock session layers");
    field(&FORMAT.to_string());
    field(env!("CARGO_PKG_VERSION"));
    // Two builds of one version may shape `LayerDoc` differently (a field added between
    // releases would deserialize as its default and silently drop a setting): the installed
    // binary's identity joins the key, so a new binary never reads an older one's entries.
    field(&binary_identity());
    for (kind, name, digest) in expected {
        field(&kind.to_string());
        field(name);
        field(digest);
    }
    field(server.map(|s| s.server.as_str()).unwrap_or(""));
    hex::encode(h.finalize())
}

/// The running binary as installed: size, modification time and inode of `/proc/self/exe`
/// (proc(5)); empty where it cannot be read, which only makes the key less specific.
fn binary_identity() -> String {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/exe")
        .map(|m| format!("{}:{}.{}:{}", m.len(), m.mtime(), m.mtime_nsec(), m.ino()))
        .unwrap_or_default()
}

/// A layer document without its network entries (mode and `allow_private` stay).
fn slim_of(doc: &LayerDoc) -> LayerDoc {
    let mut slim = LayerDoc {
        network: Default::default(),
        env_pass: doc.env_pass.clone(),
        mcp: doc.mcp.clone(),
        review_servers: doc.review_servers.clone(),
        terminal: doc.terminal.clone(),
        audit: doc.audit,
        sandbox: doc.sandbox.clone(),
        logs: doc.logs,
        publish: doc.publish,
        gate: doc.gate.clone(),
        // Kept: `--phase` is checked against the phases the layers define.
        phases: doc.phases.clone(),
        kind: doc.kind,
        name: doc.name.clone(),
        digest: doc.digest.clone(),
    };
    slim.network.mode = doc.network.mode;
    slim
}

fn entry_path(paths: &Paths, key: &str) -> PathBuf {
    cache_dir(paths).join(format!("{key}.json"))
}

/// The slim documents of a valid entry for `key`, or `None` (missing, not private, corrupt, or
/// naming other layers than `expected`: ignored, and rebuilt by the caller).
fn read_entry(
    paths: &Paths,
    key: &str,
    expected: &[(LayerKind, String, String)],
) -> Option<Vec<LayerDoc>> {
    let path = entry_path(paths, key);
    let size = std::fs::symlink_metadata(&path).ok()?.len();
    if size > MAX_ENTRY_BYTES {
        return None;
    }
    let bytes = fsutil::read_private(&path).ok()??;
    let entry: Entry = serde_json::from_slice(&bytes).ok()?;
    let layers: Vec<(LayerKind, String, String)> =
        entry.slim.iter().map(|d| (d.kind, d.name.clone(), d.digest.clone())).collect();
    let valid = entry.format == FORMAT
        && entry.key == key
        && layers == expected
        && entry.slim.iter().all(|d| d.network.allow.is_empty() && d.network.block.is_empty());
    valid.then_some(entry.slim)
}

/// Writes the entry for `key` (atomically, 0600) and keeps the directory bounded. A failure
/// only costs the next session a parse.
fn write_entry(paths: &Paths, key: &str, slim: &[LayerDoc]) {
    let entry = Entry { format: FORMAT, key: key.to_owned(), slim: slim.to_vec() };
    let Ok(bytes) = serde_json::to_vec(&entry) else { return };
    if let Err(e) = fsutil::write_private(&entry_path(paths, key), &bytes) {
        tracing::debug!("cannot write the layer cache: {e}");
        return;
    }
    prune(&cache_dir(paths));
}

/// Removes the least recently written entries beyond [`MAX_ENTRIES`].
fn prune(dir: &std::path::Path) {
    let Ok(read) = std::fs::read_dir(dir) else { return };
    let mut entries: Vec<(std::time::SystemTime, PathBuf)> = read
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".json"))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    if entries.len() <= MAX_ENTRIES {
        return;
    }
    entries.sort();
    let excess = entries.len() - MAX_ENTRIES;
    for (_, path) in entries.into_iter().take(excess) {
        let _ = std::fs::remove_file(path);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    struct Fixture {
        _tmp: tempfile::TempDir,
        paths: Paths,
        repo: Repo,
    }

    fn fixture(user: &str) -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        std::fs::create_dir_all(home.join(".airlock")).unwrap();
        // A managed file that does not exist (test-hooks builds honour the override).
        let env = crate::env::MapEnv::new()
            .with("HOME", &home)
            .with(crate::paths::TEST_MANAGED_POLICY_VAR, tmp.path().join("no-managed.toml"));
        let paths = if cfg!(feature = "test-hooks") {
            Paths::from_env(&env).unwrap()
        } else {
            Paths::with_home(home)
        };
        std::fs::write(paths.user_config(), user).unwrap();
        std::fs::create_dir_all(tmp.path().join("app")).unwrap();
        let repo = Repo::resolve(Some(&tmp.path().join("app")), tmp.path()).unwrap();
        Fixture { _tmp: tmp, paths, repo }
    }

    const USER: &str = "[network]\nallow = [\"a.test\", \"b.test\"]\n[env]\npass = [\"RUST_LOG\"]\n\
        [terminal]\nclipboard = \"allow\"\n[review]\nservers = [\"review.test\"]\n";

    /// The user layer's slim document (a managed file may exist where test hooks are off).
    fn user(got: &SessionLayers) -> &LayerDoc {
        got.slim.iter().find(|d| d.kind == LayerKind::User).unwrap()
    }

    fn entries(f: &Fixture) -> Vec<PathBuf> {
        std::fs::read_dir(cache_dir(&f.paths))
            .map(|r| r.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    }

    #[test]
    fn a_miss_parses_and_writes_then_the_same_bytes_hit() {
        let f = fixture(USER);
        let first = load_session(&f.paths, &f.repo, None).unwrap();
        assert!(!first.from_cache());
        assert_eq!(entries(&f).len(), 1);
        let second = load_session(&f.paths, &f.repo, None).unwrap();
        assert!(second.from_cache(), "the same bytes are a hit");
        assert_eq!(second.slim, first.slim);
        let user = user(&second);
        assert_eq!(user.env_pass, ["RUST_LOG"]);
        assert!(user.network.allow.is_empty(), "slim documents carry no entries");
        assert_eq!(second.review_servers.len(), 1);
        // The source carries the file's exact bytes and their digest.
        assert_eq!(second.sources.len(), 1);
        assert_eq!(second.sources[0].text.as_deref(), Some(USER));
        assert_eq!(second.sources[0].digest, crate::config::digest(USER.as_bytes()));
        // The cache file is private.
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&entries(&f)[0]).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
    }

    #[test]
    fn changed_bytes_miss_and_take_effect() {
        let f = fixture(USER);
        load_session(&f.paths, &f.repo, None).unwrap();
        let changed = USER.replace("RUST_LOG", "OTHER_VAR");
        std::fs::write(f.paths.user_config(), &changed).unwrap();
        let got = load_session(&f.paths, &f.repo, None).unwrap();
        assert!(!got.from_cache());
        assert_eq!(user(&got).env_pass, ["OTHER_VAR"]);
        assert_eq!(got.sources[0].text.as_deref(), Some(changed.as_str()));
        // A file that no longer builds is refused, whatever the cache holds.
        std::fs::write(f.paths.user_config(), "[env]\npass = [\"X\"]\n").unwrap();
        let err = load_session(&f.paths, &f.repo, None).unwrap_err();
        assert!(matches!(err, ConfigError::EmptyAllowlist { .. }), "{err}");
    }

    #[test]
    fn a_corrupt_or_forged_entry_is_ignored_and_rebuilt() {
        let f = fixture(USER);
        load_session(&f.paths, &f.repo, None).unwrap();
        let path = entries(&f).pop().unwrap();
        let good = std::fs::read(&path).unwrap();
        let mut forged: serde_json::Value = serde_json::from_slice(&good).unwrap();
        let last = forged["slim"].as_array().unwrap().len() - 1;
        forged["slim"][last]["env_pass"] = serde_json::json!(["FORGED"]);
        forged["slim"][last]["digest"] = serde_json::json!("00");
        for bad in [
            b"not json at all".to_vec(),
            good[..good.len() / 2].to_vec(),
            serde_json::to_vec(&forged).unwrap(),
        ] {
            fsutil::write_private(&path, &bad).unwrap();
            let got = load_session(&f.paths, &f.repo, None).unwrap();
            assert!(!got.from_cache(), "a bad entry is never used");
            assert_eq!(user(&got).env_pass, ["RUST_LOG"]);
            // ...and was replaced by a good one.
            assert!(load_session(&f.paths, &f.repo, None).unwrap().from_cache());
        }
        // An entry others could have written is not trusted either.
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        assert!(!load_session(&f.paths, &f.repo, None).unwrap().from_cache());
    }

    #[test]
    fn the_repo_file_joins_the_key_only_while_trusted() {
        let f = fixture(USER);
        let file = f.repo.config_file();
        std::fs::write(&file, "[network]\nallow = [\"repo.test\"]\n[env]\npass = [\"R\"]\n")
            .unwrap();
        let untrusted = load_session(&f.paths, &f.repo, None).unwrap();
        assert!(untrusted.slim.iter().all(|d| d.kind != LayerKind::Repo));
        assert_eq!(untrusted.sources.len(), 1);
        let digest = crate::config::digest(&std::fs::read(&file).unwrap());
        crate::config::trust::trust(&f.paths, &f.repo, &digest).unwrap();
        let trusted = load_session(&f.paths, &f.repo, None).unwrap();
        assert!(!trusted.from_cache(), "trust changes the key");
        let kinds: Vec<LayerKind> = trusted.slim.iter().map(|d| d.kind).collect();
        assert!(kinds.ends_with(&[LayerKind::User, LayerKind::Repo]), "{kinds:?}");
        assert_eq!(trusted.sources.len(), 2);
        assert!(load_session(&f.paths, &f.repo, None).unwrap().from_cache());
    }

    #[test]
    fn the_directory_is_bounded() {
        let f = fixture(USER);
        for i in 0..MAX_ENTRIES + 5 {
            std::fs::write(f.paths.user_config(), format!("{USER}# {i}\n")).unwrap();
            load_session(&f.paths, &f.repo, None).unwrap();
        }
        assert_eq!(entries(&f).len(), MAX_ENTRIES);
    }
}
