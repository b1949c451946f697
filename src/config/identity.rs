//! The identity file `~/.airlock/identity.toml` (DESIGN §3): who a developer is, for audit
//! attribution. 0600 in a 0700 directory; a file other users could read or change is refused.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::diag::line_col;
use super::fsutil::{self, PrivateReadError};
use crate::paths::Paths;

/// `~/.airlock/identity.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    pub email: String,
    /// Locally generated (`u_` + 16 hex) by `login --email`, or the review plane's id later.
    pub user_id: String,
    /// The review plane this identity logged in to (`airlock login --server`), normalized
    /// as `scheme://host:port`; its token is `~/.airlock/token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<String>,
    /// The role the server reported at login (`member`, `reviewer`, `admin`), shown by
    /// `airlock whoami --offline`; the server decides, this copy is only for display.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// The server's review-log key, pinned at `airlock login --server` (docs/evidence.md): a
    /// signed-note verifier key (`<name>+<id>+<base64>`). Absent when the server keeps no
    /// signed log. `airlock publish` checks every checkpoint against it; a later login that
    /// is answered with another key is refused unless `--accept-new-log-key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_key: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("refusing to read {path}: {reason}; run `chmod 600 {path}`", path = .path.display())]
    TooOpen { path: PathBuf, reason: String },
    #[error("refusing to read {path}: {reason}", path = .path.display())]
    NotOwned { path: PathBuf, reason: String },
    #[error("cannot read {path}: {source}", path = .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}:{line}:{col}: {message}; fix the file or run `airlock login --email ADDRESS` again",
        path = .path.display()
    )]
    Invalid { path: PathBuf, line: usize, col: usize, message: String },
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
    #[error("{0:?} is not an email address: {1}")]
    BadEmail(String, &'static str),
    #[error("cannot encode the identity: {0}")]
    Encode(#[from] toml::ser::Error),
}

/// Reads the identity file; `Ok(None)` when not logged in.
pub fn read(path: &Path) -> Result<Option<Identity>, IdentityError> {
    let bytes = match fsutil::read_private(path) {
        Ok(Some(b)) => b,
        Ok(None) => return Ok(None),
        Err(e @ PrivateReadError::TooOpen { .. }) => {
            return Err(IdentityError::TooOpen { path: path.to_owned(), reason: e.to_string() });
        }
        Err(e @ PrivateReadError::NotOwned { .. }) => {
            return Err(IdentityError::NotOwned { path: path.to_owned(), reason: e.to_string() });
        }
        Err(PrivateReadError::Io(source)) => {
            return Err(IdentityError::Read { path: path.to_owned(), source });
        }
    };
    let invalid = |offset: usize, text: &str, message: String| {
        let (line, col) = line_col(text, offset);
        IdentityError::Invalid { path: path.to_owned(), line, col, message }
    };
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        let prefix = String::from_utf8_lossy(&bytes[..e.valid_up_to()]).into_owned();
        invalid(prefix.len(), &prefix, "not valid UTF-8".to_owned())
    })?;
    let identity: Identity = toml::from_str(text).map_err(|e| {
        invalid(e.span().map_or(0, |s| s.start), text, e.message().trim_end().to_owned())
    })?;
    if let Err(why) = validate_email(&identity.email) {
        let offset = text.find("email").unwrap_or(0);
        return Err(invalid(offset, text, format!("email {:?}: {why}", identity.email)));
    }
    Ok(Some(identity))
}

/// Writes the identity atomically, 0600 from creation.
pub fn write(path: &Path, identity: &Identity) -> Result<(), IdentityError> {
    let text = toml::to_string(identity)?;
    fsutil::write_private(path, text.as_bytes())
        .map_err(|source| IdentityError::Write { path: path.to_owned(), source })
}

/// `airlock login --email ADDRESS`: a local identity. The `user_id` is kept when the email is
/// unchanged (so audit history stays attributed to one id), otherwise derived from the email,
/// so that logging out and back in (or switching away and back) gives the same id again.
pub fn login_email(paths: &Paths, email: &str) -> Result<Identity, IdentityError> {
    let email = email.trim();
    validate_email(email).map_err(|why| IdentityError::BadEmail(email.to_owned(), why))?;
    let path = paths.identity_file();
    let existing = read(&path)?;
    let user_id = match existing {
        Some(old) if old.email.eq_ignore_ascii_case(email) && old.server.is_none() => old.user_id,
        _ => local_user_id(email),
    };
    let identity =
        Identity { email: email.to_owned(), user_id, server: None, role: None, log_key: None };
    fsutil::private_dir(&paths.airlock_dir())
        .map_err(|source| IdentityError::Write { path: paths.airlock_dir(), source })?;
    write(&path, &identity)?;
    Ok(identity)
}

