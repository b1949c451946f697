//! The per-repo agent home `~/.airlock/agent/<agent>/<repo key>/` (bound at `/home/agent`) and
//! the agent's shared credential store `~/.airlock/agent/<agent>/shared/` (SECURITY §4–5).
//!
//! Owns: creating the home and its layout directories and the synthesized `.gitconfig` (here),
//! credential copy-in before a session and copy-back after it ([`credentials`]: both sides
//! share the formats and the zeroized buffers), the transcript snapshot and hashes recorded at
//! session end ([`transcripts`]), copying a login the host already has into the shared store
//! ([`import`], `airlock agent import-login`), and the descriptor-relative file operations all
//! of them use (`beneath`).
//!
//! The home is written by the agent, and the agent is the adversary: it may plant symlinks,
//! FIFOs, huge files or hard links, and a concurrent session of the same repo may still be
//! changing the tree while we look. So every access below `~/.airlock/agent/` goes through a
//! directory fd and `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`, one
//! path component at a time; files are opened `O_NOFOLLOW | O_NONBLOCK` and must `fstat` as
//! regular files; every read has a size cap; every write is a temp file created `O_EXCL` in the
//! destination directory and `renameat` over the name. No symlink is ever followed.

mod beneath;
pub mod credentials;
pub mod import;
pub mod transcripts;

use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

pub use credentials::{CopyBack, CopyIn, SHARED_CREDENTIAL_CAP, credential_only, parses_as};
pub use transcripts::{Snapshot, TranscriptScan};

use crate::agent::{Agent, Layout};
use beneath::{mkdir_open, open_dir_path, write_replace};

/// `~/.airlock/agent/<agent>/shared/`: the credentials shared by all of the agent's homes.
pub const SHARED_DIR: &str = "shared";
/// Largest credential file read (bytes).
pub const CREDENTIAL_CAP: u64 = 1 << 20;
/// Largest transcript hashed (bytes); bigger ones are listed as `skipped:too-large`.
pub const TRANSCRIPT_CAP: u64 = 1 << 32;
/// Directory entries visited per transcript walk (all roots together).
pub const WALK_MAX_ENTRIES: usize = 100_000;
/// Directory levels descended below a transcript root.
pub const WALK_MAX_DEPTH: usize = 32;
/// How much of the session's end record the transcript list may take (JSON bytes): the record
/// is one line of at most `audit::MAX_RECORD` bytes (and travels in one control frame), and a
/// line too long loses the whole record. Past it, changed transcripts are only counted.
pub const RECORD_MAX_TRANSCRIPT_BYTES: usize = crate::audit::MAX_RECORD / 2;

