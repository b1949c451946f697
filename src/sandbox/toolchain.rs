//! What mounted toolchains and per-repo caches mean inside: `PATH` entries and variables
//! (`RUSTUP_HOME`, `CARGO_HOME`, `PYENV_ROOT`, `NVM_DIR`, `npm_config_cache`, `PIP_CACHE_DIR`,
//! …), the cache directories under `~/.airlock/cache/<repo key>/`, and the `mounts` line
//! `airlock doctor` suggests for a toolchain it finds on the host `PATH`.
//!
//! A cache is agent-written: the host side never runs, sources or reads configuration from it
//! (only the sandbox's tools, pointed there by these variables, use it); see
//! `docs/security.md` "Caches".

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::usermount::{CACHE_ROOT, UserMount};

/// The caches `[sandbox] cache` knows, and the variables each sets (`""`: the cache directory
/// itself, else a subdirectory of it).
pub const CACHES: &[(&str, &[(&str, &str)])] = &[
    ("cargo", &[("CARGO_HOME", "")]),
    ("npm", &[("npm_config_cache", "")]),
    ("pip", &[("PIP_CACHE_DIR", "")]),
    ("go", &[("GOMODCACHE", "mod"), ("GOCACHE", "build")]),
];

/// The cache names, for "did you mean" suggestions.
pub fn cache_names() -> Vec<&'static str> {
    CACHES.iter().map(|(n, _)| *n).collect()
}

/// `CARGO_HOME` when `~/.cargo/bin` is mounted without a cargo cache: in the (writable) home
/// inside, a tmpfs for `exec`.
pub const CARGO_HOME_FALLBACK: &str = "/home/agent/.cargo";

/// Variables and `PATH` entries the mounts and caches add inside.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolEnv {
    /// Prepended to `PATH`, in this order.
    pub path: Vec<PathBuf>,
    pub vars: Vec<(String, OsString)>,
}

impl ToolEnv {
    fn set(&mut self, name: &str, value: impl Into<OsString>) {
        self.vars.retain(|(n, _)| n != name);
        self.vars.push((name.to_owned(), value.into()));
    }

    fn path(&mut self, dir: PathBuf) {
        if !self.path.contains(&dir) {
            self.path.push(dir);
        }
    }

    /// Applies this to a built environment: `PATH` entries first, then the variables.
    pub fn apply(&self, env: &mut Vec<(OsString, OsString)>) {
        let old = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.clone()).unwrap_or_default();
        let mut dirs: Vec<PathBuf> = self.path.clone();
        dirs.extend(std::env::split_paths(&old));
        if let Ok(joined) = std::env::join_paths(dirs) {
            env.retain(|(k, _)| k != "PATH");
            env.push(("PATH".into(), joined));
        }
        for (k, v) in &self.vars {
            env.retain(|(name, _)| name != k.as_str());
            env.push((k.into(), v.clone()));
        }
        env.sort();
    }
}

/// The node version `~/.nvm/alias/default` names, as installed under `versions/node/`: an
/// exact `vX.Y.Z`, or the highest installed version with that prefix (`20` → `v20.11.1`).
fn nvm_default(nvm: &Path) -> Option<String> {
    let alias = std::fs::read_to_string(nvm.join("alias/default")).ok()?;
    let alias = alias.trim().trim_start_matches('v');
    let mut installed: Vec<(Vec<u64>, String)> = std::fs::read_dir(nvm.join("versions/node"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_owned();
            let nums = name
                .trim_start_matches('v')
                .split('.')
                .map(str::parse)
                .collect::<Result<Vec<u64>, _>>()
                .ok()?;
            Some((nums, name))
        })
        .filter(|(_, name)| {
            let bare = name.trim_start_matches('v');
            bare == alias || bare.starts_with(&format!("{alias}."))
        })
        .collect();
    installed.sort();
    installed.pop().map(|(_, name)| name)
}

