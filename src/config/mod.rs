//! Configuration layers (managed, user, repo), their schema and validation with file:line:col
//! errors, repo trust by content hash, and the identity file.
//!
//! The flow (DESIGN §4): [`load`] reads the managed layer (`/etc/airlock/policy.toml`), the user
//! layer (`~/.airlock/config.toml`) and the repo's `.airlock.toml`; the repo file applies only
//! while [`trust`] says its bytes are trusted. Each file becomes a [`LayerDoc`] (the serializable
//! document the client sends the daemon inside [`ClientLayers`], converted to the protocol's own
//! wire types by `wire`); [`build_policy`] turns layer
//! documents plus the review-plane hosts into the evaluator, with the same code in the CLI
//! (`policy check`), the daemon and the standalone proxy ([`load_operator`]).

pub mod cache;
mod diag;
pub mod fsutil;
pub mod identity;
mod layer;
pub mod layers_file;
pub mod machine_key;
pub mod phase;
pub mod policy_tests;
pub mod review;
pub mod trust;
mod wire;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use diag::{Diagnostic, Diagnostics};
pub use identity::{Identity, IdentityError};
pub use layer::{
    AuditDoc, Credential, GateDoc, GateRuleDoc, LayerDoc, LogsDoc, NetworkDoc, ParsedLayer,
    PhaseDoc, PublishDoc, TerminalDoc, digest, parse_layer, parse_size,
};
pub use trust::{TrustRecord, TrustState};
pub use wire::{documents_from_sources, review_servers_from_wire};

use crate::paths::Paths;
use crate::policy::{self, Host, LayerKind, Policy, PolicyError, PolicyWarning, ReviewHost};
use crate::repo::Repo;
use crate::sandbox::termfilter::{Clipboard, TerminalPolicy};

/// Everything that can make configuration unusable. Each message says where and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// One or more problems in a file, each at `file:line:col`.
    #[error("{}", Diagnostics(.0.clone()))]
    Invalid(Vec<Diagnostic>),
    #[error("cannot read {file}: {source}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// An entry in a received [`LayerDoc`] that does not parse (documents built by [`load`] are
    /// already validated; this guards documents that crossed the control socket).
    #[error("{file}: invalid entry {entry:?}: {reason}")]
    Entry { file: String, entry: String, reason: String },
    #[error("review server {server:?} from {file}: {reason}; give a URL or a host name")]
    ReviewServer { server: String, file: String, reason: String },
    #[error(
        "refusing to start: the allowlist is empty (no `allow` entry in the user layer \
         ~/.airlock/config.toml or a trusted repo .airlock.toml{}); add one, e.g.\n  [network]\n  \
         allow = [\"api.anthropic.com\"]\nto the repo's .airlock.toml (then run `airlock policy \
         trust`) or to ~/.airlock/config.toml, or set mode = \"blocklist\"",
        if *.managed_allow { "; the managed layer's allow entries only narrow the list" } else { "" }
    )]
    EmptyAllowlist {
        /// The managed layer has `allow` entries (they gate, they never count toward the list).
        managed_allow: bool,
    },
    #[error("{0}")]
    Policy(String),
    /// A phase that no layer in force defines, or one whose allowlist is empty.
    #[error("{0}")]
    Phase(String),
    #[error(transparent)]
    Identity(#[from] IdentityError),
}

/// A review-plane server that is always blocked, with where it was configured.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewServer {
    /// As written (URL or host).
    pub server: String,
    pub layer: LayerKind,
    /// The file it came from, as the user sees it.
    pub policy: String,
}

/// What the client sends the daemon for one session (DESIGN §4): the user layer and the
/// *trusted* repo layer as separate documents, plus review-plane hosts the daemon cannot read
/// itself (the user layer's `[review] servers` and the identity's `server`). The daemon adds the
/// managed layer it reads itself and calls [`ClientLayers::build_policy`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientLayers {
    pub user: Option<LayerDoc>,
    pub repo: Option<LayerDoc>,
    pub review_servers: Vec<ReviewServer>,
}

impl ClientLayers {
    /// Builds the evaluator from the managed layer (read by the caller) and these documents.
    /// Documents claiming the wrong kind are rejected: a client cannot pose as managed.
    pub fn build_policy(&self, managed: Option<&LayerDoc>) -> Result<BuiltPolicy, ConfigError> {
        build_client_policy(managed, self.user.as_ref(), self.repo.as_ref(), &self.review_servers)
    }
}

