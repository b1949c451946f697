//! This machine's signing key, `~/.airlock/keys/machine.key` (0600 in a 0700 directory): an
//! Ed25519 signed-note key (docs/evidence.md) that airlockd signs each session's
//! `audit_root` with and `airlock publish` cosigns the review log's checkpoints with. Made on
//! first use by whichever side needs it first; a race between the two keeps the first file
//! (the second links its copy in with `link(2)`, which never replaces).

use super::fsutil::{PrivateReadError, create_private_new, private_dir, read_private};
use crate::paths::Paths;
use crate::tlog::note::{NoteError, NoteSigner};
use std::path::PathBuf;

/// The key file's name under [`Paths::keys_dir`].
pub const FILE: &str = "machine.key";

#[derive(Debug, thiserror::Error)]
pub enum MachineKeyError {
    #[error(
        "cannot read the machine key {path}: {err}; fix its mode (0600, yours) or move it away to make a new one"
    )]
    Read { path: PathBuf, err: PrivateReadError },
    #[error("the machine key {path} is not a signer key: {err}; move it away to make a new one")]
    Parse { path: PathBuf, err: NoteError },
    #[error("cannot create the machine key {path}: {err}")]
    Create { path: PathBuf, err: std::io::Error },
    #[error("cannot make a key: {0}")]
    Generate(NoteError),
}

/// The key file's path.
pub fn path(paths: &Paths) -> PathBuf {
    paths.keys_dir().join(FILE)
}

/// This host's name reduced to what a signed-note key name may hold (ASCII letters, digits,
/// `.`, `-`, `_`; at most 64), empty when it has none: the readable part of key names.
pub fn host_label() -> String {
    let host =
        nix::unistd::gethostname().ok().and_then(|h| h.into_string().ok()).unwrap_or_default();
    host.chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'))
        .take(64)
        .collect()
}

/// The machine key if it exists.
pub fn load(paths: &Paths) -> Result<Option<NoteSigner>, MachineKeyError> {
    let path = path(paths);
    let bytes = match read_private(&path) {
        Ok(Some(b)) => zeroize::Zeroizing::new(b),
        Ok(None) => return Ok(None),
        Err(err) => return Err(MachineKeyError::Read { path, err }),
    };
    let text = String::from_utf8_lossy(&bytes);
    NoteSigner::parse(&text).map(Some).map_err(|err| MachineKeyError::Parse { path, err })
}

/// The key name a new machine key gets: `airlock-machine/<host>-<8 hex>`, the host name
/// reduced to characters a key name may hold, the random part keeping two machines of the
/// same name apart.
fn new_name() -> String {
    let host = host_label();
    let mut rnd = [0u8; 4];
    // A failed draw leaves zeros: the name only needs to be distinct in practice; the key id
    // (from the public key) is what verifiers match on.
    let _ = getrandom::fill(&mut rnd);
    let host = if host.is_empty() { "host".to_string() } else { host };
    format!("airlock-machine/{host}-{}", hex::encode(rnd))
}

/// The machine key, made now if there is none.
pub fn load_or_create(paths: &Paths) -> Result<NoteSigner, MachineKeyError> {
    if let Some(k) = load(paths)? {
        return Ok(k);
    }
    let path = path(paths);
    let create = |err| MachineKeyError::Create { path: path.clone(), err };
    let signer = NoteSigner::generate(&new_name()).map_err(MachineKeyError::Generate)?;
    let dir = paths.keys_dir();
    private_dir(&dir).map_err(create)?;
    let mut text = signer.to_private_string();
    text.push('\n');
    let written = create_private_new(&path, text.as_bytes());
    match written {
        Ok(()) => Ok(signer),
        // Another process made it first: use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            load(paths)?.ok_or_else(|| create(e))
        }
        Err(e) => Err(create(e)),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn made_once_private_and_reloaded() {
        let dir = tempfile::tempdir().unwrap();
        let paths = Paths::with_home(dir.path().to_path_buf());
        assert!(load(&paths).unwrap().is_none());
        let k = load_or_create(&paths).unwrap();
        assert!(k.name().starts_with("airlock-machine/"));
        let again = load_or_create(&paths).unwrap();
        assert_eq!(again.verifier(), k.verifier());
        let meta = std::fs::metadata(path(&paths)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        let dmeta = std::fs::metadata(paths.keys_dir()).unwrap();
        assert_eq!(dmeta.permissions().mode() & 0o777, 0o700);
        // A key others can read is refused, not used.
        std::fs::set_permissions(path(&paths), std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(load(&paths), Err(MachineKeyError::Read { .. })));
    }
}