/// What the mounts and caches set inside. `caches` are the `[sandbox] cache` entries with their mounts.
pub fn tool_env(mounts: &[UserMount], caches: &[(String, UserMount)]) -> ToolEnv {
    let mut out = ToolEnv::default();
    let mut cargo_bin = false;
    for m in mounts {
        // Known by their place in a home (any home: root's toolchain may be mounted for a
        // test user too): `<home>/.rustup`, `<home>/.cargo/bin`, `<home>/.pyenv`, `<home>/.nvm`.
        let name = m.src.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let parent = m.src.parent().and_then(Path::file_name).and_then(|n| n.to_str());
        let known = match (parent, name) {
            (Some(".cargo"), "bin") => Some(".cargo/bin"),
            (_, ".rustup" | ".pyenv" | ".nvm") => Some(name),
            _ => None,
        };
        match known {
            Some(".rustup") => out.set("RUSTUP_HOME", m.dst.clone()),
            Some(".cargo/bin") => {
                cargo_bin = true;
                out.path(m.dst.clone());
            }
            Some(".pyenv") => {
                out.set("PYENV_ROOT", m.dst.clone());
                out.path(m.dst.join("shims"));
                out.path(m.dst.join("bin"));
            }
            Some(".nvm") => {
                out.set("NVM_DIR", m.dst.clone());
                if let Some(v) = nvm_default(&m.src) {
                    out.path(m.dst.join("versions/node").join(v).join("bin"));
                }
            }
            _ if m.src.file_name().is_some_and(|n| n == "bin") => out.path(m.dst.clone()),
            _ if m.src.join("bin").is_dir() => out.path(m.dst.join("bin")),
            _ => {}
        }
    }
    if cargo_bin {
        out.set("CARGO_HOME", CARGO_HOME_FALLBACK);
    }
    for (name, m) in caches {
        let Some((_, vars)) = CACHES.iter().find(|(n, _)| n == name) else { continue };
        for (var, sub) in *vars {
            let dir = if sub.is_empty() { m.dst.clone() } else { m.dst.join(sub) };
            out.set(var, dir);
        }
    }
    out
}

/// Makes (0700, never through a symlink) `cache_dir/<name>` for each cache and returns their
/// mounts at `/opt/airlock/cache/<name>`, read-write.
pub fn prepare_caches(cache_dir: &Path, names: &[String]) -> io::Result<Vec<(String, UserMount)>> {
    let mut out = Vec::new();
    if names.is_empty() {
        return Ok(out);
    }
    for dir in [cache_dir.parent().unwrap_or(cache_dir), cache_dir] {
        make_private_dir(dir)?;
    }
    for name in names {
        let dir = cache_dir.join(name);
        make_private_dir(&dir)?;
        let src = std::fs::canonicalize(&dir)?;
        out.push((
            name.clone(),
            UserMount { src, dst: Path::new(CACHE_ROOT).join(name), rw: true },
        ));
    }
    Ok(out)
}

fn make_private_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!(
            "{} is not a directory (a symlink or file is in the way); remove it",
            dir.display()
        )));
    }
    Ok(())
}

/// A toolchain found on the host `PATH` under the home, and the `mounts` entries that make it
/// work inside.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The `PATH` entry as found.
    pub dir: PathBuf,
    pub what: &'static str,
    /// `[sandbox] mounts` entries, `~`-relative.
    pub mounts: Vec<String>,
    /// A `[sandbox] cache` entry that makes builds faster, if any.
    pub cache: Option<&'static str>,
}