/// [`ClientLayers::build_policy`] over borrowed documents (the daemon's cache holds them shared).
/// Documents claiming the wrong kind are rejected: a client cannot pose as managed, and a
/// review server the client attributes to the managed layer is ignored (the daemon reads that
/// layer's servers itself).
pub fn build_client_policy(
    managed: Option<&LayerDoc>,
    user: Option<&LayerDoc>,
    repo: Option<&LayerDoc>,
    client_review: &[ReviewServer],
) -> Result<BuiltPolicy, ConfigError> {
    build_client_policy_in_phase(managed, user, repo, client_review, None)
}

/// [`build_client_policy`] with phase `phase` in force (`None`: the plain `[network]` lists).
pub fn build_client_policy_in_phase(
    managed: Option<&LayerDoc>,
    user: Option<&LayerDoc>,
    repo: Option<&LayerDoc>,
    client_review: &[ReviewServer],
    phase: Option<&str>,
) -> Result<BuiltPolicy, ConfigError> {
    let mut layers = Vec::new();
    for (doc, kind) in
        [(managed, LayerKind::Managed), (user, LayerKind::User), (repo, LayerKind::Repo)]
    {
        if let Some(doc) = doc {
            if doc.kind != kind {
                return Err(ConfigError::Policy(format!(
                    "layer document {} claims kind {} where {kind} was expected",
                    doc.name, doc.kind
                )));
            }
            layers.push(doc);
        }
    }
    let mut review: Vec<ReviewServer> = managed.map(review_servers_of).unwrap_or_default();
    review.extend(client_review.iter().filter(|r| r.layer != LayerKind::Managed).cloned());
    build_policy_in_phase(&layers, &review, phase)
}

/// The evaluator and the warnings building it raised.
#[derive(Debug)]
pub struct BuiltPolicy {
    pub policy: Policy,
    pub warnings: Vec<PolicyWarning>,
}

impl BuiltPolicy {
    /// Warnings that involve two files. Those within one file are already reported with their
    /// line and column by the file's [`ParsedLayer::warnings`].
    pub fn cross_file_warnings(&self) -> impl Iterator<Item = &PolicyWarning> {
        self.warnings.iter().filter(|w| match w {
            PolicyWarning::AllowAndBlock { allow_policy, block_policy, .. } => {
                allow_policy != block_policy
            }
            PolicyWarning::Duplicate { first_policy, second_policy, .. } => {
                first_policy != second_policy
            }
        })
    }
}

/// The repo's `.airlock.toml` as found on disk.
#[derive(Debug, Clone)]
pub struct RepoFile {
    /// Host path of the file.
    pub path: PathBuf,
    /// The file as the user sees it.
    pub name: String,
    /// The repo directory (for the `airlock policy trust --repo DIR` hint).
    pub repo_dir: PathBuf,
    /// The bytes read once: the digest and the parse are of the same content.
    pub bytes: Vec<u8>,
    pub digest: String,
    pub trust: TrustState,
    /// Why the file could not be read (a symlink, not a regular file, too large).
    pub unreadable: Option<String>,
    /// Parsed only when trusted (an untrusted file is parsed only by `policy show` and
    /// `policy trust`, through [`RepoFile::parse`]).
    pub parsed: Option<ParsedLayer>,
}

impl RepoFile {
    /// Parses the file regardless of trust (for `policy show` and `policy trust`).
    pub fn parse(&self) -> Result<ParsedLayer, ConfigError> {
        if let Some(reason) = &self.unreadable {
            return Err(ConfigError::Read {
                file: self.name.clone(),
                source: std::io::Error::other(reason.clone()),
            });
        }
        parse_layer(LayerKind::Repo, &self.name, &self.bytes)
    }
}

/// The configuration in force for one command.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub managed: Option<ParsedLayer>,
    pub user: Option<ParsedLayer>,
    pub repo: Option<RepoFile>,
    /// Every review-plane server (managed, user, identity), always blocked.
    pub review_servers: Vec<ReviewServer>,
}

impl Loaded {
    /// The layers that apply, in order: managed, user, trusted repo.
    pub fn applied(&self) -> Vec<&LayerDoc> {
        let repo = self.repo.as_ref().and_then(|r| r.parsed.as_ref());
        [self.managed.as_ref(), self.user.as_ref(), repo]
            .into_iter()
            .flatten()
            .map(|p| &p.doc)
            .collect()
    }

    /// Warnings of the applied files (duplicates, allow+block overlaps), in layer order.
    pub fn warnings(&self) -> Vec<&Diagnostic> {
        let repo = self.repo.as_ref().and_then(|r| r.parsed.as_ref());
        [self.managed.as_ref(), self.user.as_ref(), repo]
            .into_iter()
            .flatten()
            .flat_map(|p| p.warnings.iter())
            .collect()
    }