pub(super) const TEMP_PREFIX: &str = ".airlock-tmp-";
pub(super) const DIR_MODE: u32 = 0o700;
pub(super) const FILE_MODE: u32 = 0o600;
pub(super) const HASH_BUF: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum HomeError {
    #[error(
        "`{name}` cannot name an agent home directory (it must be one path component, not `.`, \
         `..` or `{SHARED_DIR}`); this is a bug in Airlock, please report it"
    )]
    BadName { name: String },
    #[error(
        "{path} is a symlink; Airlock never follows links in an agent home: remove it and run \
         again"
    )]
    Symlink { path: PathBuf },
    #[error("{path} is not a directory; Airlock needs a directory there: remove it and run again")]
    NotDir { path: PathBuf },
    #[error(
        "{path} is a directory where Airlock writes a file; remove it (or move it away) and run \
         again"
    )]
    DirInTheWay { path: PathBuf },
    #[error("{path} is not a regular file; Airlock reads only regular files: remove it")]
    NotRegular { path: PathBuf },
    #[error(
        "{path} has {links} hard links; Airlock takes a credential only from a file with one \
         link: remove it and sign in again"
    )]
    HardLinked { path: PathBuf, links: libc::nlink_t },
    #[error(
        "{path} is larger than {cap} bytes, too big for a credential: remove it and sign in again"
    )]
    TooLarge { path: PathBuf, cap: u64 },
    #[error("{path} does not parse as {what}; remove it and sign in again inside `airlock run`")]
    BadCredential { path: PathBuf, what: &'static str },
    #[error(
        "no login at {path}: sign in on the host first (run the agent there once), or name the \
         file with --from"
    )]
    NoLogin { path: PathBuf },
    #[error(
        "the git {field} {value:?} contains a newline or other control character, which cannot \
         go in .gitconfig; fix it in ~/.airlock/identity.toml"
    )]
    BadGitValue { field: &'static str, value: String },
    #[error("{op} {path}: {source}; fix that (owner, permissions, free space) and run again")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

pub(super) fn io_err(op: &'static str, path: &Path, source: impl Into<io::Error>) -> HomeError {
    HomeError::Io { op, path: path.to_path_buf(), source: source.into() }
}

/// Maps an `openat2` failure on a directory to the error that says what is wrong with it.
pub(super) fn dir_err(op: &'static str, path: &Path, e: Errno) -> HomeError {
    match e {
        // RESOLVE_NO_SYMLINKS refuses with ELOOP; we resolve one component at a time, so it is
        // exactly this one.
        Errno::ELOOP => HomeError::Symlink { path: path.to_path_buf() },
        Errno::ENOTDIR => HomeError::NotDir { path: path.to_path_buf() },
        e => io_err(op, path, e),
    }
}

/// A per-repo agent home, held open by directory fds.
#[derive(Debug)]
pub struct AgentHome {
    /// `~/.airlock/agent/<agent>/` (parent of the home and of `shared/`).
    agent_dir: OwnedFd,
    agent_path: PathBuf,
    /// `~/.airlock/agent/<agent>/<repo key>/`.
    home: OwnedFd,
    path: PathBuf,
    layout: &'static Layout,
}

impl AgentHome {
    /// Opens, creating as needed with mode 0700, `<agent_root>/<agent.dir_name()>/<repo_key>/` where
    /// `agent_root` is `~/.airlock/agent`, then the layout's directories inside it.
    pub fn open(agent_root: &Path, agent: &Agent, repo_key: &str) -> Result<Self, HomeError> {
        let dir_name = agent.dir_name();
        check_component(&dir_name)?;
        check_component(repo_key)?;
        if repo_key == SHARED_DIR {
            return Err(HomeError::BadName { name: repo_key.into() });
        }

        // `~/.airlock` is never visible to the agent, so plain path calls are fine up to here;
        // the root itself must still be a real directory.
        if std::fs::symlink_metadata(agent_root).is_ok_and(|m| m.file_type().is_symlink()) {
            return Err(HomeError::Symlink { path: agent_root.to_path_buf() });
        }
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(agent_root)
            .map_err(|e| io_err("create directory", agent_root, e))?;
        let root = nix::fcntl::open(
            agent_root,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| dir_err("open directory", agent_root, e))?;

        let agent_path = agent_root.join(&dir_name);
        let agent_dir = mkdir_open(root.as_fd(), &agent_path, OsStr::new(&dir_name))?;
        let path = agent_path.join(repo_key);
        let home = mkdir_open(agent_dir.as_fd(), &path, OsStr::new(repo_key))?;
        let layout = agent.layout();
        for dir in layout.dirs {
            open_dir_path(home.as_fd(), &path, Path::new(dir), true)?;
        }
        Ok(AgentHome { agent_dir, agent_path, home, path, layout })
    }

    /// Host path of the home (for the bind mount and messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn shared_path(&self) -> PathBuf {
        self.agent_path.join(SHARED_DIR)
    }

    /// Writes `<home>/.gitconfig` with the identity's name and email.
    pub fn write_gitconfig(&self, name: &str, email: &str) -> Result<(), HomeError> {
        let text = gitconfig(name, email)?;
        write_replace(self.home.as_fd(), &self.path, OsStr::new(".gitconfig"), text.as_bytes())
    }
}

/// The `.gitconfig` text; values are always double-quoted, with `\` and `"` escaped
/// (git-config(1)). Control characters other than tab cannot be written safely: refused.
fn gitconfig(name: &str, email: &str) -> Result<String, HomeError> {
    Ok(format!(
        "[user]\n\tname = {}\n\temail = {}\n",
        git_quote("name", name)?,
        git_quote("email", email)?
    ))
}

fn git_quote(field: &'static str, value: &str) -> Result<String, HomeError> {
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(HomeError::BadGitValue { field, value: value.into() });
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        if c == '\\' || c == '"' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    Ok(out)
}

