//! A launch's chosen mounts, caches and working directory: `[sandbox] mounts`/`cache` from the
//! applied layers and `--mount`/`-w` from the command line, judged by
//! [`crate::sandbox::usermount`] and turned into variables by [`crate::sandbox::toolchain`].

use std::path::{Path, PathBuf};

use super::{Prepared, SessionOptions};
use crate::hostpath::HostPathRules;
use crate::paths::Paths;
use crate::repo::Repo;
use crate::sandbox::toolchain::{self, ToolEnv};
use crate::sandbox::usermount::{MountRules, Origin, UserMount};

/// What the chosen mounts and caches give the session.
#[derive(Debug, Clone, Default)]
pub struct Chosen {
    /// User mounts (parents first), then the caches.
    pub mounts: Vec<UserMount>,
    pub env: ToolEnv,
}

/// `~/.airlock/cache/<repo key>`.
pub fn cache_dir(paths: &Paths, repo: &Repo) -> PathBuf {
    paths.airlock_dir().join("cache").join(repo.key())
}

/// The mount rules of this user and repo.
pub fn rules(paths: &Paths, repo: &Repo, host: HostPathRules) -> MountRules {
    MountRules::new(
        host,
        paths.home(),
        &paths.airlock_dir(),
        &cache_dir(paths, repo),
        &repo.path,
        &repo.sandbox_path(),
    )
}

/// Judges configuration mounts (in layer order) then `--mount`s, makes the caches, and works
/// out the variables. Warnings (`:rw` from the command line) are printed here.
pub fn judge(
    paths: &Paths,
    repo: &Repo,
    host: HostPathRules,
    prepared: &Prepared,
    opts: &SessionOptions,
) -> Result<Chosen, String> {
    let rules = rules(paths, repo, host);
    let mut specs = prepared.mounts.clone();
    specs.extend(opts.mounts.iter().map(|m| (m.clone(), Origin::CommandLine)));
    let judged = rules.judge_all(&specs)?;
    for w in &judged.warnings {
        eprintln!("airlock: warning: {w}");
    }
    let caches = toolchain::prepare_caches(rules.cache_dir(), &prepared.caches)
        .map_err(|e| format!("[sandbox] cache: cannot make the cache directory: {e}"))?;
    let env = toolchain::tool_env(&judged.mounts, &caches);
    let mut mounts = judged.mounts;
    if let Some(m) = mounts.iter().find(|m| caches.iter().any(|(_, c)| c.dst == m.dst)) {
        return Err(format!(
            "--mount/[sandbox] mounts: {} is where a [sandbox] cache appears; choose another path",
            m.dst.display()
        ));
    }
    mounts.extend(caches.into_iter().map(|(_, m)| m));
    Ok(Chosen { mounts, env })
}

/// The working directory inside: `-w DIR` (relative to the current directory), else the current
/// directory when it lies in the repo, else the repo root.
pub fn workdir(repo: &Repo, cwd: &Path, arg: Option<&Path>) -> Result<PathBuf, String> {
    let inside = |canon: &Path| -> Option<PathBuf> {
        canon.strip_prefix(&repo.path).ok().map(|rel| repo.sandbox_path().join(rel))
    };
    match arg {
        Some(dir) => {
            let joined = if dir.is_absolute() { dir.to_path_buf() } else { cwd.join(dir) };
            let canon = std::fs::canonicalize(&joined).map_err(|e| {
                format!(
                    "--workdir {}: {e}; pass an existing directory inside the repo {}",
                    dir.display(),
                    repo.path.display()
                )
            })?;
            if !canon.is_dir() {
                return Err(format!(
                    "--workdir {}: not a directory; pass a directory inside the repo {}",
                    dir.display(),
                    repo.path.display()
                ));
            }
            inside(&canon).ok_or_else(|| {
                format!(
                    "--workdir {}: {} is outside the repo {}; the sandbox shows only the repo, \
                     so pass a directory inside it (or --repo the other project)",
                    dir.display(),
                    canon.display(),
                    repo.path.display()
                )
            })
        }
        None => Ok(std::fs::canonicalize(cwd)
            .ok()
            .and_then(|c| inside(&c))
            .unwrap_or_else(|| repo.sandbox_path())),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn the_workdir_follows_the_current_directory_inside_the_repo() {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        std::fs::create_dir_all(root.join("app/.git")).unwrap();
        std::fs::create_dir_all(root.join("app/sub/deep")).unwrap();
        std::fs::create_dir_all(root.join("elsewhere")).unwrap();
        let repo = Repo::resolve(Some(&root.join("app")), &root).unwrap();
        let sb = repo.sandbox_path();
        assert_eq!(workdir(&repo, &root.join("app/sub/deep"), None).unwrap(), sb.join("sub/deep"));
        assert_eq!(workdir(&repo, &root.join("elsewhere"), None).unwrap(), sb);
        assert_eq!(
            workdir(&repo, &root.join("app"), Some(Path::new("sub"))).unwrap(),
            sb.join("sub")
        );
        let e = workdir(&repo, &root.join("app"), Some(&root.join("elsewhere"))).unwrap_err();
        assert!(e.contains("is outside the repo"), "{e}");
        let e = workdir(&repo, &root.join("app"), Some(Path::new("nope"))).unwrap_err();
        assert!(e.contains("pass an existing directory inside the repo"), "{e}");
        // `..` out of the repo is resolved before judging.
        let e = workdir(&repo, &root.join("app/sub"), Some(Path::new("../.."))).unwrap_err();
        assert!(e.contains("outside the repo"), "{e}");
    }
}