    /// What to send the daemon (the managed layer is the daemon's own to read).
    pub fn client_layers(&self) -> ClientLayers {
        ClientLayers {
            user: self.user.as_ref().map(|p| p.doc.clone()),
            repo: self.repo.as_ref().and_then(|r| r.parsed.as_ref()).map(|p| p.doc.clone()),
            review_servers: self
                .review_servers
                .iter()
                .filter(|r| r.layer != LayerKind::Managed)
                .cloned()
                .collect(),
        }
    }

    /// The evaluator for the applied layers.
    pub fn build_policy(&self) -> Result<BuiltPolicy, ConfigError> {
        build_policy(&self.applied(), &self.review_servers)
    }

    /// The evaluator for the applied layers with phase `phase` in force.
    pub fn build_policy_in_phase(&self, phase: Option<&str>) -> Result<BuiltPolicy, ConfigError> {
        build_policy_in_phase(&self.applied(), &self.review_servers, phase)
    }
}

/// Reads and validates the managed and user layers and the repo file (applied only if
/// trusted). `identity` contributes its `server` to the review-plane hosts.
pub fn load(
    paths: &Paths,
    repo: Option<&Repo>,
    identity: Option<&Identity>,
) -> Result<Loaded, ConfigError> {
    read_layers(paths, repo)?.parse(paths, identity)
}

/// The layer files' bytes, read once (so a digest and a parse are always of the same bytes),
/// each with the name the user sees; the repo file with its trust state.
#[derive(Debug, Clone)]
pub struct RawLayers {
    pub managed: Option<(String, Vec<u8>)>,
    pub user: Option<(String, Vec<u8>)>,
    /// Not yet parsed, even when trusted.
    pub repo: Option<RepoFile>,
}

/// Reads the layer files without parsing them (see [`RawLayers::parse`]).
pub fn read_layers(paths: &Paths, repo: Option<&Repo>) -> Result<RawLayers, ConfigError> {
    let read = |path: &Path| {
        let name = display_path(paths, path);
        match fsutil::read_config(path, true) {
            Ok(Some(bytes)) => Ok(Some((name, bytes))),
            Ok(None) => Ok(None),
            Err(source) => Err(ConfigError::Read { file: name, source }),
        }
    };
    let managed = read(paths.managed_policy())?;
    let user = read(&paths.user_config())?;
    let repo = match repo {
        Some(repo) => read_repo_file(paths, repo),
        None => None,
    };
    Ok(RawLayers { managed, user, repo })
}

impl RawLayers {
    /// Parses what was read: the managed and user layers, and the repo file when trusted.
    pub fn parse(self, paths: &Paths, identity: Option<&Identity>) -> Result<Loaded, ConfigError> {
        let parse = |kind: LayerKind, file: &Option<(String, Vec<u8>)>| {
            file.as_ref().map(|(name, bytes)| parse_layer(kind, name, bytes)).transpose()
        };
        let managed = parse(LayerKind::Managed, &self.managed)?;
        let user = parse(LayerKind::User, &self.user)?;
        let mut repo = self.repo;
        if let Some(file) = repo.as_mut().filter(|f| f.trust.is_trusted()) {
            file.parsed = Some(file.parse()?);
        }
        let mut review_servers = Vec::new();
        for p in [managed.as_ref(), user.as_ref()].into_iter().flatten() {
            review_servers.extend(review_servers_of(&p.doc));
        }
        if let Some(server) = identity_server(paths, identity)? {
            review_servers.push(server);
        }
        Ok(Loaded { managed, user, repo, review_servers })
    }
}

/// The identity's review-plane server, checked.
fn identity_server(
    paths: &Paths,
    identity: Option<&Identity>,
) -> Result<Option<ReviewServer>, ConfigError> {
    let Some(server) = identity.and_then(|i| i.server.as_ref()) else { return Ok(None) };
    review_host(server).map_err(|reason| ConfigError::ReviewServer {
        server: server.clone(),
        file: display_path(paths, &paths.identity_file()),
        reason,
    })?;
    Ok(Some(ReviewServer {
        server: server.clone(),
        layer: LayerKind::User,
        policy: display_path(paths, &paths.identity_file()),
    }))
}

/// Reads the identity file (`None` when not logged in); a file others may read is an error.
pub fn load_identity(paths: &Paths) -> Result<Option<Identity>, ConfigError> {
    Ok(identity::read(&paths.identity_file())?)
}

