//! The review-plane API token on disk, `~/.airlock/token`, and the private CA beside it,
//! `~/.airlock/server-ca.pem`. The token file holds the token alone (one line), is 0600 from
//! creation, and is refused when group or others may read it. In memory the token lives in a
//! [`Zeroizing`] string and is never printed: no error here quotes it.

use std::io::Read;
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use crate::config::fsutil;
use crate::paths::Paths;

/// Longest token file read; real tokens are well under 100 bytes.
pub const MAX_TOKEN_BYTES: usize = 4096;

/// `~/.airlock/token`.
pub fn token_path(paths: &Paths) -> PathBuf {
    paths.airlock_dir().join("token")
}

/// `~/.airlock/server-ca.pem`.
pub fn server_ca_path(paths: &Paths) -> PathBuf {
    paths.airlock_dir().join("server-ca.pem")
}

/// What is wrong with a token (from a file or from stdin); never contains the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenShapeError {
    #[error("it is empty")]
    Empty,
    #[error("it is longer than {MAX_TOKEN_BYTES} bytes")]
    TooLong,
    #[error("it is not valid UTF-8")]
    NotUtf8,
    #[error("it holds whitespace or control characters inside (one token, one line)")]
    BadChar,
}

/// Checks a token as read: the trailing newline (`\n` or `\r\n`) removed, nothing else
/// changed. The input is consumed so no unzeroized copy stays behind.
pub fn parse_token(raw: Zeroizing<Vec<u8>>) -> Result<Zeroizing<String>, TokenShapeError> {
    if raw.len() > MAX_TOKEN_BYTES {
        return Err(TokenShapeError::TooLong);
    }
    let text = std::str::from_utf8(&raw).map_err(|_| TokenShapeError::NotUtf8)?;
    let text = text.strip_suffix('\n').unwrap_or(text);
    let text = text.strip_suffix('\r').unwrap_or(text);
    if text.is_empty() {
        return Err(TokenShapeError::Empty);
    }
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(TokenShapeError::BadChar);
    }
    Ok(Zeroizing::new(text.to_owned()))
}

/// Reads at most `MAX_TOKEN_BYTES + 1` bytes into a buffer allocated once (so no reallocation
/// leaves a copy of the secret in freed memory).
pub fn read_bounded(mut r: impl Read) -> std::io::Result<Zeroizing<Vec<u8>>> {
    let mut buf = Zeroizing::new(vec![0u8; MAX_TOKEN_BYTES + 1]);
    let mut len = 0;
    while len < buf.len() {
        match r.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// Why the token file could not be used. Carries the path and a reason, never the token.
#[derive(Debug, thiserror::Error)]
pub enum TokenFileError {
    #[error(
        "refusing to read {path}: mode {mode:04o} lets other users read it; run \
         `chmod 600 {path}` (and, since others could read it, consider having the token \
         revoked and logging in again)",
        path = .path.display()
    )]
    TooOpen { path: PathBuf, mode: u32 },
    #[error("refusing to read {path}: it is owned by uid {owner}, not by you (uid {me}); remove it and run `airlock login --server URL` again", path = .path.display())]
    NotOwned { path: PathBuf, owner: u32, me: u32 },
    #[error("cannot read {path}: {source}", path = .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: the token {why}; run `airlock login --server URL` again", path = .path.display())]
    Shape { path: PathBuf, why: TokenShapeError },
    #[error("cannot write {path}: {source}", path = .path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot remove {path}: {source}", path = .path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Reads the token file: a regular file (symlinks not followed) owned by the caller with no
/// group/other bits. `Ok(None)` when it does not exist.
pub fn read_token(path: &Path) -> Result<Option<Zeroizing<String>>, TokenFileError> {
    use crate::config::fsutil::{self, PrivateReadError};
    let f = match fsutil::open_private(path) {
        Ok(Some(f)) => f,
        Ok(None) => return Ok(None),
        Err(PrivateReadError::NotOwned { owner, me }) => {
            return Err(TokenFileError::NotOwned { path: path.to_owned(), owner, me });
        }
        Err(PrivateReadError::TooOpen { mode }) => {
            return Err(TokenFileError::TooOpen { path: path.to_owned(), mode });
        }
        Err(PrivateReadError::Io(source)) => {
            return Err(TokenFileError::Read { path: path.to_owned(), source });
        }
    };
    let raw =
        read_bounded(f).map_err(|source| TokenFileError::Read { path: path.to_owned(), source })?;
    parse_token(raw).map(Some).map_err(|why| TokenFileError::Shape { path: path.to_owned(), why })
}

/// Writes the token file atomically, 0600 from creation (temp file `O_EXCL` + rename).
pub fn write_token(path: &Path, token: &str) -> Result<(), TokenFileError> {
    let mut line = Zeroizing::new(String::with_capacity(token.len() + 1));
    line.push_str(token);
    line.push('\n');
    fsutil::write_private(path, line.as_bytes())
        .map_err(|source| TokenFileError::Write { path: path.to_owned(), source })
}

/// Removes a file; `Ok(false)` when there was none.
pub fn remove(path: &Path) -> Result<bool, TokenFileError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(TokenFileError::Remove { path: path.to_owned(), source }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn parse(s: &[u8]) -> Result<String, TokenShapeError> {
        parse_token(Zeroizing::new(s.to_vec())).map(|t| t.to_string())
    }

    #[test]
    fn token_shapes() {
        assert_eq!(parse(b"alk_abc\n").unwrap(), "alk_abc");
        assert_eq!(parse(b"alk_abc\r\n").unwrap(), "alk_abc");
        assert_eq!(parse(b"alk_abc").unwrap(), "alk_abc");
        assert_eq!(parse(b"\n"), Err(TokenShapeError::Empty));
        assert_eq!(parse(b""), Err(TokenShapeError::Empty));
        assert_eq!(parse(b"a b\n"), Err(TokenShapeError::BadChar));
        assert_eq!(parse(b"a\n\n"), Err(TokenShapeError::BadChar));
        assert_eq!(parse(b" a\n"), Err(TokenShapeError::BadChar));
        assert_eq!(parse(b"\xff"), Err(TokenShapeError::NotUtf8));
        assert_eq!(parse(&[b'a'; MAX_TOKEN_BYTES + 1]), Err(TokenShapeError::TooLong));
    }

    #[test]
    fn token_file_round_trip_and_refusals() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("airlock/token");
        assert!(read_token(&path).unwrap().is_none());
        write_token(&path, "alk_secret").unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(std::fs::read(&path).unwrap(), b"alk_secret\n");
        assert_eq!(read_token(&path).unwrap().unwrap().as_str(), "alk_secret");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        let e = read_token(&path).unwrap_err().to_string();
        assert!(e.contains(&format!("chmod 600 {}", path.display())), "{e}");
        assert!(e.contains("0640"), "{e}");
        assert!(!e.contains("alk_secret"), "{e}");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "two words\n").unwrap();
        let e = read_token(&path).unwrap_err().to_string();
        assert!(e.contains("whitespace") && !e.contains("two words"), "{e}");

        let link = tmp.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(matches!(read_token(&link), Err(TokenFileError::Read { .. })));

        assert!(remove(&path).unwrap());
        assert!(!remove(&path).unwrap());
    }
}
