//! The container backend (`airlock exec|run --backend docker|podman`, `[sandbox] backend`;
//! docs/backends.md): the same session as the native backend — policy, proxy, audit format,
//! identity, protected paths and the end-of-session sweep — with a container engine's walls in
//! place of the native namespaces.
//!
//! Per repo, one internal network `airlock-net-<key8>` ([`names`]); per session, one proxy
//! container running `airlockd proxy --layers FILE` on that network and the engine's default
//! network (its only way out), and one sandbox container whose only peer is that proxy. The
//! engine is driven through its CLI ([`engine`]); every command line is built by a pure
//! function ([`plan`]) so the hardening each flag carries is unit-tested, and the session's
//! steps are in [`session`].
//!
//! An `--internal` network is not sealed by itself (measured, docs/backends.md): the flags that
//! close each leak are in [`plan`], each with the leak it closes.

pub mod engine;
pub mod names;
pub mod plan;
pub mod session;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Which walls a session runs in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Airlock's own namespaces, Landlock and seccomp (DESIGN §7).
    #[default]
    Native,
    Docker,
    Podman,
}

impl Backend {
    pub const NAMES: &'static [&'static str] = &["native", "docker", "podman"];

    /// The engine, for a container backend.
    pub fn engine(self) -> Option<Engine> {
        match self {
            Backend::Native => None,
            Backend::Docker => Some(Engine::Docker),
            Backend::Podman => Some(Engine::Podman),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Native => "native",
            Backend::Docker => "docker",
            Backend::Podman => "podman",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A backend name that is not one of [`Backend::NAMES`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown backend {0:?}; use one of native, docker, podman")]
pub struct UnknownBackend(pub String);

impl FromStr for Backend {
    type Err = UnknownBackend;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "native" => Ok(Backend::Native),
            "docker" => Ok(Backend::Docker),
            "podman" => Ok(Backend::Podman),
            other => Err(UnknownBackend(other.to_owned())),
        }
    }
}

/// A container engine, driven through its CLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Engine {
    Docker,
    Podman,
}

impl Engine {
    /// The CLI's name, looked up on `PATH` (`AIRLOCK_DOCKER` / `AIRLOCK_PODMAN` override it).
    pub fn program(self) -> &'static str {
        match self {
            Engine::Docker => "docker",
            Engine::Podman => "podman",
        }
    }

    /// The variable that names another CLI binary for this engine.
    pub fn override_var(self) -> &'static str {
        match self {
            Engine::Docker => "AIRLOCK_DOCKER",
            Engine::Podman => "AIRLOCK_PODMAN",
        }
    }

    /// The engine's default network, where the proxy container finds its way out.
    pub fn uplink_network(self) -> &'static str {
        match self {
            Engine::Docker => "bridge",
            Engine::Podman => "podman",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.program())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn backend_names_round_trip_and_a_typo_names_the_choices() {
        for name in Backend::NAMES {
            assert_eq!(name.parse::<Backend>().unwrap().as_str(), *name);
        }
        let e = "dokcer".parse::<Backend>().unwrap_err().to_string();
        assert_eq!(e, "unknown backend \"dokcer\"; use one of native, docker, podman");
        assert_eq!(Backend::Native.engine(), None);
        assert_eq!(Backend::Podman.engine(), Some(Engine::Podman));
    }
}