/// `airlock logout`: removes the identity file; `Ok(false)` when there was none.
pub fn logout(paths: &Paths) -> Result<bool, IdentityError> {
    let path = paths.identity_file();
    match std::fs::remove_file(&path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(IdentityError::Remove { path, source }),
    }
}

/// The stable local `user_id` of an email: `u_` + 16 lowercase hex characters of a SHA-256 of
/// the lowercased address. DESIGN §3 asks for a *stable* id; a random one was lost on every
/// `logout`, splitting one person's audit history across ids. It reveals nothing the session
/// records (which carry the email) do not, and the review plane attributes by token anyway.
pub fn local_user_id(email: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(b"airlock local user_id v1\n")
        .chain_update(email.trim().to_ascii_lowercase().as_bytes())
        .finalize();
    format!("u_{}", hex::encode(&digest[..8]))
}

/// The shape of an address (`local@domain.tld`); deliverability is not our business.
pub fn validate_email(email: &str) -> Result<(), &'static str> {
    if email.is_empty() {
        return Err("it is empty");
    }
    if email.len() > 254 {
        return Err("it is longer than 254 characters");
    }
    if email.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("it contains whitespace or control characters");
    }
    let Some((local, domain)) = email.split_once('@') else {
        return Err("it has no @");
    };
    if domain.contains('@') {
        return Err("it has more than one @");
    }
    if local.is_empty() || local.len() > 64 {
        return Err("the part before @ must be 1 to 64 characters");
    }
    if local.starts_with('.') || local.ends_with('.') || local.contains("..") {
        return Err("the part before @ has a misplaced dot");
    }
    if !local.chars().all(|c| c.is_alphanumeric() || "!#$%&'*+/=?^_`{|}~.-".contains(c)) {
        return Err("the part before @ has a character addresses cannot contain");
    }
    let labels: Vec<&str> = domain.split('.').collect();
    if labels.len() < 2 {
        return Err("the domain needs a dot (e.g. example.com)");
    }
    for label in labels {
        if label.is_empty() || label.len() > 63 {
            return Err("a domain label is empty or longer than 63 characters");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return Err("a domain label starts or ends with a hyphen");
        }
        if !label.chars().all(|c| c.is_alphanumeric() || c == '-') {
            return Err("the domain has a character host names cannot contain");
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn email_shapes() {
        for ok in ["a@b.co", "first.last+tag@sub.example.com", "ü@bücher.de"] {
            assert_eq!(validate_email(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "plain",
            "a@b",
            "@b.com",
            "a@@b.com",
            "a@b@c.com",
            "a b@c.com",
            "a@-b.com",
            "a@b..com",
            ".a@b.com",
            "a..b@c.com",
            "a@b.com\n",
            "a\"@b.com",
        ] {
            assert!(validate_email(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn login_keeps_the_id_for_the_same_email() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = Paths::with_home(tmp.path().to_path_buf());
        let a = login_email(&paths, "dev@example.com").unwrap();
        assert!(a.user_id.starts_with("u_") && a.user_id.len() == 18);
        let b = login_email(&paths, "dev@example.com").unwrap();
        assert_eq!(a.user_id, b.user_id);
        let c = login_email(&paths, "other@example.com").unwrap();
        assert_ne!(a.user_id, c.user_id);
        assert_eq!(read(&paths.identity_file()).unwrap(), Some(c));
        let mode = std::fs::metadata(paths.identity_file()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(logout(&paths).unwrap());
        assert!(!logout(&paths).unwrap());
        assert_eq!(read(&paths.identity_file()).unwrap(), None);
        // Stable across logout and a detour through another email (DESIGN §3), any case.
        let d = login_email(&paths, "Dev@Example.com").unwrap();
        assert_eq!(d.user_id, a.user_id);
    }

    #[test]
    fn readable_or_malformed_files_are_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("identity.toml");
        std::fs::write(&path, "email = \"a@b.co\"\nuser_id = \"u_1\"\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains(&format!("chmod 600 {}", path.display())), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(read(&path).unwrap().unwrap().user_id, "u_1");
        std::fs::write(&path, "email = \"a@b.co\"\nuser_id = \"u_1\"\nnmae = 1\n").unwrap();
        let err = read(&path).unwrap_err().to_string();
        assert!(err.contains(":3:1: unknown field `nmae`"), "{err}");
    }
}
