//! Conversions between this module's documents and the control protocol's wire types
//! ([`crate::protocol::PolicyLayers`]): the client converts [`ClientLayers`] before sending, the
//! daemon converts what it received back (and validates it) with [`ClientLayers::from_wire`].
//! The protocol owns its types; the mapping lives here so the protocol depends on nothing.

use super::{
    AuditDoc, ClientLayers, ConfigError, Credential, GateDoc, GateRuleDoc, LayerDoc, LogsDoc,
    NetworkDoc, ReviewServer, TerminalDoc,
};
use crate::gate::Severity;
use crate::policy::{LayerKind, Mode};
use crate::protocol as wire;
use crate::sandbox::termfilter::Clipboard;

impl From<&ClientLayers> for wire::PolicyLayers {
    fn from(layers: &ClientLayers) -> Self {
        Self {
            user: layers.user.as_ref().map(layer_to_wire),
            repo: layers.repo.as_ref().map(layer_to_wire),
            review_servers: layers
                .review_servers
                .iter()
                .map(|r| wire::ReviewServer {
                    server: r.server.clone(),
                    layer: kind_to_wire(r.layer),
                    policy: r.policy.clone(),
                })
                .collect(),
            sources: Vec::new(),
        }
    }
}

impl ClientLayers {
    /// The documents a client sent, checked: a value that does not parse (an address range)
    /// is an error naming the file, as a malformed file would be.
    pub fn from_wire(layers: &wire::PolicyLayers) -> Result<Self, ConfigError> {
        Ok(Self {
            user: layers.user.as_ref().map(layer_from_wire).transpose()?,
            repo: layers.repo.as_ref().map(layer_from_wire).transpose()?,
            review_servers: review_servers_from_wire(&layers.review_servers),
        })
    }
}

/// The same layers as documents, for a daemon without the `layer_digests` capability: every
/// source's text parsed as its layer (the form every daemon accepts).
pub fn documents_from_sources(
    layers: &wire::PolicyLayers,
) -> Result<wire::PolicyLayers, ConfigError> {
    let mut out = wire::PolicyLayers {
        review_servers: layers.review_servers.clone(),
        user: layers.user.clone(),
        repo: layers.repo.clone(),
        sources: Vec::new(),
    };
    for source in &layers.sources {
        let kind = kind_from_wire(source.kind);
        let text = source.text.as_deref().ok_or_else(|| {
            ConfigError::Policy(format!("layer source {} has no text to send", source.name))
        })?;
        let doc = layer_to_wire(&super::parse_layer(kind, &source.name, text.as_bytes())?.doc);
        match kind {
            LayerKind::User => out.user = Some(doc),
            LayerKind::Repo => out.repo = Some(doc),
            other => {
                return Err(ConfigError::Policy(format!(
                    "layer source {} claims kind {other}",
                    source.name
                )));
            }
        }
    }
    Ok(out)
}

/// The review-plane servers a client sent.
pub fn review_servers_from_wire(servers: &[wire::ReviewServer]) -> Vec<ReviewServer> {
    servers
        .iter()
        .map(|r| ReviewServer {
            server: r.server.clone(),
            layer: kind_from_wire(r.layer),
            policy: r.policy.clone(),
        })
        .collect()
}

fn kind_to_wire(kind: LayerKind) -> wire::LayerKind {
    match kind {
        LayerKind::Managed => wire::LayerKind::Managed,
        LayerKind::User => wire::LayerKind::User,
        LayerKind::Repo => wire::LayerKind::Repo,
        LayerKind::Operator => wire::LayerKind::Operator,
        LayerKind::None => wire::LayerKind::None,
    }
}

fn kind_from_wire(kind: wire::LayerKind) -> LayerKind {
    match kind {
        wire::LayerKind::Managed => LayerKind::Managed,
        wire::LayerKind::User => LayerKind::User,
        wire::LayerKind::Repo => LayerKind::Repo,
        wire::LayerKind::Operator => LayerKind::Operator,
        wire::LayerKind::None => LayerKind::None,
    }
}

fn credential_to_wire(c: &Credential) -> wire::Credential {
    match c {
        Credential::FromEnv { from_env } => {
            wire::Credential::FromEnv { from_env: from_env.clone() }
        }
        Credential::Value(v) => wire::Credential::Value(v.clone()),
    }
}

fn credential_from_wire(c: &wire::Credential) -> Credential {
    match c {
        wire::Credential::FromEnv { from_env } => {
            Credential::FromEnv { from_env: from_env.clone() }
        }
        wire::Credential::Value(v) => Credential::Value(v.clone()),
    }
}

