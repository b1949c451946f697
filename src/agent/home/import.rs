//! `airlock agent import-login`: copies a login the host already has (Claude Code's
//! `~/.claude/.credentials.json`, Codex's `~/.codex/auth.json`) into the agent's shared store
//! `~/.airlock/agent/<agent>/shared/` once, so the next `airlock run` in any repo starts signed
//! in. The host's agent directory is never mounted; only the credential format's own fields are
//! copied, re-serialized (as copy-back does), in zeroized buffers.
//!
//! The source is read through a directory fd, one component at a time, with no symlink
//! followed (a link there may point anywhere, so it is refused with the way out: `--from` the
//! real file). The destination is written as an `O_EXCL` temp file (0600) renamed over the name.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::beneath::{mkdir_open, read_capped, write_replace};
use super::credentials::{credential_only, format_name};
use super::{CREDENTIAL_CAP, DIR_MODE, HomeError, SHARED_DIR, dir_err, io_err};
use crate::agent::{Agent, Credential};

/// Where a login is read from: a directory, held open, and the file's name in it.
#[derive(Debug)]
pub struct LoginSource {
    dir: OwnedFd,
    dir_path: PathBuf,
    name: OsString,
}

impl LoginSource {
    /// `rel` (e.g. `.claude/.credentials.json`) below `base` (the host's home, or the agent's
    /// own config directory from `CLAUDE_CONFIG_DIR`/`CODEX_HOME`, or `--from`'s directory).
    /// `base` itself is taken as given; every component below it must be a real directory.
    pub fn open(base: &Path, rel: &Path) -> Result<Self, HomeError> {
        let mut dir = open_trusted_dir(base)?;
        let mut dir_path = base.to_path_buf();
        let (parent, name) = crate::fsat::split(rel);
        for part in parent.into_iter().flat_map(Path::components) {
            let std::path::Component::Normal(part) = part else {
                return Err(HomeError::BadName { name: rel.to_string_lossy().into_owned() });
            };
            dir_path.push(part);
            dir = super::beneath::open_dir(dir.as_fd(), part).map_err(|e| match e {
                Errno::ENOENT => HomeError::NoLogin { path: base.join(rel) },
                e => dir_err("open directory", &dir_path, e),
            })?;
        }
        Ok(Self { dir, dir_path, name: name.as_os_str().to_owned() })
    }

    /// The file's path, for messages.
    pub fn path(&self) -> PathBuf {
        self.dir_path.join(&self.name)
    }
}

fn open_trusted_dir(path: &Path) -> Result<OwnedFd, HomeError> {
    nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::ENOENT => HomeError::NoLogin { path: path.to_path_buf() },
        e => dir_err("open directory", path, e),
    })
}

/// Why an import did not happen (beyond [`HomeError`]'s file problems).
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error(
        "{agent} keeps no credential file Airlock can share; only claude and codex logins import"
    )]
    NoCredential { agent: String },
    #[error(
        "{path} already holds a shared {agent} login; every repo's session uses it already. Pass \
         --force to replace it with the host's login"
    )]
    AlreadyShared { agent: String, path: PathBuf },
    #[error(transparent)]
    Home(#[from] HomeError),
}

/// The agent's one shared credential.
pub fn shared_credential(agent: &Agent) -> Option<&'static Credential> {
    agent.layout().credentials.first()
}

