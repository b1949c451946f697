//! The layers file: the policy parts of the managed, user and repo layers the daemon would use
//! for a session, written by the CLI for the container backend's proxy and read by
//! `airlockd proxy --layers FILE` (docs/backends.md). The proxy container cannot read the host's
//! managed layer or the user's files, and must evaluate exactly as the native daemon would, so
//! the CLI hands it the documents themselves.
//!
//! Only policy travels: `[network]` (and `[phase.*.network]`), `[review] servers`, `[gate]`,
//! the managed and user layers' `[audit]` volume bounds (which the proxy enforces), each
//! layer's kind, name and digest. `[env] pass` and `[mcp.*]` (credential sources) are
//! dropped by [`LayersFile::new`] and refused by [`LayersFile::parse`]: the file is bound into
//! a container, and the proxy has no use for either. The file is JSON, version 1, 0600, written
//! outside the repo and the agent home.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{BuiltPolicy, ClientLayers, ConfigError, LayerDoc, ReviewServer, wire as conv};
use crate::protocol as wire;

/// The format version this build writes and reads.
pub const VERSION: u32 = 1;

/// A layers file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayersFile {
    pub version: u32,
    pub managed: Option<wire::LayerDoc>,
    pub user: Option<wire::LayerDoc>,
    pub repo: Option<wire::LayerDoc>,
    /// Review-plane servers from files the proxy cannot read (the user layer's `[review]
    /// servers`, the identity's server); always blocked. The managed layer's come from
    /// `managed` itself, as in the daemon.
    #[serde(default)]
    pub review_servers: Vec<wire::ReviewServer>,
}

impl LayersFile {
    /// The file for `managed` (as the daemon would read it) over the client's documents, with
    /// everything but policy removed.
    pub fn new(managed: Option<&LayerDoc>, client: &wire::PolicyLayers) -> Self {
        Self {
            version: VERSION,
            managed: managed.map(|m| policy_only(conv::layer_to_wire(m), KeepAudit::Yes)),
            user: client.user.clone().map(|d| policy_only(d, KeepAudit::Yes)),
            // A repo file cannot set `[audit]` (a configuration error when it tries).
            repo: client.repo.clone().map(|d| policy_only(d, KeepAudit::No)),
            review_servers: client.review_servers.clone(),
        }
    }