/// Toolchains on `path_var` under `home` (canonical) and how to mount each.
pub fn detect(path_var: &std::ffi::OsStr, home: &Path) -> Vec<Found> {
    let mut out: Vec<Found> = Vec::new();
    for dir in std::env::split_paths(path_var) {
        let Ok(canon) = std::fs::canonicalize(&dir) else { continue };
        let Ok(rel) = canon.strip_prefix(home) else { continue };
        let Some(rel) = rel.to_str() else { continue };
        if rel.is_empty() {
            continue;
        }
        let tilde = |r: &str| format!("~/{r}");
        let found = if rel == ".cargo/bin" {
            Found {
                dir: dir.clone(),
                what: "cargo/rustup",
                mounts: if home.join(".rustup").is_dir() {
                    vec![tilde(".cargo/bin:ro"), tilde(".rustup:ro")]
                } else {
                    vec![tilde(".cargo/bin:ro")]
                },
                cache: Some("cargo"),
            }
        } else if rel == ".pyenv/shims" || rel == ".pyenv/bin" {
            // Shims and installed scripts name the host path, so the tree is mounted there.
            let root = home.join(".pyenv");
            Found {
                dir: dir.clone(),
                what: "pyenv",
                mounts: vec![format!("~/.pyenv:{}:ro", root.display())],
                cache: Some("pip"),
            }
        } else if let Some(version) =
            rel.strip_prefix(".nvm/versions/node/").and_then(|r| r.strip_suffix("/bin"))
        {
            Found {
                dir: dir.clone(),
                what: "nvm node",
                mounts: vec![tilde(&format!(".nvm/versions/node/{version}:ro"))],
                cache: Some("npm"),
            }
        } else {
            Found {
                dir: dir.clone(),
                what: "tools",
                mounts: vec![tilde(&format!("{rel}:ro"))],
                cache: None,
            }
        };
        if !out.iter().any(|f| f.mounts == found.mounts) {
            out.push(found);
        }
    }
    out
}

