//! Which repo a command acts on: the directory, its name, hostname and repo key (DESIGN §3).

use std::path::{Path, PathBuf};

/// Names that collide with a sandbox mount; such repos are mounted at `/workspace/<name>`.
const RESERVED_NAMES: &[&str] = &[
    "usr", "etc", "proc", "dev", "tmp", "home", "bin", "sbin", "run", "sys", "var", "opt", "root",
    "srv", "mnt",
];

#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("--repo {path}: {source}; pass an existing directory")]
    NotADirectory {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--repo {path}: not a directory; --repo takes the repo's directory, not a file")]
    IsAFile { path: PathBuf },
    #[error(
        "repo name {name:?} (from {path}) is not usable: after lowercasing and replacing characters \
         outside a-z 0-9 _ . - it is empty, \".\" or \"..\"; rename the directory or pass --repo"
    )]
    InvalidName { name: String, path: PathBuf },
    #[error(
        "--repo-name {0:?} is not a valid repo name: use lowercase a-z 0-9 _ . - (not empty, \".\" or \"..\")"
    )]
    InvalidRepoName(String),
    #[error("cannot read the working directory: {0}")]
    Cwd(#[source] std::io::Error),
}

/// A resolved repo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repo {
    /// Canonical host path of the repo directory.
    pub path: PathBuf,
    /// The sanitized name (audit `repo` field, log directory).
    pub name: String,
}

impl Repo {
    /// Resolves `--repo DIR`, or, without it, the git top level of `cwd` (else `cwd` itself).
    pub fn resolve(repo_arg: Option<&Path>, cwd: &Path) -> Result<Self, RepoError> {
        let dir = match repo_arg {
            Some(dir) => {
                let dir = if dir.is_absolute() { dir.to_path_buf() } else { cwd.join(dir) };
                let meta = std::fs::metadata(&dir)
                    .map_err(|source| RepoError::NotADirectory { path: dir.clone(), source })?;
                if !meta.is_dir() {
                    return Err(RepoError::IsAFile { path: dir });
                }
                dir
            }
            None => git_toplevel(cwd).unwrap_or_else(|| cwd.to_path_buf()),
        };
        let path = std::fs::canonicalize(&dir)
            .map_err(|source| RepoError::NotADirectory { path: dir.clone(), source })?;
        let base = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let name = sanitize_name(&base);
        if !is_valid_name(&name) {
            return Err(RepoError::InvalidName { name, path });
        }
        Ok(Self { path, name })
    }

    /// The sandbox hostname: the name cut to 63 bytes (names are ASCII, so bytes = chars).
    pub fn hostname(&self) -> &str {
        &self.name[..self.name.len().min(63)]
    }

    /// Where the repo appears inside the sandbox.
    pub fn sandbox_path(&self) -> PathBuf {
        sandbox_path_for(&self.name)
    }

    /// Name + 8 hex of a SHA-256 of the canonical path: keys per-repo state that must not
    /// collide between two checkouts with the same basename (agent homes, trust records).
    pub fn key(&self) -> String {
        crate::audit::logdir::repo_key(&self.name, &self.path)
    }

    /// The repo's policy file.
    pub fn config_file(&self) -> PathBuf {
        self.path.join(".airlock.toml")
    }
}

/// Lowercases and replaces every character outside `a-z 0-9 _ . -` with `-`.
pub fn sanitize_name(raw: &str) -> String {
    raw.chars()
        .flat_map(char::to_lowercase)
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '.' | '-') {
                c
            } else {
                '-'
            }
        })
        .collect()
}

/// A usable name: already sanitized, not empty, `.` or `..`.
pub fn is_valid_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && sanitize_name(name) == name
}

/// Validates `--repo-name NAME`.
pub fn validate_repo_name(name: &str) -> Result<&str, RepoError> {
    if is_valid_name(name) { Ok(name) } else { Err(RepoError::InvalidRepoName(name.to_owned())) }
}

/// `/<name>`, or `/workspace/<name>` when the name collides with a sandbox mount.
pub fn sandbox_path_for(name: &str) -> PathBuf {
    let reserved = RESERVED_NAMES.contains(&name) || name.starts_with("lib");
    if reserved { PathBuf::from("/workspace").join(name) } else { PathBuf::from("/").join(name) }
}

/// The enclosing git work tree's top level, found by walking up for `.git` (a directory, or a
/// file with a `gitdir:` pointer for worktrees and submodules). No `git` process is spawned.
fn git_toplevel(start: &Path) -> Option<PathBuf> {
    start.ancestors().find(|dir| dir.join(".git").exists()).map(Path::to_path_buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_sanitized_per_design() {
        assert_eq!(sanitize_name("My Repo!"), "my-repo-");
        assert_eq!(sanitize_name("some_repo.v2-x"), "some_repo.v2-x");
        assert_eq!(sanitize_name("Ünïcode"), "-n-code");
        assert!(!is_valid_name(""));
        assert!(!is_valid_name("."));
        assert!(!is_valid_name(".."));
        assert!(is_valid_name("..."));
        assert!(!is_valid_name("Upper"));
    }

    #[test]
    fn reserved_names_move_under_workspace() {
        assert_eq!(sandbox_path_for("etc"), PathBuf::from("/workspace/etc"));
        assert_eq!(sandbox_path_for("lib64"), PathBuf::from("/workspace/lib64"));
        assert_eq!(sandbox_path_for("library"), PathBuf::from("/workspace/library"));
        assert_eq!(sandbox_path_for("payments"), PathBuf::from("/payments"));
    }

    #[test]
    fn resolve_uses_git_toplevel_and_keys_by_path() {
        let tmp = tempfile::tempdir().unwrap();
        let top = tmp.path().join("Pay Ments");
        std::fs::create_dir_all(top.join(".git")).unwrap();
        std::fs::create_dir_all(top.join("src/deep")).unwrap();
        let repo = Repo::resolve(None, &top.join("src/deep")).unwrap();
        assert_eq!(repo.name, "pay-ments");
        assert_eq!(repo.path, std::fs::canonicalize(&top).unwrap());
        let key = repo.key();
        assert!(key.starts_with("pay-ments-") && key.len() == "pay-ments-".len() + 8);

        let other = tmp.path().join("x/Pay Ments");
        std::fs::create_dir_all(&other).unwrap();
        let other = Repo::resolve(Some(&other), tmp.path()).unwrap();
        assert_eq!(other.name, repo.name);
        assert_ne!(other.key(), repo.key());
    }

    #[test]
    fn repo_arg_must_be_a_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, "").unwrap();
        assert!(matches!(Repo::resolve(Some(&file), tmp.path()), Err(RepoError::IsAFile { .. })));
        assert!(matches!(
            Repo::resolve(Some(&tmp.path().join("missing")), tmp.path()),
            Err(RepoError::NotADirectory { .. })
        ));
    }

    #[test]
    fn hostname_is_cut_to_63_bytes() {
        let repo = Repo { path: PathBuf::from("/x"), name: "a".repeat(80) };
        assert_eq!(repo.hostname().len(), 63);
    }
}