/// Reads the managed layer alone (what the daemon does for every session).
pub fn load_managed(paths: &Paths) -> Result<Option<LayerDoc>, ConfigError> {
    Ok(load_file(LayerKind::Managed, paths.managed_policy(), paths)?.map(|p| p.doc))
}

/// The standalone proxy's `--config FILE`: `.airlock.toml` format, layer `operator`, trusted
/// because the operator named it. `[review]` is refused as in a repo file.
pub fn load_operator(path: &Path) -> Result<ParsedLayer, ConfigError> {
    let name = path.display().to_string();
    let bytes =
        std::fs::read(path).map_err(|source| ConfigError::Read { file: name.clone(), source })?;
    parse_layer(LayerKind::Operator, &name, &bytes)
}

/// Reads the repo's `.airlock.toml` and its trust state; parses it only when trusted.
///
/// The file lives in a tree the agent can write, so it is read without following symlinks,
/// as a regular file of bounded size. A file that cannot be read that way is reported as
/// unusable (never trusted, never applied) rather than failing the command.
pub fn load_repo_file(paths: &Paths, repo: &Repo) -> Result<Option<RepoFile>, ConfigError> {
    let Some(mut file) = read_repo_file(paths, repo) else { return Ok(None) };
    if file.trust.is_trusted() {
        file.parsed = Some(file.parse()?);
    }
    Ok(Some(file))
}

/// [`load_repo_file`] without the parse.
fn read_repo_file(paths: &Paths, repo: &Repo) -> Option<RepoFile> {
    let path = repo.config_file();
    let name = display_path(paths, &path);
    let (bytes, unreadable) = match fsutil::read_config(&path, false) {
        Ok(Some(bytes)) => (bytes, None),
        Ok(None) => return None,
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    let digest = digest(&bytes);
    let trust = match &unreadable {
        None => trust::state(paths, repo, &digest),
        Some(reason) => TrustState::Unreadable { reason: reason.clone() },
    };
    Some(RepoFile {
        path,
        name,
        repo_dir: repo.path.clone(),
        bytes,
        digest,
        trust,
        unreadable,
        parsed: None,
    })
}

fn load_file(
    kind: LayerKind,
    path: &Path,
    paths: &Paths,
) -> Result<Option<ParsedLayer>, ConfigError> {
    let name = display_path(paths, path);
    match fsutil::read_config(path, true) {
        Ok(Some(bytes)) => parse_layer(kind, &name, &bytes).map(Some),
        Ok(None) => Ok(None),
        Err(source) => Err(ConfigError::Read { file: name, source }),
    }
}

/// The review servers a managed or user layer names (other layers may not name any).
pub fn review_servers_of(doc: &LayerDoc) -> Vec<ReviewServer> {
    if !matches!(doc.kind, LayerKind::Managed | LayerKind::User) {
        return Vec::new();
    }
    doc.review_servers
        .iter()
        .map(|s| ReviewServer { server: s.clone(), layer: doc.kind, policy: doc.name.clone() })
        .collect()
}

/// The host of a review server given as a URL (`https://review.corp:8443/x`) or a host.
pub fn review_host(server: &str) -> Result<Host, String> {
    policy::parse_target(server).map(|t| t.host).map_err(|e| e.to_string())
}

/// Builds the evaluator from applied layer documents (in managed, user, repo/operator order)
/// and the review-plane servers.
pub fn build_policy(
    layers: &[&LayerDoc],
    review: &[ReviewServer],
) -> Result<BuiltPolicy, ConfigError> {
    build_policy_in_phase(layers, review, None)
}

/// [`build_policy`] with phase `phase` in force (`policy::Policy::build_in_phase`); a phase no
/// layer defines, or one with an empty allowlist, is a [`ConfigError::Phase`].
pub fn build_policy_in_phase(
    layers: &[&LayerDoc],
    review: &[ReviewServer],
    phase: Option<&str>,
) -> Result<BuiltPolicy, ConfigError> {
    if let Some(name) = phase
        && !layers.iter().any(|l| l.phases.contains_key(name))
    {
        return Err(ConfigError::Phase(phase::unknown_phase_message(name, layers)));
    }
    let docs = layers;
    let layers = layers.iter().map(|d| d.to_policy_layer()).collect::<Result<Vec<_>, _>>()?;
    let mut hosts = Vec::new();
    for r in review {
        let host = review_host(&r.server).map_err(|reason| ConfigError::ReviewServer {
            server: r.server.clone(),
            file: r.policy.clone(),
            reason,
        })?;
        hosts.push(ReviewHost { host, layer: r.layer, policy: r.policy.clone() });
    }
    match Policy::build_in_phase(layers, hosts, phase) {
        Ok((policy, warnings)) => Ok(BuiltPolicy { policy, warnings }),
        Err(PolicyError::EmptyAllowlist { managed_allow }) => {
            Err(ConfigError::EmptyAllowlist { managed_allow })
        }
        Err(PolicyError::UnknownPhase { phase, .. }) => {
            Err(ConfigError::Phase(phase::unknown_phase_message(&phase, docs)))
        }
        Err(e @ PolicyError::PhaseEmptyAllowlist { .. }) => Err(ConfigError::Phase(e.to_string())),
    }
}

/// The variables `[env] pass` and `[mcp.*]` add to the sandbox's environment, from the applied
/// layers only (so an untrusted repo file contributes nothing). When two layers set the same
/// variable the earlier layer wins (managed, then user, then repo/operator), as with `mode`.
/// A passed or `from_env` variable that is unset (or not UTF-8) on the host is left out.
pub fn sandbox_env(layers: &[&LayerDoc], host: &dyn crate::env::Env) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    let mut push = |name: &str, value: Option<String>| {
        if let Some(value) = value.filter(|_| !out.iter().any(|(n, _)| n == name)) {
            out.push((name.to_owned(), value));
        }
    };
    for doc in layers {
        for name in &doc.env_pass {
            push(name, host.var(name));
        }
        for creds in doc.mcp.values() {
            for (name, cred) in creds {
                match cred {
                    Credential::Value(v) => push(name, Some(v.clone())),
                    Credential::FromEnv { from_env } => push(name, host.var(from_env)),
                }
            }
        }
    }
    out
}

