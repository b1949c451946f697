//! Configuration layers (managed, user, repo), their schema and validation with file:line:col
//! errors, repo trust by content hash, and the identity file.
//!
//! The flow (DESIGN §4): [`load`] reads the managed layer (`/etc/airlock/policy.toml`), the user
//! layer (`~/.airlock/config.toml`) and the repo's `.airlock.toml`; the repo file applies only
//! while [`trust`] says its bytes are trusted. Each file becomes a [`LayerDoc`] (the serializable
//! document the client sends the daemon inside [`ClientLayers`]); [`build_policy`] turns layer
//! documents plus the review-plane hosts into the evaluator, with the same code in the CLI
//! (`policy check`), the daemon and the standalone proxy ([`load_operator`]).

mod diag;
mod fsutil;
pub mod identity;
mod layer;
pub mod trust;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use diag::{Diagnostic, Diagnostics};
pub use identity::{Identity, IdentityError};
pub use layer::{Credential, LayerDoc, NetworkDoc, ParsedLayer, digest, parse_layer};
pub use trust::{TrustRecord, TrustState};

use crate::paths::Paths;
use crate::policy::{self, Host, LayerKind, Policy, PolicyError, PolicyWarning, ReviewHost};
use crate::repo::Repo;

/// Everything that can make configuration unusable. Each message says where and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// One or more problems in a file, each at `file:line:col`.
    #[error("{}", Diagnostics(.0.clone()))]
    Invalid(Vec<Diagnostic>),
    #[error("cannot read {file}: {source}; check that it exists and you may read it")]
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientLayers {
    pub user: Option<LayerDoc>,
    pub repo: Option<LayerDoc>,
    pub review_servers: Vec<ReviewServer>,
}

impl ClientLayers {
    /// Builds the evaluator from the managed layer (read by the caller) and these documents.
    /// Documents claiming the wrong kind are rejected: a client cannot pose as managed.
    pub fn build_policy(&self, managed: Option<&LayerDoc>) -> Result<BuiltPolicy, ConfigError> {
        let mut layers = Vec::new();
        for (doc, kind) in [(managed, LayerKind::Managed), (self.user.as_ref(), LayerKind::User)]
            .into_iter()
            .chain([(self.repo.as_ref(), LayerKind::Repo)])
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
        review
            .extend(self.review_servers.iter().filter(|r| r.layer != LayerKind::Managed).cloned());
        build_policy(&layers, &review)
    }
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
    /// Parsed only when trusted (an untrusted file is parsed only by `policy show` and
    /// `policy trust`, through [`RepoFile::parse`]).
    pub parsed: Option<ParsedLayer>,
}

impl RepoFile {
    /// Parses the file regardless of trust (for `policy show` and `policy trust`).
    pub fn parse(&self) -> Result<ParsedLayer, ConfigError> {
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
}

/// Reads and validates the managed and user layers and the repo file (applied only if
/// trusted). `identity` contributes its `server` to the review-plane hosts.
pub fn load(
    paths: &Paths,
    repo: Option<&Repo>,
    identity: Option<&Identity>,
) -> Result<Loaded, ConfigError> {
    let managed = load_file(LayerKind::Managed, paths.managed_policy(), paths)?;
    let user = load_file(LayerKind::User, &paths.user_config(), paths)?;
    let repo = match repo {
        Some(repo) => load_repo_file(paths, repo)?,
        None => None,
    };
    let mut review_servers = Vec::new();
    for p in [managed.as_ref(), user.as_ref()].into_iter().flatten() {
        review_servers.extend(review_servers_of(&p.doc));
    }
    if let Some(server) = identity.and_then(|i| i.server.as_ref()) {
        review_host(server).map_err(|reason| ConfigError::ReviewServer {
            server: server.clone(),
            file: display_path(paths, &paths.identity_file()),
            reason,
        })?;
        review_servers.push(ReviewServer {
            server: server.clone(),
            layer: LayerKind::User,
            policy: display_path(paths, &paths.identity_file()),
        });
    }
    Ok(Loaded { managed, user, repo, review_servers })
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
pub fn load_repo_file(paths: &Paths, repo: &Repo) -> Result<Option<RepoFile>, ConfigError> {
    let path = repo.config_file();
    let name = display_path(paths, &path);
    let Some(bytes) = fsutil::read_optional(&path)
        .map_err(|source| ConfigError::Read { file: name.clone(), source })?
    else {
        return Ok(None);
    };
    let digest = digest(&bytes);
    let trust = trust::state(paths, repo, &digest);
    let mut file =
        RepoFile { path, name, repo_dir: repo.path.clone(), bytes, digest, trust, parsed: None };
    if file.trust.is_trusted() {
        file.parsed = Some(file.parse()?);
    }
    Ok(Some(file))
}

fn load_file(
    kind: LayerKind,
    path: &Path,
    paths: &Paths,
) -> Result<Option<ParsedLayer>, ConfigError> {
    let name = display_path(paths, path);
    match fsutil::read_optional(path) {
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
    match Policy::build(layers, hosts) {
        Ok((policy, warnings)) => Ok(BuiltPolicy { policy, warnings }),
        Err(PolicyError::EmptyAllowlist { managed_allow }) => {
            Err(ConfigError::EmptyAllowlist { managed_allow })
        }
    }
}

/// A path as the user sees it: `~/…` under the home directory.
pub fn display_path(paths: &Paths, path: &Path) -> String {
    match path.strip_prefix(paths.home()) {
        Ok(rest) if paths.home() != Path::new("/") => format!("~/{}", rest.display()),
        _ => path.display().to_string(),
    }
}