/// The exact configuration line for `mounts`.
pub fn mounts_line(mounts: &[String]) -> String {
    let quoted: Vec<String> = mounts.iter().map(|m| format!("{m:?}")).collect();
    format!("mounts = [{}]", quoted.join(", "))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn m(src: &Path, dst: &str) -> UserMount {
        UserMount { src: src.to_path_buf(), dst: PathBuf::from(dst), rw: false }
    }

    #[test]
    fn rustup_becomes_rustup_home_cargo_bin_only_joins_path() {
        let home = Path::new("/h/me");
        let env = tool_env(
            &[
                m(&home.join(".cargo/bin"), "/opt/airlock/mounts/h/me/.cargo/bin"),
                m(&home.join(".rustup"), "/opt/airlock/mounts/h/me/.rustup"),
            ],
            &[],
        );
        assert_eq!(env.path, vec![PathBuf::from("/opt/airlock/mounts/h/me/.cargo/bin")]);
        let var = |k: &str| env.vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(var("RUSTUP_HOME"), Some("/opt/airlock/mounts/h/me/.rustup".into()));
        assert_eq!(var("CARGO_HOME"), Some(CARGO_HOME_FALLBACK.into()));
    }

    #[test]
    fn caches_set_their_variables_and_cargo_cache_wins_over_the_fallback() {
        let home = Path::new("/h/me");
        let caches: Vec<(String, UserMount)> = ["cargo", "npm", "pip", "go"]
            .iter()
            .map(|n| {
                (
                    n.to_string(),
                    UserMount { src: home.join(n), dst: Path::new(CACHE_ROOT).join(n), rw: true },
                )
            })
            .collect();
        let env = tool_env(&[m(&home.join(".cargo/bin"), "/x/bin")], &caches);
        let var = |k: &str| env.vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(var("CARGO_HOME"), Some("/opt/airlock/cache/cargo".into()));
        assert_eq!(var("npm_config_cache"), Some("/opt/airlock/cache/npm".into()));
        assert_eq!(var("PIP_CACHE_DIR"), Some("/opt/airlock/cache/pip".into()));
        assert_eq!(var("GOMODCACHE"), Some("/opt/airlock/cache/go/mod".into()));
    }

    #[test]
    fn bin_dirs_and_trees_with_bin_join_path_pyenv_and_nvm_get_their_roots() {
        let tmp = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(tmp.path()).unwrap();
        std::fs::create_dir_all(home.join("opt/node/bin")).unwrap();
        std::fs::create_dir_all(home.join(".nvm/versions/node/v20.3.1/bin")).unwrap();
        std::fs::create_dir_all(home.join(".nvm/versions/node/v20.11.0/bin")).unwrap();
        std::fs::create_dir_all(home.join(".nvm/alias")).unwrap();
        std::fs::write(home.join(".nvm/alias/default"), "20\n").unwrap();
        let env = tool_env(
            &[
                m(&home.join(".local/bin"), "/m/local/bin"),
                m(&home.join("opt/node"), "/m/node"),
                m(&home.join(".pyenv"), "/m/pyenv"),
                m(&home.join(".nvm"), "/m/nvm"),
            ],
            &[],
        );
        let want: Vec<PathBuf> = [
            "/m/local/bin",
            "/m/node/bin",
            "/m/pyenv/shims",
            "/m/pyenv/bin",
            "/m/nvm/versions/node/v20.11.0/bin",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(env.path, want);
        assert!(env.vars.contains(&("PYENV_ROOT".into(), "/m/pyenv".into())));
        assert!(env.vars.contains(&("NVM_DIR".into(), "/m/nvm".into())));
    }

    #[test]
    fn apply_prepends_path_and_sets_variables() {
        let mut env: Vec<(OsString, OsString)> = vec![("PATH".into(), "/usr/bin:/bin".into())];
        let t = ToolEnv {
            path: vec!["/t/bin".into()],
            vars: vec![("RUSTUP_HOME".into(), "/r".into())],
        };
        t.apply(&mut env);
        assert!(env.contains(&("PATH".into(), "/t/bin:/usr/bin:/bin".into())));
        assert!(env.contains(&("RUSTUP_HOME".into(), "/r".into())));
    }

    #[test]
    fn caches_are_private_directories_and_a_symlink_in_the_way_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path().join("cache/app-1");
        let made = prepare_caches(&cache, &["cargo".into()]).unwrap();
        assert_eq!(made[0].1.dst, PathBuf::from("/opt/airlock/cache/cargo"));
        assert!(made[0].1.rw);
        let mode = std::fs::metadata(cache.join("cargo")).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::os::unix::fs::symlink(tmp.path(), cache.join("npm")).unwrap();
        let e = prepare_caches(&cache, &["npm".into()]).unwrap_err();
        assert!(e.to_string().contains("not a directory"), "{e}");
    }

    #[test]
    fn doctor_suggestions_name_the_exact_mounts() {
        let tmp = tempfile::tempdir().unwrap();
        let home = std::fs::canonicalize(tmp.path()).unwrap();
        for d in [
            ".cargo/bin",
            ".rustup",
            ".pyenv/shims",
            ".nvm/versions/node/v20.1.0/bin",
            ".local/bin",
        ] {
            std::fs::create_dir_all(home.join(d)).unwrap();
        }
        let path = std::env::join_paths(
            [".cargo/bin", ".pyenv/shims", ".nvm/versions/node/v20.1.0/bin", ".local/bin"]
                .iter()
                .map(|d| home.join(d))
                .chain([PathBuf::from("/usr/bin")]),
        )
        .unwrap();
        let found = detect(&path, &home);
        let lines: Vec<String> = found.iter().map(|f| mounts_line(&f.mounts)).collect();
        assert_eq!(
            lines,
            vec![
                r#"mounts = ["~/.cargo/bin:ro", "~/.rustup:ro"]"#.to_string(),
                format!(r#"mounts = ["~/.pyenv:{}/.pyenv:ro"]"#, home.display()),
                r#"mounts = ["~/.nvm/versions/node/v20.1.0:ro"]"#.to_string(),
                r#"mounts = ["~/.local/bin:ro"]"#.to_string(),
            ]
        );
    }
}