/// The session's audit-volume bounds from the applied layers' `[audit]`: managed and user
/// only (other layers cannot parse with it, and a document claiming it is ignored). Per key, a
/// managed value pins it, else the user's, else the default.
pub fn audit_volume(layers: &[&LayerDoc]) -> crate::audit::volume::Volume {
    let mut out = crate::audit::volume::Volume::default();
    let said = |kind: LayerKind| layers.iter().filter(move |d| d.kind == kind).map(|d| d.audit);
    // User first, then managed over it.
    for doc in said(LayerKind::User).chain(said(LayerKind::Managed)) {
        out.burst = doc.burst.unwrap_or(out.burst);
        out.session_budget = doc.session_budget.unwrap_or(out.session_budget);
        out.min_free = doc.min_free.unwrap_or(out.min_free);
    }
    out
}

/// `[logs] keep` from the applied layers: managed and user only (a document of another kind
/// claiming it is ignored); a managed value pins it, else the user's; `None` keeps forever.
pub fn logs_keep(layers: &[&LayerDoc]) -> Option<std::time::Duration> {
    let said = |kind: LayerKind| {
        layers.iter().filter(move |d| d.kind == kind).find_map(|d| d.logs.keep_secs)
    };
    said(LayerKind::Managed).or_else(|| said(LayerKind::User)).map(std::time::Duration::from_secs)
}

/// `[publish]` of the applied layers: `Some(timeout)` when publishing at session end is on.
/// The managed layer's word wins over the user's (an organisation may require or forbid it);
/// the default timeout is 10 s.
pub fn publish_at_end(layers: &[&LayerDoc]) -> Option<std::time::Duration> {
    let said = |kind: LayerKind| layers.iter().filter(move |d| d.kind == kind);
    let auto = said(LayerKind::Managed)
        .find_map(|d| d.publish.auto)
        .or_else(|| said(LayerKind::User).find_map(|d| d.publish.auto))?;
    let timeout_ms = said(LayerKind::Managed)
        .find_map(|d| d.publish.timeout_ms)
        .or_else(|| said(LayerKind::User).find_map(|d| d.publish.timeout_ms))
        .unwrap_or(DEFAULT_PUBLISH_TIMEOUT_MS);
    auto.then(|| std::time::Duration::from_millis(timeout_ms))
}

/// `[publish] timeout` when the file is silent.
pub const DEFAULT_PUBLISH_TIMEOUT_MS: u64 = 10_000;

/// What the terminal filter lets through, from the applied layers' `[terminal]`: managed and
/// user only (other layers cannot parse with it, and a document claiming it is ignored). A
/// `deny` in either wins, like a block entry; otherwise `allow` if one says so; else `deny`.
pub fn terminal_policy(layers: &[&LayerDoc]) -> TerminalPolicy {
    let said: Vec<Clipboard> = layers
        .iter()
        .filter(|d| matches!(d.kind, LayerKind::Managed | LayerKind::User))
        .filter_map(|d| d.terminal.clipboard)
        .collect();
    let clipboard = if !said.contains(&Clipboard::Deny) && said.contains(&Clipboard::Allow) {
        Clipboard::Allow
    } else {
        Clipboard::Deny
    };
    TerminalPolicy { clipboard }
}

