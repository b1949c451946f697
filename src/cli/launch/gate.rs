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
    /// `[sandbox] mounts` of the applied layers, with where each is written.
    pub mounts: Vec<(String, crate::sandbox::usermount::Origin)>,
    /// `[sandbox] cache` of the applied layers.
    pub caches: Vec<String>,
    /// `[publish] auto` of the managed and user layers: the bound on publishing this repo's
    /// new lines after the session, `None` when it is off.
    pub publish_at_end: Option<std::time::Duration>,
    /// Some applied layer has `[gate]` entries: the session watches for its gates
    /// (`gatenotice`).
    pub gated: bool,
    /// Some applied layer has `[gate] commands`: the `[gate] timeout` in force, for the Claude
    /// Code hook the sandbox's `/etc` gets (`toolgates`).
    pub tool_gates: Option<std::time::Duration>,
    /// The managed layer's `[gate] self_approve`: reported to the review server when this
    /// session's gates are relayed there (the server decides whether to honour it).
    pub gate_self_approve: bool,
    /// The phases the applied layers define, each with the files defining it.
    pub phases: Vec<(String, Vec<String>)>,
    /// `--phase`: the phase the session starts in.
    pub phase: Option<String>,
    /// `[sandbox] backend` of the applied layers: the user layer's, else the managed layer's.
    pub backend: Option<crate::container::Backend>,
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
        let parsed = file.parse().map_err(|e| e.to_string())?;
        // A file whose policy tests fail is never offered for trust (no --force here).
        crate::cli::policy_test::before_trust(paths, repo, &parsed, false)?;
        {
            let doc = &parsed.doc;
            // Mounts expose host trees: called out before the file's lines.
            for m in &doc.sandbox.mounts {
                diff.push_str(&format!(
                    "It would mount {:?} into the sandbox ({})\n",
                    m.text, m.at
                ));
            }
            if !doc.sandbox.cache.is_empty() {
                diff.push_str(&format!(
                    "It would give the sandbox writable caches: {}\n",
                    doc.sandbox.cache.join(", ")
                ));
            }
        }
        diff.push_str(&config::review::for_repo_file(paths, repo, &file, &parsed).render());
        Ok(Trust::Untrusted { diff })
    }
    fn trust(&self, paths: &Paths, repo: &Repo) -> Result<(), String> {
        let file = config::load_repo_file(paths, repo)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the repo file disappeared".to_string())?;
        let parsed = file.parse().map_err(|e| e.to_string())?;
        // The file may have changed since `check`: the bytes trusted are the bytes tested.
        crate::cli::policy_test::before_trust(paths, repo, &parsed, false)?;
        config::trust::trust_content(paths, repo, &file.bytes)
            .map(|_| ())
            .map_err(|e| e.to_string())
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
        let (mounts, caches) = config::sandbox_mounts(&applied);
        let publish_at_end = config::publish_at_end(&applied);
        let gated = applied.iter().any(|d| {
            !d.gate.hosts.is_empty() || !d.gate.rules.is_empty() || !d.gate.commands.is_empty()
        });
        let tool_gates = applied
            .iter()
            .any(|d| !d.gate.commands.is_empty())
            .then(|| crate::gate::timeout_of(applied.iter().map(|d| (d.kind, d.gate.timeout_ms))));
        let phases = config::phase::defined_phases(&applied);
        let gate_self_approve = applied
            .iter()
            .filter(|d| d.kind == crate::policy::LayerKind::Managed)
            .find_map(|d| d.gate.self_approve)
            .unwrap_or(false);
        Ok(Prepared {
            extra,
            server: identity.as_ref().and_then(|i| i.server.clone()),
            identity: identity
                .map(|i| IdentityEnv { user_id: Some(i.user_id), email: Some(i.email) })
                .unwrap_or_default(),
            layers,
            by_content,
            terminal,
            mounts,
            caches,
            publish_at_end,
            gated,
            tool_gates,
            gate_self_approve,
            phases,
            phase: None,
            backend: config::sandbox_backend(&applied),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_trust_prompt_names_each_mount_and_cache_of_the_repo_file() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let home = root.join("home");
        std::fs::create_dir_all(home.join(".airlock")).unwrap();
        std::fs::create_dir_all(root.join("app/.git")).unwrap();
        std::fs::write(
            root.join("app/.airlock.toml"),
            "[sandbox]\nmounts = [\"/opt/tools\", \"~/.rustup:ro\"]\ncache = [\"cargo\"]\n",
        )
        .unwrap();
        let paths = Paths::with_home(home);
        let repo = Repo::resolve(Some(&root.join("app")), &root).unwrap();
        let Trust::Untrusted { diff } = ConfigGate.check(&paths, &repo).unwrap() else {
            panic!("a new repo file must be untrusted");
        };
        let file = root.join("app/.airlock.toml");
        assert!(
            diff.contains(&format!(
                "It would mount \"/opt/tools\" into the sandbox ({}:2:11)",
                file.display()
            )),
            "{diff}"
        );
        assert!(diff.contains("It would mount \"~/.rustup:ro\" into the sandbox"), "{diff}");
        assert!(diff.contains("It would give the sandbox writable caches: cargo"), "{diff}");
    }
}