pub(super) fn layer_to_wire(doc: &LayerDoc) -> wire::LayerDoc {
    wire::LayerDoc {
        kind: kind_to_wire(doc.kind),
        name: doc.name.clone(),
        digest: doc.digest.clone(),
        network: wire::NetworkDoc {
            mode: doc.network.mode.map(|m| match m {
                Mode::Allowlist => wire::NetworkMode::Allowlist,
                Mode::Blocklist => wire::NetworkMode::Blocklist,
            }),
            allow: doc.network.allow.clone(),
            block: doc.network.block.clone(),
            allow_private: doc.network.allow_private.iter().map(ToString::to_string).collect(),
        },
        env_pass: doc.env_pass.clone(),
        mcp: doc
            .mcp
            .iter()
            .map(|(server, vars)| {
                let vars = vars.iter().map(|(k, c)| (k.clone(), credential_to_wire(c))).collect();
                (server.clone(), vars)
            })
            .collect(),
        review_servers: doc.review_servers.clone(),
        terminal: wire::TerminalDoc {
            clipboard: doc.terminal.clipboard.map(|c| match c {
                Clipboard::Deny => wire::Clipboard::Deny,
                Clipboard::Allow => wire::Clipboard::Allow,
            }),
        },
        audit: wire::AuditDoc {
            burst: doc.audit.burst,
            session_budget: doc.audit.session_budget,
            min_free: doc.audit.min_free,
        },
        logs: wire::LogsDoc { keep_secs: doc.logs.keep_secs },
        gate: wire::GateDoc {
            hosts: doc.gate.hosts.clone(),
            rules: doc
                .gate
                .rules
                .iter()
                .map(|r| wire::GateRuleDoc {
                    host: r.host.clone(),
                    severity: r.severity.as_str().to_owned(),
                })
                .collect(),
            timeout_ms: doc.gate.timeout_ms,
            commands: doc.gate.commands.clone(),
        },
        phases: doc
            .phases
            .iter()
            .map(|(n, p)| {
                (n.clone(), wire::PhaseDoc { allow: p.allow.clone(), block: p.block.clone() })
            })
            .collect(),
    }
}