/// `[sandbox] mounts` of the applied layers, each with where it is written, and the union of
/// their `[sandbox] cache` names (the repo layer's only once it is trusted: it is applied then).
pub fn sandbox_mounts(
    layers: &[&LayerDoc],
) -> (Vec<(String, crate::sandbox::usermount::Origin)>, Vec<String>) {
    use crate::sandbox::usermount::Origin;
    let mut mounts = Vec::new();
    let mut caches: Vec<String> = Vec::new();
    for doc in layers {
        for m in &doc.sandbox.mounts {
            mounts.push((m.text.clone(), Origin::Config(m.at.clone())));
        }
        for c in &doc.sandbox.cache {
            if !caches.contains(c) {
                caches.push(c.clone());
            }
        }
    }
    (mounts, caches)
}

/// `[sandbox] backend`: the user layer's choice, else the managed layer's (a repo file may not
/// choose; the parser refuses it there).
pub fn sandbox_backend(layers: &[&LayerDoc]) -> Option<crate::container::Backend> {
    let of =
        |kind: LayerKind| layers.iter().filter(|d| d.kind == kind).find_map(|d| d.sandbox.backend);
    of(LayerKind::User).or_else(|| of(LayerKind::Managed))
}

/// A path as the user sees it: `~/…` under the home directory.
pub fn display_path(paths: &Paths, path: &Path) -> String {
    match path.strip_prefix(paths.home()) {
        Ok(rest) if paths.home() != Path::new("/") => format!("~/{}", rest.display()),
        _ => path.display().to_string(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::policy::{Mode, Reason, Verdict, parse_target};

    struct Fixture {
        _tmp: tempfile::TempDir,
        paths: Paths,
        repo: Repo,
        managed: PathBuf,
    }

    fn fixture() -> Fixture {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        std::fs::create_dir_all(home.join(".airlock")).unwrap();
        let managed = tmp.path().join("managed.toml");
        let env = crate::env::MapEnv::new()
            .with("HOME", &home)
            .with(crate::paths::TEST_MANAGED_POLICY_VAR, &managed);
        let paths = if cfg!(feature = "test-hooks") {
            Paths::from_env(&env).unwrap()
        } else {
            Paths::with_home(home)
        };
        std::fs::create_dir_all(tmp.path().join("app")).unwrap();
        let repo = Repo::resolve(Some(&tmp.path().join("app")), tmp.path()).unwrap();
        Fixture { _tmp: tmp, paths, repo, managed }
    }

    fn decide(built: &BuiltPolicy, target: &str) -> crate::policy::Decision {
        let t = parse_target(target).unwrap();
        built.policy.decide(&t.host, t.port.unwrap_or(443), &crate::policy::LocalAddrs::none())
    }

    #[test]
    fn the_repo_file_applies_only_while_trusted() {
        let f = fixture();
        std::fs::write(f.paths.user_config(), "[network]\nallow = [\"=user.test\"]\n").unwrap();
        let file = f.repo.config_file();
        std::fs::write(&file, "[network]\nallow = [\"repo.test\"]\n").unwrap();

        let loaded = load(&f.paths, Some(&f.repo), None).unwrap();
        let repo = loaded.repo.as_ref().unwrap();
        assert_eq!(repo.trust, TrustState::Untrusted);
        assert!(repo.parsed.is_none());
        assert_eq!(loaded.applied().len(), 1);
        assert!(loaded.client_layers().repo.is_none());
        let built = loaded.build_policy().unwrap();
        assert_eq!(decide(&built, "api.repo.test").reason, Reason::NotAllowed);

        trust::trust(&f.paths, &f.repo, &repo.digest).unwrap();
        let loaded = load(&f.paths, Some(&f.repo), None).unwrap();
        assert!(loaded.repo.as_ref().unwrap().trust.is_trusted());
        let kinds: Vec<LayerKind> = loaded.applied().iter().map(|d| d.kind).collect();
        assert_eq!(kinds, [LayerKind::User, LayerKind::Repo]);
        let d = decide(&loaded.build_policy().unwrap(), "api.repo.test");
        assert_eq!(d.verdict, Verdict::Allow);
        assert_eq!(d.layer, LayerKind::Repo);
        assert_eq!(d.policy.as_deref(), Some(file.display().to_string().as_str()));

        std::fs::write(&file, "[network]\nallow = [\"repo.test\", \"more.test\"]\n").unwrap();
        let loaded = load(&f.paths, Some(&f.repo), None).unwrap();
        assert!(matches!(loaded.repo.as_ref().unwrap().trust, TrustState::Changed { .. }));
        assert_eq!(loaded.applied().len(), 1);
    }

    #[test]
    fn an_untrusted_broken_file_is_not_an_error_but_a_trusted_one_is() {
        let f = fixture();
        std::fs::write(f.paths.user_config(), "[network]\nallow = [\"a.test\"]\n").unwrap();
        std::fs::write(f.repo.config_file(), "[network]\nalow = 1\n").unwrap();
        let loaded = load(&f.paths, Some(&f.repo), None).unwrap();
        let repo = loaded.repo.as_ref().unwrap();
        assert!(repo.parse().unwrap_err().to_string().contains(":2:1: unknown key `alow`"));
        trust::trust(&f.paths, &f.repo, &repo.digest).unwrap();
        let err = load(&f.paths, Some(&f.repo), None).unwrap_err();
        assert!(matches!(err, ConfigError::Invalid(_)), "{err}");
    }

    #[test]
    fn client_layers_round_trip_and_the_daemon_adds_managed() {
        let f = fixture();
        if cfg!(feature = "test-hooks") {
            std::fs::write(
                &f.managed,
                "[network]\nmode = \"allowlist\"\nallow = [\"corp.test\"]\n[review]\nservers = [\"https://review.corp.test\"]\n",
            )
            .unwrap();
        }
        std::fs::write(
            f.paths.user_config(),
            "[network]\nmode = \"blocklist\"\nallow = [\"git.corp.test\", \"other.test\"]\n[review]\nservers = [\"r2.corp.test\"]\n",
        )
        .unwrap();
        let identity = Identity {
            email: "a@b.test".into(),
            user_id: "u_1".into(),
            server: Some("https://r3.corp.test:8443".into()),
            role: None,
            log_key: None,
        };
        let loaded = load(&f.paths, Some(&f.repo), Some(&identity)).unwrap();
        let client = loaded.client_layers();
        // Managed review servers stay with the daemon, which reads the managed file itself.
        let servers: Vec<&str> = client.review_servers.iter().map(|r| r.server.as_str()).collect();
        assert_eq!(servers, ["r2.corp.test", "https://r3.corp.test:8443"]);
        // As the daemon receives it: through the protocol's wire types.
        let json = serde_json::to_string(&crate::protocol::PolicyLayers::from(&client)).unwrap();
        let received = ClientLayers::from_wire(&serde_json::from_str(&json).unwrap()).unwrap();
        assert_eq!(received, client);

        let managed = load_managed(&f.paths).unwrap();
        let built = received.build_policy(managed.as_ref()).unwrap();
        assert_eq!(decide(&built, "r3.corp.test").reason, Reason::ReviewPlane);
        assert_eq!(decide(&built, "r2.corp.test").reason, Reason::ReviewPlane);
        if cfg!(feature = "test-hooks") {
            assert_eq!(built.policy.mode(), Mode::Allowlist, "the managed mode pins");
            assert_eq!(decide(&built, "review.corp.test").reason, Reason::ReviewPlane);
            assert_eq!(decide(&built, "other.test").reason, Reason::ManagedNotAllowed);
            assert_eq!(decide(&built, "git.corp.test").verdict, Verdict::Allow);
        }
        // The same evaluator, whether built by the CLI or by the daemon.
        assert_eq!(built.policy.digest(), loaded.build_policy().unwrap().policy.digest());

        // A client cannot pose as the managed layer.
        let mut forged = received.clone();
        if let Some(user) = forged.user.as_mut() {
            user.kind = LayerKind::Managed;
        }
        assert!(matches!(forged.build_policy(None), Err(ConfigError::Policy(_))));
        // Nor smuggle an invalid entry past validation.
        let mut forged = received;
        if let Some(user) = forged.user.as_mut() {
            user.network.allow.push("a..b".into());
        }
        assert!(matches!(forged.build_policy(None), Err(ConfigError::Entry { .. })));
    }

    #[test]
    fn operator_files_are_trusted_but_may_not_name_review_servers() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("proxy.toml");
        std::fs::write(&path, "[network]\nallow = [\"a.test\"]\nallow_private = [\"127.0.0.2\"]\n")
            .unwrap();
        let parsed = load_operator(&path).unwrap();
        assert_eq!(parsed.doc.kind, LayerKind::Operator);
        let built = build_policy(&[&parsed.doc], &[]).unwrap();
        let d = decide(&built, "a.test");
        assert_eq!((d.verdict, d.layer), (Verdict::Allow, LayerKind::Operator));
        std::fs::write(&path, "[review]\nservers = [\"x.test\"]\n").unwrap();
        assert!(
            load_operator(&path).unwrap_err().to_string().contains(":1:2: [review] is not allowed")
        );
        let missing = load_operator(&tmp.path().join("nope.toml")).unwrap_err();
        assert!(matches!(missing, ConfigError::Read { .. }));
    }

    #[test]
    fn empty_allowlists_refuse_to_start() {
        let f = fixture();
        let err = load(&f.paths, Some(&f.repo), None).unwrap().build_policy().unwrap_err();
        assert!(err.to_string().starts_with("refusing to start: the allowlist is empty"), "{err}");
        std::fs::write(f.paths.user_config(), "[network]\nmode = \"blocklist\"\n").unwrap();
        assert!(load(&f.paths, Some(&f.repo), None).unwrap().build_policy().is_ok());
    }

    #[test]
    fn bad_identity_servers_are_config_errors() {
        let f = fixture();
        let identity = Identity {
            email: "a@b.test".into(),
            user_id: "u".into(),
            server: Some("a..b".into()),
            role: None,
            log_key: None,
        };
        let err = load(&f.paths, None, Some(&identity)).unwrap_err();
        assert!(err.to_string().contains("~/.airlock/identity.toml"), "{err}");
    }

    #[test]
    fn sandbox_env_takes_applied_layers_in_order() {
        let user = parse_layer(
            LayerKind::User,
            "u",
            b"[env]\npass = [\"A\", \"UNSET\"]\n[mcp.gh]\nTOKEN = { from_env = \"GH\" }\n",
        )
        .unwrap()
        .doc;
        let repo = parse_layer(
            LayerKind::Repo,
            "r",
            b"[env]\npass = [\"B\"]\n[mcp.gh]\nTOKEN = \"repo-literal\"\n[mcp.x]\nK = \"v\"\n",
        )
        .unwrap()
        .doc;
        let host = crate::env::MapEnv::new().with("A", "1").with("B", "2").with("GH", "secret");
        let env = sandbox_env(&[&user, &repo], &host);
        let expect = [("A", "1"), ("TOKEN", "secret"), ("B", "2"), ("K", "v")];
        let got: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(got, expect);
    }

    #[test]
    fn the_clipboard_is_allowed_only_by_managed_or_user_and_any_deny_wins() {
        let doc = |kind: LayerKind, text: &str| {
            let mut d = parse_layer(kind, "f", text.as_bytes()).unwrap().doc;
            d.kind = kind;
            d
        };
        let allow = "[terminal]\nclipboard = \"allow\"\n";
        let deny = "[terminal]\nclipboard = \"deny\"\n";
        let clipboard = |layers: &[&LayerDoc]| terminal_policy(layers).clipboard;
        let (user_allow, user_deny) = (doc(LayerKind::User, allow), doc(LayerKind::User, deny));
        let (managed_allow, managed_deny) =
            (doc(LayerKind::Managed, allow), doc(LayerKind::Managed, deny));
        let silent = doc(LayerKind::User, "");
        assert_eq!(clipboard(&[]), Clipboard::Deny);
        assert_eq!(clipboard(&[&silent]), Clipboard::Deny);
        assert_eq!(clipboard(&[&user_allow]), Clipboard::Allow);
        assert_eq!(clipboard(&[&managed_allow, &silent]), Clipboard::Allow);
        assert_eq!(clipboard(&[&managed_deny, &user_allow]), Clipboard::Deny);
        assert_eq!(clipboard(&[&managed_allow, &user_deny]), Clipboard::Deny);
        // A repo document cannot carry it past the parser; one that claims to is ignored.
        let mut forged = user_allow.clone();
        forged.kind = LayerKind::Repo;
        assert_eq!(clipboard(&[&forged]), Clipboard::Deny);
    }

    #[test]
    fn paths_under_home_are_shown_with_a_tilde() {
        let paths = Paths::with_home(PathBuf::from("/home/dev"));
        assert_eq!(display_path(&paths, Path::new("/home/dev/.airlock/x")), "~/.airlock/x");
        assert_eq!(
            display_path(&paths, Path::new("/etc/airlock/policy.toml")),
            "/etc/airlock/policy.toml"
        );
        let root = Paths::with_home(PathBuf::from("/"));
        assert_eq!(display_path(&root, Path::new("/etc/x")), "/etc/x");
    }
}