fn check_component(name: &str) -> Result<(), HomeError> {
    let mut parts = Path::new(name).components();
    match (parts.next(), parts.next()) {
        (Some(Component::Normal(n)), None) if n == OsStr::new(name) => Ok(()),
        _ => Err(HomeError::BadName { name: name.into() }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod test_support {
    use super::*;
    use sha2::{Digest, Sha256};
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::mpsc;
    use std::time::Duration;

    pub(crate) const CLAUDE_CRED: &str =
        r#"{"claudeAiOauth":{"accessToken":"x","refreshToken":"y","expiresAt":1}}"#;
    pub(crate) const CLAUDE_CRED2: &str =
        r#"{"claudeAiOauth":{"accessToken":"x2","refreshToken":"y2","expiresAt":2}}"#;
    pub(crate) const CRED_REL: &str = ".claude/.credentials.json";

    pub(crate) struct Fixture {
        pub(crate) tmp: tempfile::TempDir,
    }

    impl Fixture {
        pub(crate) fn new() -> Self {
            Fixture { tmp: tempfile::tempdir().unwrap() }
        }
        pub(crate) fn root(&self) -> PathBuf {
            self.tmp.path().join("agent")
        }
        pub(crate) fn outside(&self) -> PathBuf {
            let p = self.tmp.path().join("outside");
            fs::create_dir_all(&p).unwrap();
            p
        }
        pub(crate) fn shared(&self) -> PathBuf {
            self.root().join("claude").join(SHARED_DIR)
        }
        pub(crate) fn open(&self) -> AgentHome {
            AgentHome::open(&self.root(), &Agent::Claude, "repo-1").unwrap()
        }
        pub(crate) fn put_shared(&self, bytes: &str) {
            fs::create_dir_all(self.shared()).unwrap();
            fs::write(self.shared().join(".credentials.json"), bytes).unwrap();
        }
        pub(crate) fn shared_cred(&self) -> Option<String> {
            fs::read_to_string(self.shared().join(".credentials.json")).ok()
        }
    }

    pub(crate) fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    pub(crate) fn hex_sha(bytes: &[u8]) -> String {
        format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
    }

    /// Runs `f` on another thread and fails (instead of hanging) if it takes too long.
    pub(crate) fn within<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(20)).expect("hung")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::test_support::*;
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    #[test]
    fn open_creates_dirs_0700() {
        let fx = Fixture::new();
        let home = fx.open();
        let expected = fx.root().join("claude").join("repo-1");
        assert_eq!(home.path(), expected);
        assert_eq!(mode(&fx.root().join("claude")), 0o700);
        assert_eq!(mode(&expected), 0o700);
        assert_eq!(mode(&expected.join(".claude")), 0o700);
        // Opening again is fine.
        AgentHome::open(&fx.root(), &Agent::Claude, "repo-1").unwrap();
        let codex = AgentHome::open(&fx.root(), &Agent::Codex, "repo-1").unwrap();
        assert!(codex.path().join(".codex").is_dir());
    }

    #[test]
    fn open_refuses_bad_repo_keys() {
        let fx = Fixture::new();
        for key in ["a/b", "..", ".", "", "/abs", "shared", "../x", "a/"] {
            let err = AgentHome::open(&fx.root(), &Agent::Claude, key).unwrap_err();
            assert!(matches!(err, HomeError::BadName { .. }), "{key}: {err}");
        }
    }

    #[test]
    fn open_refuses_symlinked_home_and_agent_root() {
        let fx = Fixture::new();
        let outside = fx.outside();
        fs::create_dir_all(fx.root().join("claude")).unwrap();
        let link = fx.root().join("claude").join("repo-1");
        symlink(&outside, &link).unwrap();
        let err = AgentHome::open(&fx.root(), &Agent::Claude, "repo-1").unwrap_err();
        assert!(matches!(&err, HomeError::Symlink { path } if *path == link), "{err}");
        assert!(err.to_string().contains("remove it and run again"), "{err}");
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);

        let root_link = fx.tmp.path().join("root-link");
        symlink(&outside, &root_link).unwrap();
        let err = AgentHome::open(&root_link, &Agent::Claude, "repo-1").unwrap_err();
        assert!(matches!(err, HomeError::Symlink { .. }), "{err}");
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn open_refuses_symlinked_layout_dir() {
        let fx = Fixture::new();
        let outside = fx.outside();
        let home = fx.open();
        fs::remove_dir(home.path().join(".claude")).unwrap();
        symlink(&outside, home.path().join(".claude")).unwrap();
        let err = AgentHome::open(&fx.root(), &Agent::Claude, "repo-1").unwrap_err();
        assert!(matches!(err, HomeError::Symlink { .. }), "{err}");
        assert!(err.to_string().contains(".claude is a symlink"), "{err}");
        assert_eq!(fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn open_refuses_file_where_dir_belongs() {
        let fx = Fixture::new();
        let home = fx.open();
        fs::remove_dir(home.path().join(".claude")).unwrap();
        fs::write(home.path().join(".claude"), "x").unwrap();
        let err = AgentHome::open(&fx.root(), &Agent::Claude, "repo-1").unwrap_err();
        assert!(matches!(err, HomeError::NotDir { .. }), "{err}");
    }

    #[test]
    fn gitconfig_output_and_escaping() {
        let fx = Fixture::new();
        let home = fx.open();
        home.write_gitconfig("Jane Doe", "jane@example.com").unwrap();
        let p = home.path().join(".gitconfig");
        assert_eq!(
            fs::read_to_string(&p).unwrap(),
            "[user]\n\tname = \"Jane Doe\"\n\temail = \"jane@example.com\"\n"
        );
        assert_eq!(mode(&p), 0o600);
        assert_eq!(
            gitconfig(r#"a "q" \b ; #c"#, "e").unwrap(),
            "[user]\n\tname = \"a \\\"q\\\" \\\\b ; #c\"\n\temail = \"e\"\n"
        );
        // Replaces a planted symlink without writing through it.
        let target = fx.outside().join("bashrc");
        fs::write(&target, "keep").unwrap();
        fs::remove_file(&p).unwrap();
        symlink(&target, &p).unwrap();
        home.write_gitconfig("n", "e").unwrap();
        assert_eq!(fs::read_to_string(&target).unwrap(), "keep");
        assert!(fs::symlink_metadata(&p).unwrap().is_file());
    }

    #[test]
    fn gitconfig_rejects_newline_and_nul() {
        let fx = Fixture::new();
        let home = fx.open();
        for (name, email) in
            [("a\nb", "e"), ("n", "e\n[core]\n\tsshCommand = evil"), ("a\0", "e"), ("n", "e\r")]
        {
            let err = home.write_gitconfig(name, email).unwrap_err();
            assert!(matches!(err, HomeError::BadGitValue { .. }), "{err}");
        }
        assert!(!home.path().join(".gitconfig").exists());
    }

    /// Reads back a value as git-config(1) does for our always-quoted form.
    fn unquote(line: &str) -> String {
        let inner = line.strip_prefix('"').unwrap().strip_suffix('"').unwrap();
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' => out.push(chars.next().unwrap()),
                '"' => panic!("unescaped quote in {line}"),
                c => out.push(c),
            }
        }
        out
    }

    fn git_available() -> bool {
        std::process::Command::new("git")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        #[test]
        fn gitconfig_round_trips(name in "[^\\p{Cc}]{0,24}|[ \\t\"\\\\;#=a-z\\[\\]]{0,12}",
                                 email in "[^\\p{Cc}]{0,24}|[ \\t\"\\\\;#=a-z@.]{0,12}") {
            let text = gitconfig(&name, &email).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            proptest::prop_assert_eq!(lines.len(), 3);
            let value = |line: &str, key: &str| unquote(line.strip_prefix(key).unwrap());
            proptest::prop_assert_eq!(value(lines[1], "\tname = "), name.clone());
            proptest::prop_assert_eq!(value(lines[2], "\temail = "), email.clone());
            if git_available() {
                let dir = tempfile::tempdir().unwrap();
                let file = dir.path().join("gitconfig");
                fs::write(&file, &text).unwrap();
                for (key, want) in [("user.name", &name), ("user.email", &email)] {
                    let out = std::process::Command::new("git")
                        .args(["config", "-f"]).arg(&file).args(["--get", key])
                        .env("GIT_CONFIG_NOSYSTEM", "1")
                        .output().unwrap();
                    proptest::prop_assert!(out.status.success(), "{text}");
                    let got = String::from_utf8(out.stdout).unwrap();
                    proptest::prop_assert_eq!(got.strip_suffix('\n').unwrap(), want.as_str());
                }
            }
        }
    }
}