    /// The JSON text (pretty, so an operator can read what the proxy was given).
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing plain data (strings, vectors, maps with string keys) cannot fail.
        let mut out = serde_json::to_vec_pretty(self).unwrap_or_default();
        out.push(b'\n');
        out
    }

    /// Writes the file atomically, 0600 from the moment it exists (never through a symlink).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        super::fsutil::write_private(path, &self.to_json())
    }

    /// Reads and checks a layers file; errors name the file and, for syntax, line and column.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let name = path.display().to_string();
        let bytes = std::fs::read(path)
            .map_err(|source| ConfigError::Read { file: name.clone(), source })?;
        Self::parse(&name, &bytes)
    }

    /// [`LayersFile::read`] over bytes already read; `name` is used in messages.
    pub fn parse(name: &str, bytes: &[u8]) -> Result<Self, ConfigError> {
        let file: Self = serde_json::from_slice(bytes).map_err(|e| {
            ConfigError::Policy(format!(
                "{name}:{}:{}: not a layers file: {e}; it is written by `airlock exec|run \
                 --backend docker|podman` (see docs/backends.md)",
                e.line(),
                e.column()
            ))
        })?;
        if file.version != VERSION {
            return Err(ConfigError::Policy(format!(
                "{name}: layers file version {} is not supported by this airlockd (it reads \
                 version {VERSION}); use the same Airlock version on both sides",
                file.version
            )));
        }
        let slots = [
            (&file.managed, wire::LayerKind::Managed, "managed"),
            (&file.user, wire::LayerKind::User, "user"),
            (&file.repo, wire::LayerKind::Repo, "repo"),
        ];
        for (doc, kind, slot) in slots {
            let Some(doc) = doc else { continue };
            if doc.kind != kind {
                return Err(ConfigError::Policy(format!(
                    "{name}: the {slot} layer ({}) claims kind {:?}",
                    doc.name, doc.kind
                )));
            }
            if !doc.env_pass.is_empty() || !doc.mcp.is_empty() {
                return Err(ConfigError::Policy(format!(
                    "{name}: the {slot} layer ({}) carries [env] or [mcp] entries; a layers file \
                     holds policy only, never credentials",
                    doc.name
                )));
            }
        }
        Ok(file)
    }

    /// The session's `[audit]` volume bounds, from the managed and user layers as the daemon
    /// computes them ([`super::audit_volume`]; a repo layer's is never read).
    pub fn audit_volume(&self) -> Result<crate::audit::volume::Volume, ConfigError> {
        let docs = [&self.managed, &self.user]
            .into_iter()
            .flatten()
            .map(conv::layer_from_wire)
            .collect::<Result<Vec<LayerDoc>, _>>()?;
        Ok(super::audit_volume(&docs.iter().collect::<Vec<_>>()))
    }

    /// The evaluator, built by the same code as the daemon's ([`super::build_client_policy`]),
    /// with phase `phase` in force.
    pub fn build_policy(&self, phase: Option<&str>) -> Result<BuiltPolicy, ConfigError> {
        let managed = self.managed.as_ref().map(conv::layer_from_wire).transpose()?;
        let client = ClientLayers::from_wire(&wire::PolicyLayers {
            user: self.user.clone(),
            repo: self.repo.clone(),
            review_servers: self.review_servers.clone(),
            sources: Vec::new(),
        })?;
        let review: Vec<ReviewServer> = client.review_servers.clone();
        super::build_client_policy_in_phase(
            managed.as_ref(),
            client.user.as_ref(),
            client.repo.as_ref(),
            &review,
            phase,
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeepAudit {
    Yes,
    No,
}

/// `doc` with only what the proxy evaluates and enforces: no `[env]`, `[mcp]`, `[terminal]` or
/// `[logs]` (the last two are the host's business: its relay and its log directory); `[audit]`
/// only where `keep` says so (the managed and user layers, as the daemon reads it).
fn policy_only(doc: wire::LayerDoc, keep: KeepAudit) -> wire::LayerDoc {
    let audit = if keep == KeepAudit::Yes { doc.audit } else { Default::default() };
    wire::LayerDoc {
        env_pass: Vec::new(),
        mcp: Default::default(),
        terminal: Default::default(),
        logs: Default::default(),
        audit,
        ..doc
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::policy::LayerKind;

    fn parsed(kind: LayerKind, name: &str, text: &str) -> LayerDoc {
        super::super::parse_layer(kind, name, text.as_bytes()).unwrap().doc
    }

    fn sample() -> LayersFile {
        let managed = parsed(
            LayerKind::Managed,
            "/etc/airlock/policy.toml",
            "[network]\nblock = [\"evil.test\"]\n[review]\nservers = [\"review.corp.test\"]\n",
        );
        let user = parsed(
            LayerKind::User,
            "~/.airlock/config.toml",
            "[network]\nallow = [\"user.test\"]\n[env]\npass = [\"GITHUB_TOKEN\"]\n\
             [mcp.github]\nGITHUB_PAT = \"ghp_SECRETVALUE\"\nOTHER = { from_env = \"GH_PAT\" }\n",
        );
        let repo = parsed(
            LayerKind::Repo,
            ".airlock.toml",
            "[network]\nallow = [\"repo.test\", \"evil.test\"]\n[gate]\nhosts = [\"deploy.test\"]\n\
             [phase.plan.network]\nallow = [\"plan.test\"]\n",
        );
        let client = ClientLayers { user: Some(user), repo: Some(repo), review_servers: vec![] };
        LayersFile::new(Some(&managed), &wire::PolicyLayers::from(&client))
    }

    #[test]
    fn the_audit_bounds_of_the_managed_and_user_layers_reach_the_proxy() {
        use crate::audit::volume::Volume;
        let managed =
            parsed(LayerKind::Managed, "/etc/airlock/policy.toml", "[audit]\nburst = 3\n");
        let user = parsed(
            LayerKind::User,
            "~/.airlock/config.toml",
            "[audit]\nburst = 9\nsession_budget = \"1MiB\"\n",
        );
        let client = ClientLayers { user: Some(user), repo: None, review_servers: vec![] };
        let file = LayersFile::new(Some(&managed), &wire::PolicyLayers::from(&client));
        let back = LayersFile::parse("layers.json", &file.to_json()).unwrap();
        // The managed layer's burst over the user's, the user's budget, the default min_free:
        // as the daemon computes a native session's.
        let want = Volume { burst: 3, session_budget: 1 << 20, ..Volume::default() };
        assert_eq!(back.audit_volume().unwrap(), want);
        assert_eq!(sample().audit_volume().unwrap(), Volume::default());
    }

    #[test]
    fn secrets_never_reach_the_file_and_policy_survives_the_round_trip() {
        let file = sample();
        let text = String::from_utf8(file.to_json()).unwrap();
        for secret in ["GITHUB_TOKEN", "GH_PAT", "GITHUB_PAT", "ghp_SECRETVALUE"] {
            assert!(!text.contains(secret), "{secret} leaked into the layers file:\n{text}");
        }
        let back = LayersFile::parse("layers.json", text.as_bytes()).unwrap();
        assert_eq!(back, file);
        let policy = back.build_policy(None).unwrap().policy;
        let decide = |policy: &crate::policy::Policy, host: &str| {
            let t = crate::policy::parse_target(host).unwrap();
            policy.decide(&t.host, 443, &crate::policy::LocalAddrs::none())
        };
        let repo = decide(&policy, "repo.test");
        assert!(repo.is_allowed());
        assert_eq!((repo.layer, repo.policy.as_deref()), (LayerKind::Repo, Some(".airlock.toml")));
        assert!(decide(&policy, "user.test").is_allowed());
        let evil = decide(&policy, "evil.test");
        assert!(!evil.is_allowed(), "the managed block wins over the repo's allow");
        assert_eq!(evil.layer, LayerKind::Managed);
        assert!(!decide(&policy, "review.corp.test").is_allowed(), "managed review server");
        assert!(!decide(&policy, "other.test").is_allowed());
        let plan = back.build_policy(Some("plan")).unwrap().policy;
        assert!(decide(&plan, "plan.test").is_allowed());
        assert!(!decide(&plan, "repo.test").is_allowed());
    }

    #[test]
    fn a_file_with_credentials_or_a_wrong_kind_or_version_is_refused_with_its_name() {
        let mut file = sample();
        file.user.as_mut().unwrap().env_pass = vec!["AWS_SECRET".into()];
        let e = LayersFile::parse("/x/layers.json", &file.to_json()).unwrap_err().to_string();
        assert!(e.contains("/x/layers.json") && e.contains("never credentials"), "{e}");

        let mut file = sample();
        file.repo.as_mut().unwrap().kind = wire::LayerKind::Managed;
        let e = LayersFile::parse("/x/layers.json", &file.to_json()).unwrap_err().to_string();
        assert!(e.contains("repo layer") && e.contains("Managed"), "{e}");

        let mut file = sample();
        file.version = 9;
        let e = LayersFile::parse("/x/layers.json", &file.to_json()).unwrap_err().to_string();
        assert!(e.contains("version 9"), "{e}");

        let e = LayersFile::parse("/x/layers.json", b"{\n  \"version\": 1,\n  \"extra\": 2\n}")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("/x/layers.json:3:"), "{e}");
    }

    #[test]
    fn the_file_is_private_from_the_moment_it_exists() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("run/layers.json");
        sample().write(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(LayersFile::read(&path).unwrap(), sample());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_are_an_error_never_a_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = LayersFile::parse("f", &bytes);
        }
    }
}