pub(super) fn layer_from_wire(doc: &wire::LayerDoc) -> Result<LayerDoc, ConfigError> {
    let allow_private = doc
        .network
        .allow_private
        .iter()
        .map(|net| {
            net.parse().map_err(|e: ipnet::AddrParseError| ConfigError::Entry {
                file: doc.name.clone(),
                entry: net.clone(),
                reason: format!("allow_private needs an address range like 127.0.0.2/32 ({e})"),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(LayerDoc {
        kind: kind_from_wire(doc.kind),
        name: doc.name.clone(),
        digest: doc.digest.clone(),
        network: NetworkDoc {
            mode: doc.network.mode.map(|m| match m {
                wire::NetworkMode::Allowlist => Mode::Allowlist,
                wire::NetworkMode::Blocklist => Mode::Blocklist,
            }),
            allow: doc.network.allow.clone(),
            block: doc.network.block.clone(),
            allow_private,
        },
        env_pass: doc.env_pass.clone(),
        mcp: doc
            .mcp
            .iter()
            .map(|(server, vars)| {
                let vars = vars.iter().map(|(k, c)| (k.clone(), credential_from_wire(c))).collect();
                (server.clone(), vars)
            })
            .collect(),
        review_servers: doc.review_servers.clone(),
        terminal: TerminalDoc {
            clipboard: doc.terminal.clipboard.map(|c| match c {
                wire::Clipboard::Deny => Clipboard::Deny,
                wire::Clipboard::Allow => Clipboard::Allow,
            }),
        },
        audit: AuditDoc {
            burst: doc.audit.burst,
            session_budget: doc.audit.session_budget,
            min_free: doc.audit.min_free,
        },
        // The daemon never mounts anything: `[sandbox]` stays with the CLI.
        sandbox: Default::default(),
        logs: LogsDoc { keep_secs: doc.logs.keep_secs },
        // `[publish]` runs in the CLI, with the token the daemon never holds.
        publish: Default::default(),
        gate: GateDoc {
            hosts: doc.gate.hosts.clone(),
            rules: doc
                .gate
                .rules
                .iter()
                .map(|r| {
                    let severity =
                        Severity::parse(&r.severity).ok_or_else(|| ConfigError::Entry {
                            file: doc.name.clone(),
                            entry: r.host.clone(),
                            reason: format!(
                                "gate severity {:?} is not one of low, medium, high",
                                r.severity
                            ),
                        })?;
                    Ok(GateRuleDoc { host: r.host.clone(), severity })
                })
                .collect::<Result<_, ConfigError>>()?,
            timeout_ms: doc.gate.timeout_ms,
            commands: doc.gate.commands.clone(),
            // Managed only: never on the wire (the daemon reads the managed file itself).
            self_approve: None,
        },
        // Names and entries are checked again by `LayerDoc::to_policy_layer`.
        phases: doc
            .phases
            .iter()
            .map(|(n, p)| {
                (n.clone(), super::PhaseDoc { allow: p.allow.clone(), block: p.block.clone() })
            })
            .collect(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::config::parse_layer;

    const USER: &str = "[network]\nmode = \"blocklist\"\nallow = [\"api.anthropic.com\"]\n\
        block = [\"pastebin.com\"]\nallow_private = [\"127.0.0.2/32\", \"::1/128\"]\n\
        [env]\npass = [\"RUST_LOG\"]\n[mcp.github]\nGITHUB_TOKEN = { from_env = \"GITHUB_TOKEN\" }\n\
        LIT = \"s3cret\"\n[review]\nservers = [\"review.corp.example\"]\n[terminal]\nclipboard = \"deny\"\n";

    fn layers() -> ClientLayers {
        let user = parse_layer(LayerKind::User, "~/.airlock/config.toml", USER.as_bytes()).unwrap();
        let repo = parse_layer(
            LayerKind::Repo,
            "/src/app/.airlock.toml",
            b"[network]\nallow = [\"=pypi.org\"]\n",
        )
        .unwrap();
        ClientLayers {
            user: Some(user.doc),
            repo: Some(repo.doc),
            review_servers: vec![ReviewServer {
                server: "review.corp.example".into(),
                layer: LayerKind::User,
                policy: "~/.airlock/config.toml".into(),
            }],
        }
    }

    #[test]
    fn layers_survive_the_wire_unchanged() {
        let layers = layers();
        let sent = wire::PolicyLayers::from(&layers);
        let json = serde_json::to_string(&sent).unwrap();
        let received: wire::PolicyLayers = serde_json::from_str(&json).unwrap();
        assert_eq!(ClientLayers::from_wire(&received).unwrap(), layers);
    }

    #[test]
    fn a_received_bad_address_range_names_the_file_and_the_entry() {
        let mut sent = wire::PolicyLayers::from(&layers());
        if let Some(user) = sent.user.as_mut() {
            user.network.allow_private.push("10.0.0.0/99".into());
        }
        let msg = ClientLayers::from_wire(&sent).unwrap_err().to_string();
        assert!(msg.contains("~/.airlock/config.toml") && msg.contains("10.0.0.0/99"), "{msg}");
    }

    #[test]
    fn a_version_1_session_start_builds_the_policy_it_asked_for() {
        // What a version-1 CLI sends, through the daemon's path: decode, convert, build.
        let v1 = r#"{"op":"session_start","repo":"app","repo_path":"/src/app","config":{"user":{"kind":"user","name":"~/.airlock/config.toml","digest":"00","network":{"mode":"allowlist","allow":["allowed.test"],"block":[],"allow_private":[]},"env_pass":[],"mcp":{},"review_servers":[],"terminal":{"clipboard":null}},"repo":null,"review_servers":[]},"identity":{},"airlock_version":"0.1.0","command":["sh"],"layers":[],"supervisor_pid":1}"#;
        let wire::Request::SessionStart(spec) = serde_json::from_str(v1).unwrap() else {
            panic!("not a session_start")
        };
        let built = ClientLayers::from_wire(&spec.config).unwrap().build_policy(None).unwrap();
        let decide = |host: &str| {
            let t = crate::policy::parse_target(host).unwrap();
            built.policy.decide(&t.host, 443, &crate::policy::LocalAddrs::none()).verdict
        };
        assert_eq!(decide("allowed.test"), crate::policy::Verdict::Allow);
        assert_eq!(decide("other.test"), crate::policy::Verdict::Deny);
    }

    #[test]
    fn sources_become_the_documents_an_older_daemon_expects() {
        let repo = "[network]\nallow = [\"=pypi.org\"]\n";
        let source = |kind, name: &str, text: &str| wire::LayerSource {
            kind,
            name: name.into(),
            digest: crate::config::digest(text.as_bytes()),
            text: Some(text.into()),
        };
        let by_content = wire::PolicyLayers {
            user: None,
            repo: None,
            review_servers: wire::PolicyLayers::from(&layers()).review_servers,
            sources: vec![
                source(wire::LayerKind::User, "~/.airlock/config.toml", USER),
                source(wire::LayerKind::Repo, "/src/app/.airlock.toml", repo),
            ],
        };
        let docs = documents_from_sources(&by_content).unwrap();
        assert!(docs.sources.is_empty());
        assert_eq!(docs, wire::PolicyLayers::from(&layers()));
        // A source whose text is gone cannot be turned into a document.
        let mut bare = by_content;
        bare.sources[0].text = None;
        assert!(documents_from_sources(&bare).is_err());
    }
}
