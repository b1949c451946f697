//! Where Airlock keeps its files on the host (DESIGN §3, §5): everything under `~/.airlock/`,
//! plus the managed layer at `/etc/airlock/policy.toml`.

use std::path::{Path, PathBuf};

use crate::env::Env;

/// The fleet-managed policy layer.
pub const MANAGED_POLICY: &str = "/etc/airlock/policy.toml";

/// Test-only override of [`MANAGED_POLICY`] (only with the `test-hooks` feature).
pub const TEST_MANAGED_POLICY_VAR: &str = "AIRLOCK_TEST_MANAGED_POLICY";

#[derive(Debug, thiserror::Error)]
pub enum PathsError {
    #[error("HOME is not set or not absolute; Airlock keeps its files under ~/.airlock")]
    NoHome,
}

/// The host-side file layout for one user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    home: PathBuf,
    managed_policy: PathBuf,
    /// Set when a test hook replaced a path; `policy show` reports it loudly.
    pub overrides: Vec<String>,
}

impl Paths {
    /// Reads `HOME` (and, with `test-hooks`, the managed-policy override) from `env`.
    pub fn from_env(env: &dyn Env) -> Result<Self, PathsError> {
        let home = env
            .var("HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .ok_or(PathsError::NoHome)?;
        #[allow(unused_mut)]
        let mut paths = Self::with_home(home);
        #[cfg(feature = "test-hooks")]
        if let Some(managed) = env.var(TEST_MANAGED_POLICY_VAR) {
            paths.overrides.push(format!(
                "managed policy path replaced by {TEST_MANAGED_POLICY_VAR}={managed}"
            ));
            paths.managed_policy = PathBuf::from(managed);
        }
        Ok(paths)
    }

    /// A layout rooted at `home` with the real managed path.
    pub fn with_home(home: PathBuf) -> Self {
        Self { home, managed_policy: PathBuf::from(MANAGED_POLICY), overrides: Vec::new() }
    }

    pub fn home(&self) -> &Path {
        &self.home
    }

    /// `~/.airlock`
    pub fn airlock_dir(&self) -> PathBuf {
        self.home.join(".airlock")
    }

    /// `~/.airlock/keys/` (0700): this machine's signing key (docs/evidence.md).
    pub fn keys_dir(&self) -> PathBuf {
        self.airlock_dir().join("keys")
    }

    /// `~/.airlock/identity.toml` (0600)
    pub fn identity_file(&self) -> PathBuf {
        self.airlock_dir().join("identity.toml")
    }

    /// `~/.airlock/config.toml`, the user layer.
    pub fn user_config(&self) -> PathBuf {
        self.airlock_dir().join("config.toml")
    }

    /// `/etc/airlock/policy.toml`, the managed layer.
    pub fn managed_policy(&self) -> &Path {
        &self.managed_policy
    }

    /// `~/.airlock/trust/`, one record per repo key.
    pub fn trust_dir(&self) -> PathBuf {
        self.airlock_dir().join("trust")
    }

    /// `~/.airlock/logs/`
    pub fn logs_root(&self) -> PathBuf {
        self.airlock_dir().join("logs")
    }

    /// `~/.airlock/logs/<name>/`, a log directory by name (the standalone proxy's default, or
    /// `airlock logs --repo-name`). A checkout's own directory is chosen by
    /// [`crate::audit::logdir`], which every session and `airlock logs` use.
    pub fn logs_dir(&self, repo_name: &str) -> PathBuf {
        self.logs_root().join(repo_name)
    }

    /// `~/.airlock/airlockd.log`: the one-shot activator sends the daemon's stderr here.
    pub fn daemon_log(&self) -> PathBuf {
        self.airlock_dir().join("airlockd.log")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::MapEnv;

    #[test]
    fn layout_is_under_home() {
        let paths = Paths::from_env(&MapEnv::new().with("HOME", "/h")).unwrap();
        assert_eq!(paths.identity_file(), PathBuf::from("/h/.airlock/identity.toml"));
        assert_eq!(paths.logs_dir("r"), PathBuf::from("/h/.airlock/logs/r"));
        assert_eq!(paths.managed_policy(), Path::new(MANAGED_POLICY));
    }

    #[test]
    fn relative_or_missing_home_is_an_error() {
        assert!(Paths::from_env(&MapEnv::new()).is_err());
        assert!(Paths::from_env(&MapEnv::new().with("HOME", "rel")).is_err());
    }
}
