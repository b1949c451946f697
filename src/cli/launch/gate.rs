//! The configuration side of a launch (DESIGN §4): whether the repo's `.airlock.toml` may apply
//! ([`TrustGate::check`], [`TrustGate::trust`]) and what the applied layers contribute to the
//! session ([`Prepared`]). A trait so tests can inject the decision.

use crate::config::{self, ClientLayers, trust::TrustState};
use crate::env::Env;
use crate::paths::Paths;
use crate::repo::Repo;
use crate::sandbox::env::{Extra, IdentityEnv};
use crate::sandbox::termfilter::TerminalPolicy;

/// Whether the repo's `.airlock.toml` may apply (DESIGN §4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trust {
    /// No repo file, or its content hash is trusted.
    Trusted,
    /// Untrusted or changed; `diff` shows the effective difference.
    Untrusted { diff: String },
}

/// The trust decision and what trusted layers contribute to the sandbox.
pub trait TrustGate {
    fn check(&self, paths: &Paths, repo: &Repo) -> Result<Trust, String>;
    /// Records trust after the user said yes on a terminal.
    fn trust(&self, paths: &Paths, repo: &Repo) -> Result<(), String>;
    /// The configuration in force once trust is settled: `[env] pass` and `[mcp.*]` from the
    /// applied layers, the identity, and the layers the daemon needs (the policy must build).
    fn load(&self, paths: &Paths, repo: &Repo, host: &dyn Env) -> Result<Prepared, String>;
}

/// What the configuration contributes to one session.
#[derive(Debug, Clone, Default)]
pub struct Prepared {
    pub extra: Extra,
    pub identity: IdentityEnv,
    /// The identity's review-plane server, if any.
    pub server: Option<String>,
    /// The user layer and the trusted repo layer as documents, when they were parsed (empty
    /// when they came from the layer cache; the daemon gets `by_content`).
    pub layers: ClientLayers,
    /// The same layers by content (`config::cache`): what the daemon is sent, by digest under
    /// `layer_digests`, else parsed from these texts into documents. Empty: send `layers`.
    pub by_content: crate::protocol::PolicyLayers,
    /// What the relay lets reach the caller's terminal (managed and user `[terminal]`).
    pub terminal: TerminalPolicy,
}

/// The configuration layer (DESIGN §4): trust by content hash, `[env] pass`/`[mcp.*]` from the
/// applied layers, the identity file, and the policy that must build (an empty allowlist
/// refuses to start).
#[derive(Debug, Default)]
pub struct ConfigGate;

impl TrustGate for ConfigGate {
    fn check(&self, paths: &Paths, repo: &Repo) -> Result<Trust, String> {
        let Some(file) = config::load_repo_file(paths, repo).map_err(|e| e.to_string())? else {
            return Ok(Trust::Trusted);
        };
        if file.trust.is_trusted() {
            return Ok(Trust::Trusted);
        }
        if let TrustState::Unreadable { .. } = file.trust {
            return Err(file.trust.describe(&file.name, &file.repo_dir));
        }
        let mut diff = format!("{}\n", file.trust.describe(&file.name, &file.repo_dir));
        file.parse().map_err(|e| e.to_string())?;
        diff.push_str("It would add to your effective policy:\n");
        for line in String::from_utf8_lossy(&file.bytes).lines() {
            diff.push_str(&format!("  + {line}\n"));
        }
        Ok(Trust::Untrusted { diff })
    }
    fn trust(&self, paths: &Paths, repo: &Repo) -> Result<(), String> {
        let file = config::load_repo_file(paths, repo)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the repo file disappeared".to_string())?;
        file.parse().map_err(|e| e.to_string())?;
        config::trust::trust(paths, repo, &file.digest).map(|_| ()).map_err(|e| e.to_string())
    }
    fn load(&self, paths: &Paths, repo: &Repo, host: &dyn Env) -> Result<Prepared, String> {
        let identity = config::load_identity(paths).map_err(|e| e.to_string())?;
        // Parsed and built (the policy must build) only when the cache holds no entry for
        // exactly these files (config::cache).
        let session = config::cache::load_session(paths, repo, identity.as_ref())
            .map_err(|e| e.to_string())?;
        let applied: Vec<&config::LayerDoc> = session.slim.iter().collect();
        let extra = Extra { pass: Vec::new(), vars: config::sandbox_env(&applied, host) };
        let terminal = config::terminal_policy(&applied);
        let by_content = crate::protocol::PolicyLayers {
            user: None,
            repo: None,
            review_servers: crate::protocol::PolicyLayers::from(&ClientLayers {
                review_servers: session.review_servers.clone(),
                ..Default::default()
            })
            .review_servers,
            sources: session.sources.clone(),
        };
        let layers = session.loaded.as_ref().map(|l| l.client_layers()).unwrap_or_default();
        Ok(Prepared {
            extra,
            server: identity.as_ref().and_then(|i| i.server.clone()),
            identity: identity
                .map(|i| IdentityEnv { user_id: Some(i.user_id), email: Some(i.email) })
                .unwrap_or_default(),
            layers,
            by_content,
            terminal,
        })
    }
}