/// Copies the login at `source` into `<agent_root>/<agent>/shared/`; returns the path written.
/// Refuses when the shared store already has a credential (or anything at its name), unless
/// `force`.
pub fn import_login(
    agent_root: &Path,
    agent: &Agent,
    source: &LoginSource,
    force: bool,
) -> Result<PathBuf, ImportError> {
    let cred = shared_credential(agent)
        .ok_or_else(|| ImportError::NoCredential { agent: agent.name().into() })?;
    let src_path = source.path();
    let bytes = read_capped(source.dir.as_fd(), &source.dir_path, &source.name, CREDENTIAL_CAP)?
        .map(|(bytes, _)| bytes)
        .ok_or_else(|| HomeError::NoLogin { path: src_path.clone() })?;
    // Only the format's own fields, as copy-back takes them: nothing else of the host's file
    // reaches the sandbox.
    let shared = credential_only(cred.format, &bytes)
        .ok_or(HomeError::BadCredential { path: src_path, what: format_name(cred.format) })?;

    let agent_dir_path = agent_root.join(agent.dir_name());
    let shared_path = agent_dir_path.join(SHARED_DIR);
    let file_name = Path::new(cred.rel)
        .file_name()
        .ok_or_else(|| HomeError::BadName { name: cred.rel.into() })?;
    let dest = shared_path.join(file_name);

    if std::fs::symlink_metadata(agent_root).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(HomeError::Symlink { path: agent_root.to_path_buf() }.into());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(agent_root)
        .map_err(|e| io_err("create directory", agent_root, e))?;
    let root = open_trusted_dir(agent_root)?;
    let agent_dir = mkdir_open(root.as_fd(), &agent_dir_path, OsStr::new(&agent.dir_name()))?;
    let shared_dir = mkdir_open(agent_dir.as_fd(), &shared_path, OsStr::new(SHARED_DIR))?;
    let existing = crate::fsat::lstat_at(shared_dir.as_fd(), Path::new(file_name))
        .map_err(|e| io_err("stat", &dest, e))?;
    if existing.is_some() && !force {
        return Err(ImportError::AlreadyShared { agent: agent.name().into(), path: dest });
    }
    write_replace(shared_dir.as_fd(), &shared_path, file_name, &shared)?;
    Ok(dest)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    const CLAUDE_LOGIN: &str = r#"{"claudeAiOauth":{"accessToken":"sk-ant-oat-1","refreshToken":"r1","expiresAt":1,"scopes":["user:inference"],"extra":{"x":1}},"other":"host-only"}"#;

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let home = tmp.path().join("home");
        std::fs::create_dir_all(home.join(".claude")).unwrap();
        let root = home.join(".airlock/agent");
        (tmp, home, root)
    }

    fn import(home: &Path, root: &Path, force: bool) -> Result<PathBuf, ImportError> {
        let src = LoginSource::open(home, Path::new(".claude/.credentials.json"))?;
        import_login(root, &Agent::Claude, &src, force)
    }

    #[test]
    fn copies_only_the_credential_fields_with_mode_0600() {
        let (_t, home, root) = setup();
        std::fs::write(home.join(".claude/.credentials.json"), CLAUDE_LOGIN).unwrap();
        let dest = import(&home, &root, false).unwrap();
        assert_eq!(dest, root.join("claude/shared/.credentials.json"));
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&dest).unwrap()).unwrap();
        assert_eq!(v["claudeAiOauth"]["accessToken"], "sk-ant-oat-1");
        assert_eq!(v["claudeAiOauth"]["scopes"][0], "user:inference");
        assert!(v.get("other").is_none() && v["claudeAiOauth"].get("extra").is_none(), "{v}");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dest), 0o600);
        assert_eq!(mode(&root.join("claude/shared")), 0o700);
        assert_eq!(mode(&root.join("claude")), 0o700);
    }

    #[test]
    fn refuses_an_existing_shared_login_unless_forced() {
        let (_t, home, root) = setup();
        std::fs::write(home.join(".claude/.credentials.json"), CLAUDE_LOGIN).unwrap();
        let shared = root.join("claude/shared");
        std::fs::create_dir_all(&shared).unwrap();
        let held = r#"{"claudeAiOauth":{"accessToken":"held"}}"#;
        std::fs::write(shared.join(".credentials.json"), held).unwrap();
        let err = import(&home, &root, false).unwrap_err();
        assert!(matches!(err, ImportError::AlreadyShared { .. }), "{err}");
        assert!(err.to_string().contains("--force"), "{err}");
        assert_eq!(std::fs::read_to_string(shared.join(".credentials.json")).unwrap(), held);
        import(&home, &root, true).unwrap();
        let now = std::fs::read_to_string(shared.join(".credentials.json")).unwrap();
        assert!(now.contains("sk-ant-oat-1"), "{now}");
    }

    #[test]
    fn never_follows_a_symlink_in_the_source_or_the_store() {
        let (t, home, root) = setup();
        let real = t.path().join("elsewhere.json");
        std::fs::write(&real, CLAUDE_LOGIN).unwrap();
        // The login file is a link.
        std::os::unix::fs::symlink(&real, home.join(".claude/.credentials.json")).unwrap();
        let err = import(&home, &root, false).unwrap_err();
        assert!(matches!(err, ImportError::Home(HomeError::Symlink { .. })), "{err}");
        // The directory holding it is a link.
        std::fs::remove_file(home.join(".claude/.credentials.json")).unwrap();
        std::fs::remove_dir(home.join(".claude")).unwrap();
        let dir = t.path().join("realclaude");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(".credentials.json"), CLAUDE_LOGIN).unwrap();
        std::os::unix::fs::symlink(&dir, home.join(".claude")).unwrap();
        let err = import(&home, &root, false).unwrap_err();
        assert!(matches!(err, ImportError::Home(HomeError::Symlink { .. })), "{err}");
        assert!(!root.join("claude/shared/.credentials.json").exists());

        // A link planted at the shared name is replaced with --force, never written through.
        std::fs::remove_file(home.join(".claude")).unwrap();
        std::fs::create_dir_all(home.join(".claude")).unwrap();
        std::fs::write(home.join(".claude/.credentials.json"), CLAUDE_LOGIN).unwrap();
        let victim = t.path().join("victim");
        std::fs::write(&victim, "keep").unwrap();
        std::fs::create_dir_all(root.join("claude/shared")).unwrap();
        std::os::unix::fs::symlink(&victim, root.join("claude/shared/.credentials.json")).unwrap();
        assert!(matches!(import(&home, &root, false), Err(ImportError::AlreadyShared { .. })));
        import(&home, &root, true).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        let meta = std::fs::symlink_metadata(root.join("claude/shared/.credentials.json")).unwrap();
        assert!(meta.file_type().is_file());
    }

    #[test]
    fn a_missing_or_malformed_login_is_a_clear_error_and_writes_nothing() {
        let (_t, home, root) = setup();
        let err = import(&home, &root, false).unwrap_err();
        assert!(matches!(err, ImportError::Home(HomeError::NoLogin { .. })), "{err}");
        std::fs::write(home.join(".claude/.credentials.json"), r#"{"apiKey":"x"}"#).unwrap();
        let err = import(&home, &root, false).unwrap_err();
        assert!(matches!(err, ImportError::Home(HomeError::BadCredential { .. })), "{err}");
        assert!(!root.exists(), "wrote before the login was known good");
        let custom = Agent::Custom { name: "x".into() };
        let src = LoginSource::open(&home, Path::new(".claude/.credentials.json")).unwrap();
        assert!(matches!(
            import_login(&root, &custom, &src, false),
            Err(ImportError::NoCredential { .. })
        ));
    }
}
