//! `~/.airlock/publish/rejected.jsonl` (0600): one JSON line per item the server refused or
//! stored as a `conflict`, and per line that could not be made an item at all, with the reason,
//! so nothing is ever dropped silently.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// One rejected item.
#[derive(Debug, Clone, Serialize)]
pub struct Rejection<'a> {
    pub ts: String,
    pub file: &'a str,
    pub offset: u64,
    pub id: &'a str,
    pub source: &'a str,
    /// The item's HTTP code (409, 400, 403, 413), or 0 when refused before sending.
    pub code: u16,
    /// `conflict`, `rejected`, or `refused` (never sent).
    pub status: &'a str,
    pub error: &'a str,
}

/// `~/.airlock/publish/rejected.jsonl`.
pub fn path(airlock_dir: &Path) -> PathBuf {
    super::state::dir(airlock_dir).join("rejected.jsonl")
}

/// Appends `r` as one line (one `write(2)`, `O_APPEND`).
pub fn append(airlock_dir: &Path, r: &Rejection<'_>) -> io::Result<()> {
    let path = path(airlock_dir);
    crate::config::fsutil::private_dir(super::state::dir(airlock_dir).as_path())?;
    let mut line = serde_json::to_vec(r).map_err(io::Error::other)?;
    line.push(b'\n');
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)?;
    f.write_all(&line)
}
