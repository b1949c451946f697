//! Where the control socket is (DESIGN §3: `$AIRLOCK_SOCKET`, `$XDG_RUNTIME_DIR`, the `/tmp`
//! fallback) and the checks on its directory.

use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

use super::ClientError;
use crate::env::Env;

/// Where the socket path came from (DESIGN §3, in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SocketSource {
    /// `$AIRLOCK_SOCKET`
    Env,
    /// `$XDG_RUNTIME_DIR/airlock/airlock.sock`
    XdgRuntime,
    /// `/tmp/airlock-$UID/airlock.sock`
    TmpFallback,
}

impl SocketSource {
    pub fn describe(self) -> &'static str {
        match self {
            Self::Env => "$AIRLOCK_SOCKET",
            Self::XdgRuntime => "$XDG_RUNTIME_DIR/airlock/airlock.sock",
            Self::TmpFallback => "/tmp/airlock-$UID/airlock.sock (no XDG_RUNTIME_DIR)",
        }
    }
}

/// The control socket path and its origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketPath {
    pub path: PathBuf,
    pub source: SocketSource,
}

impl SocketPath {
    /// Resolves the path per DESIGN §3 (no filesystem access).
    pub fn resolve(env: &dyn Env) -> Self {
        if let Some(p) = env.var_os("AIRLOCK_SOCKET").filter(|p| !p.is_empty()) {
            return Self { path: PathBuf::from(p), source: SocketSource::Env };
        }
        if let Some(dir) = env.var("XDG_RUNTIME_DIR").map(PathBuf::from).filter(|p| p.is_absolute())
        {
            return Self {
                path: dir.join("airlock").join("airlock.sock"),
                source: SocketSource::XdgRuntime,
            };
        }
        let uid = nix::unistd::getuid().as_raw();
        Self {
            path: PathBuf::from(format!("/tmp/airlock-{uid}/airlock.sock")),
            source: SocketSource::TmpFallback,
        }
    }

    /// The directory holding the socket (and the activator's lock).
    pub fn dir(&self) -> &Path {
        self.path.parent().unwrap_or(Path::new("/"))
    }
}

/// Checks the socket directory with `lstat`: a real directory, owned by us, mode 0700.
pub fn check_dir(dir: &Path) -> Result<(), ClientError> {
    let meta = std::fs::symlink_metadata(dir)
        .map_err(|e| ClientError::UnsafeDir { dir: dir.into(), problem: e.to_string() })?;
    let problem = if meta.file_type().is_symlink() {
        Some("it is a symlink".to_owned())
    } else if !meta.is_dir() {
        Some("it is not a directory".to_owned())
    } else if meta.uid() != nix::unistd::geteuid().as_raw() {
        Some(format!("it is owned by uid {}, not you", meta.uid()))
    } else if meta.mode() & 0o077 != 0 {
        Some(format!("its mode is {:04o}", meta.mode() & 0o7777))
    } else {
        None
    };
    match problem {
        Some(problem) => Err(ClientError::UnsafeDir { dir: dir.into(), problem }),
        None => Ok(()),
    }
}

/// Creates the socket directory 0700 if missing, then checks it.
pub(super) fn ensure_dir(dir: &Path) -> Result<(), ClientError> {
    match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => check_dir(dir),
        Err(source) => Err(ClientError::CreateDir { dir: dir.into(), source }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::env::MapEnv;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn socket_path_order_follows_design() {
        let env = MapEnv::new()
            .with("AIRLOCK_SOCKET", "/s/a.sock")
            .with("XDG_RUNTIME_DIR", "/run/user/1");
        assert_eq!(
            SocketPath::resolve(&env),
            SocketPath { path: "/s/a.sock".into(), source: SocketSource::Env }
        );
        let env = MapEnv::new().with("XDG_RUNTIME_DIR", "/run/user/1");
        assert_eq!(
            SocketPath::resolve(&env),
            SocketPath {
                path: "/run/user/1/airlock/airlock.sock".into(),
                source: SocketSource::XdgRuntime
            }
        );
        let env = MapEnv::new().with("XDG_RUNTIME_DIR", "relative");
        let p = SocketPath::resolve(&env);
        assert_eq!(p.source, SocketSource::TmpFallback);
        let uid = nix::unistd::getuid().as_raw();
        assert_eq!(p.path, PathBuf::from(format!("/tmp/airlock-{uid}/airlock.sock")));
    }

    #[test]
    fn unsafe_directories_are_refused_with_the_fix() {
        let tmp = tempfile::tempdir().unwrap();
        let good = tmp.path().join("good");
        std::fs::DirBuilder::new().mode(0o700).create(&good).unwrap();
        check_dir(&good).unwrap();
        let open = tmp.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
        let msg = check_dir(&open).unwrap_err().to_string();
        assert!(msg.contains("0755") && msg.contains("chmod 0700"), "{msg}");
        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert!(check_dir(&link).unwrap_err().to_string().contains("symlink"));
    }
}
