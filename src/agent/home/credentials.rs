//! Credential copy-in before a session and copy-back after it (SECURITY §4–5): the shared
//! store's credential into the home (merged with the home's own fields), and a refreshed one back
//! (only the format's own fields, re-serialized). Credential bytes and parsed JSON stay in
//! zeroized buffers throughout.

use std::ffi::OsStr;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use sha2::{Digest, Sha256};
use zeroize::{Zeroize, Zeroizing};

use super::beneath::{mkdir_open, open_dir, open_dir_path, read_capped, write_replace};
use super::{AgentHome, CREDENTIAL_CAP, HomeError, SHARED_DIR, dir_err};
use crate::agent::{Credential, CredentialFormat};

/// What copy-in left in the home: per credential rel path, the sha256 of the bytes written, or
/// of what the home already held when the shared store had nothing (`None`: no credential).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyIn {
    pub copied: Vec<(String, Option<[u8; 32]>)>,
}

/// What copy-back took into the shared store, and what it refused (rel path, why).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyBack {
    pub copied: Vec<String>,
    pub skipped: Vec<(String, String)>,
}

impl AgentHome {
    /// Copies each credential the shared store has into the home (replacing whatever is at its
    /// path, including a planted symlink, which the rename replaces rather than follows).
    pub fn copy_in(&self) -> Result<CopyIn, HomeError> {
        let shared_path = self.shared_path();
        let shared = match open_dir(self.agent_dir.as_fd(), OsStr::new(SHARED_DIR)) {
            Ok(fd) => Some(fd),
            Err(Errno::ENOENT) => None,
            Err(e) => return Err(dir_err("open directory", &shared_path, e)),
        };
        let mut out = CopyIn::default();
        for cred in self.layout.credentials {
            let name = shared_name(cred)?;
            let bytes = match &shared {
                None => None,
                Some(dir) => {
                    read_capped(dir.as_fd(), &shared_path, name, CREDENTIAL_CAP)?.map(|(b, _)| b)
                }
            };
            let Some(bytes) = bytes else {
                // Nothing shared (never signed in, or signed out by deleting it): remember what
                // the home already holds, so copy-back promotes only a credential this session
                // wrote, never a stale copy a sign-out meant to retire.
                let held = self.read_home_credential(cred).ok().flatten().map(|b| sha256(&b));
                out.copied.push((cred.rel.into(), held));
                continue;
            };
            if !parses_as(cred.format, &bytes) {
                return Err(HomeError::BadCredential {
                    path: shared_path.join(name),
                    what: format_name(cred.format),
                });
            }
            // The shared fields replace the home's; the rest of the home's file (Claude's
            // per-repo MCP OAuth tokens, say) stays, as it would if nothing were shared.
            let held = self.read_home_credential(cred).ok().flatten();
            let bytes = merge_shared(cred.format, held.as_ref().map(|h| h.as_slice()), &bytes);
            let (parent, parent_path, file) = self
                .credential_parent(cred, true)?
                .ok_or_else(|| HomeError::BadName { name: cred.rel.into() })?;
            write_replace(parent.as_fd(), &parent_path, file, &bytes)?;
            out.copied.push((cred.rel.into(), Some(sha256(&bytes))));
        }
        Ok(out)
    }

    /// The directory holding a credential in the home, its path, and the file name. `None` if
    /// a directory on the way is missing (and `create` is false).
    fn credential_parent<'c>(
        &self,
        cred: &'c Credential,
        create: bool,
    ) -> Result<Option<(OwnedFd, PathBuf, &'c OsStr)>, HomeError> {
        let rel = Path::new(cred.rel);
        let file = shared_name(cred)?;
        let parent = rel.parent().unwrap_or(Path::new(""));
        Ok(open_dir_path(self.home.as_fd(), &self.path, parent, create)?
            .map(|fd| (fd, self.path.join(parent), file)))
    }

    /// Reads one credential from the home for copy-back: `None` if absent.
    fn read_home_credential(&self, cred: &Credential) -> Result<Option<Secret>, HomeError> {
        let Some((dir, dir_path, file)) = self.credential_parent(cred, false)? else {
            return Ok(None);
        };
        let Some((bytes, st)) = read_capped(dir.as_fd(), &dir_path, file, CREDENTIAL_CAP)? else {
            return Ok(None);
        };
        // A file hard-linked from elsewhere is not one the agent wrote by the usual rename.
        if st.st_nlink != 1 {
            return Err(HomeError::HardLinked { path: dir_path.join(file), links: st.st_nlink });
        }
        Ok(Some(bytes))
    }

    /// After the session: takes each credential the agent refreshed (changed since copy-in and
    /// parsing as its format) into the shared store. Never writes any other file there.
    pub fn copy_back(&self, copied_in: &CopyIn) -> CopyBack {
        let mut out = CopyBack::default();
        for cred in self.layout.credentials {
            let before =
                copied_in.copied.iter().find(|(rel, _)| rel == cred.rel).and_then(|(_, h)| *h);
            let bytes = match self.read_home_credential(cred) {
                Ok(Some(bytes)) => bytes,
                Ok(None) => continue,
                Err(e) => {
                    out.skipped.push((cred.rel.into(), e.to_string()));
                    continue;
                }
            };
            if before == Some(sha256(&bytes)) {
                continue;
            }
            // Only the credential's own fields cross to other repos, re-serialized: anything
            // else the agent put in the file stays in this repo's home.
            let Some(bytes) = credential_only(cred.format, &bytes) else {
                let e = HomeError::BadCredential {
                    path: self.path.join(cred.rel),
                    what: format_name(cred.format),
                };
                out.skipped.push((cred.rel.into(), e.to_string()));
                continue;
            };
            match self.write_shared(cred, &bytes) {
                Ok(()) => out.copied.push(cred.rel.into()),
                Err(e) => out.skipped.push((cred.rel.into(), e.to_string())),
            }
        }
        out
    }

    fn write_shared(&self, cred: &Credential, bytes: &[u8]) -> Result<(), HomeError> {
        let shared_path = self.shared_path();
        let dir = mkdir_open(self.agent_dir.as_fd(), &shared_path, OsStr::new(SHARED_DIR))?;
        write_replace(dir.as_fd(), &shared_path, shared_name(cred)?, bytes)
    }
}

/// Bytes of a credential file, zeroized when dropped.
pub(super) type Secret = Zeroizing<Vec<u8>>;

/// A parsed credential file: its strings (the tokens) are zeroized when it is dropped, as are
/// the values replaced or removed through [`SecretJson::set`].
struct SecretJson(serde_json::Value);

impl SecretJson {
    /// Parses `bytes` as a JSON object.
    fn object(bytes: &[u8]) -> Option<Self> {
        match serde_json::from_slice::<serde_json::Value>(bytes) {
            Ok(v @ serde_json::Value::Object(_)) => Some(Self(v)),
            Ok(mut other) => {
                wipe(&mut other);
                None
            }
            Err(_) => None,
        }
    }

    fn map(&self) -> &serde_json::Map<String, serde_json::Value> {
        static EMPTY: std::sync::OnceLock<serde_json::Map<String, serde_json::Value>> =
            std::sync::OnceLock::new();
        self.0.as_object().unwrap_or_else(|| EMPTY.get_or_init(serde_json::Map::new))
    }

    /// Sets (or with `None` removes) a top-level field, wiping the value it replaces.
    fn set(&mut self, field: &str, value: Option<serde_json::Value>) {
        let Some(map) = self.0.as_object_mut() else { return };
        let old = match value {
            Some(v) => map.insert(field.to_owned(), v),
            None => map.remove(field),
        };
        if let Some(mut old) = old {
            wipe(&mut old);
        }
    }

    /// Serialized into a buffer that never grows past `cap` bytes (so no copy of the secret is
    /// left behind by a reallocation); `None` if it does not fit.
    fn to_bytes(&self, cap: usize) -> Option<Zeroizing<Vec<u8>>> {
        let mut out = Zeroizing::new(Vec::with_capacity(cap));
        serde_json::to_writer(FixedBuf(&mut out), &self.0).ok()?;
        Some(out)
    }
}

impl Drop for SecretJson {
    fn drop(&mut self) {
        wipe(&mut self.0);
    }
}

/// Zeroizes every string in `v` (object keys are field names, not secrets).
fn wipe(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::String(s) => s.zeroize(),
        serde_json::Value::Array(items) => items.iter_mut().for_each(wipe),
        serde_json::Value::Object(map) => map.values_mut().for_each(wipe),
        _ => {}
    }
}

/// A writer into a `Vec` that fails rather than reallocate.
struct FixedBuf<'a>(&'a mut Vec<u8>);

impl Write for FixedBuf<'_> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        if self.0.len() + bytes.len() > self.0.capacity() {
            return Err(io::Error::other("credential larger than its buffer"));
        }
        self.0.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// True if `top` has the shape of `format` (see [`CredentialFormat`]).
fn has_shape(format: CredentialFormat, top: &serde_json::Map<String, serde_json::Value>) -> bool {
    match format {
        CredentialFormat::ClaudeOauth => top
            .get("claudeAiOauth")
            .and_then(|o| o.as_object())
            .and_then(|o| o.get("accessToken"))
            .is_some_and(|t| t.is_string()),
        CredentialFormat::CodexAuth => {
            top.get("OPENAI_API_KEY").is_some_and(|k| k.is_string())
                || top.get("tokens").is_some_and(|t| t.is_object())
        }
    }
}

/// True if `bytes` parse as `format` (see [`CredentialFormat`]).
pub fn parses_as(format: CredentialFormat, bytes: &[u8]) -> bool {
    SecretJson::object(bytes).is_some_and(|json| has_shape(format, json.map()))
}

/// Largest credential taken back to the shared store after re-serialization: far above a real
/// token set, small enough that the file is no bulk channel between repos.
pub const SHARED_CREDENTIAL_CAP: usize = 16 << 10;

/// The credential's known fields of `bytes`, re-serialized: Claude's `claudeAiOauth` object
/// (scalar and scalar-array members only), Codex's `OPENAI_API_KEY`, `tokens` (scalar members)
/// and `last_refresh`. `None` if it does not parse as `format` or the result exceeds
/// [`SHARED_CREDENTIAL_CAP`].
pub fn credential_only(format: CredentialFormat, bytes: &[u8]) -> Option<Zeroizing<Vec<u8>>> {
    use serde_json::{Map, Value};
    let parsed = SecretJson::object(bytes)?;
    let top = parsed.map();
    if !has_shape(format, top) {
        return None;
    }
    let scalar = |v: &Value| !matches!(v, Value::Object(_) | Value::Array(_));
    // Only the fields the format defines cross to other repos' homes: anything else an agent
    // adds would be a channel from one repo's session to another's.
    let flat = |v: &Value, arrays: bool, known: &[&str]| -> Option<Value> {
        let obj = v.as_object()?;
        let kept: Map<String, Value> = obj
            .iter()
            .filter(|(k, _)| known.contains(&k.as_str()))
            .filter(|(_, v)| {
                scalar(v) || (arrays && v.as_array().is_some_and(|a| a.iter().all(scalar)))
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Some(Value::Object(kept))
    };
    // The copies are wiped with `out`.
    let mut out = SecretJson(Value::Object(Map::new()));
    match format {
        CredentialFormat::ClaudeOauth => {
            const CLAUDE: &[&str] = &[
                "accessToken",
                "refreshToken",
                "expiresAt",
                "scopes",
                "subscriptionType",
                "rateLimitTier",
            ];
            out.set("claudeAiOauth", Some(flat(top.get("claudeAiOauth")?, true, CLAUDE)?));
        }
        CredentialFormat::CodexAuth => {
            for key in ["OPENAI_API_KEY", "last_refresh"] {
                if let Some(v) = top.get(key).filter(|v| scalar(v)) {
                    out.set(key, Some(v.clone()));
                }
            }
            const CODEX: &[&str] = &["id_token", "access_token", "refresh_token", "account_id"];
            if let Some(tokens) = top.get("tokens").and_then(|t| flat(t, false, CODEX)) {
                out.set("tokens", Some(tokens));
            }
        }
    }
    has_shape(format, out.map()).then(|| out.to_bytes(SHARED_CREDENTIAL_CAP)).flatten()
}

/// The top-level fields of a credential file that are shared across repos.
fn shared_fields(format: CredentialFormat) -> &'static [&'static str] {
    match format {
        CredentialFormat::ClaudeOauth => &["claudeAiOauth"],
        CredentialFormat::CodexAuth => &["OPENAI_API_KEY", "tokens", "last_refresh"],
    }
}

/// The home's credential file (`held`, when it is a JSON object) with its shared fields
/// replaced by `shared`'s; just `shared` otherwise.
fn merge_shared(
    format: CredentialFormat,
    held: Option<&[u8]>,
    shared: &[u8],
) -> Zeroizing<Vec<u8>> {
    let as_is = || Zeroizing::new(shared.to_vec());
    let (Some(mut merged), Some(shared_json)) =
        (held.and_then(SecretJson::object), SecretJson::object(shared))
    else {
        return as_is();
    };
    for field in shared_fields(format) {
        merged.set(field, shared_json.map().get(*field).cloned());
    }
    // Re-serializing never more than doubles the inputs (escapes are kept minimal).
    let room = 2 * (held.map_or(0, <[u8]>::len) + shared.len()) + 64;
    merged.to_bytes(room).unwrap_or_else(as_is)
}

pub(super) fn format_name(format: CredentialFormat) -> &'static str {
    match format {
        CredentialFormat::ClaudeOauth => {
            "a Claude Code credential (JSON with `claudeAiOauth.accessToken`)"
        }
        CredentialFormat::CodexAuth => {
            "a Codex credential (JSON with `OPENAI_API_KEY` or `tokens`)"
        }
    }
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The file name a credential has in the shared store: its own file name (the store is flat).
fn shared_name(cred: &Credential) -> Result<&OsStr, HomeError> {
    match Path::new(cred.rel).components().next_back() {
        Some(Component::Normal(name)) => Ok(name),
        _ => Err(HomeError::BadName { name: cred.rel.into() }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::super::test_support::*;
    use super::*;
    use crate::agent::Agent;
    use nix::sys::stat::Mode;
    use std::ffi::OsString;
    use std::fs;
    use std::os::unix::fs::symlink;

    #[test]
    fn copy_in_copies_shared_credential() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED);
        let home = fx.open();
        let got = home.copy_in().unwrap();
        assert_eq!(got.copied, vec![(CRED_REL.to_string(), Some(sha256(CLAUDE_CRED.as_bytes())))]);
        let dst = home.path().join(CRED_REL);
        assert_eq!(fs::read_to_string(&dst).unwrap(), CLAUDE_CRED);
        assert_eq!(mode(&dst), 0o600);
        // No temp file left behind.
        let names: Vec<_> = fs::read_dir(home.path().join(".claude")).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn copy_in_replaces_planted_symlink_without_writing_through_it() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED);
        let target = fx.outside().join("id_rsa");
        fs::write(&target, "PRIVATE KEY").unwrap();
        let home = fx.open();
        let dst = home.path().join(CRED_REL);
        symlink(&target, &dst).unwrap();
        home.copy_in().unwrap();
        assert_eq!(fs::read_to_string(&target).unwrap(), "PRIVATE KEY");
        assert!(fs::symlink_metadata(&dst).unwrap().file_type().is_file());
        assert_eq!(fs::read_to_string(&dst).unwrap(), CLAUDE_CRED);
    }

    #[test]
    fn copy_in_without_shared_records_none() {
        let fx = Fixture::new();
        let home = fx.open();
        let got = home.copy_in().unwrap();
        assert_eq!(got.copied, vec![(CRED_REL.to_string(), None)]);
        assert!(!home.path().join(CRED_REL).exists());
        // Custom agents have no credentials.
        let custom = Agent::Custom { name: "tool".into() };
        let h = AgentHome::open(&fx.root(), &custom, "repo-1").unwrap();
        assert_eq!(h.copy_in().unwrap(), CopyIn::default());
    }

    #[test]
    fn copy_in_refuses_bad_shared_and_dir_in_the_way() {
        let fx = Fixture::new();
        fx.put_shared("not json");
        let home = fx.open();
        let err = home.copy_in().unwrap_err();
        assert!(matches!(err, HomeError::BadCredential { .. }), "{err}");
        assert!(err.to_string().contains("shared/.credentials.json"), "{err}");
        assert!(err.to_string().contains("remove it"), "{err}");

        fx.put_shared(CLAUDE_CRED);
        fs::create_dir(home.path().join(CRED_REL)).unwrap();
        let err = home.copy_in().unwrap_err();
        assert!(matches!(err, HomeError::DirInTheWay { .. }), "{err}");
        let names: Vec<_> = fs::read_dir(home.path().join(".claude")).unwrap().collect();
        assert_eq!(names.len(), 1, "temp file removed");

        // A symlinked shared file is refused too.
        let target = fx.outside().join("t.json");
        fs::write(&target, CLAUDE_CRED).unwrap();
        fs::remove_file(fx.shared().join(".credentials.json")).unwrap();
        symlink(&target, fx.shared().join(".credentials.json")).unwrap();
        assert!(matches!(home.copy_in().unwrap_err(), HomeError::Symlink { .. }));
    }

    #[test]
    fn copy_back_updates_shared_when_refreshed() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED);
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        fs::write(home.path().join(CRED_REL), CLAUDE_CRED2).unwrap();
        let back = home.copy_back(&copied);
        assert_eq!(back, CopyBack { copied: vec![CRED_REL.into()], skipped: vec![] });
        assert_eq!(json(&fx.shared_cred().unwrap()), json(CLAUDE_CRED2));
        assert_eq!(mode(&fx.shared().join(".credentials.json")), 0o600);
    }

    #[test]
    fn copy_back_creates_shared_after_first_login() {
        let fx = Fixture::new();
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        fs::write(home.path().join(CRED_REL), CLAUDE_CRED).unwrap();
        let back = home.copy_back(&copied);
        assert_eq!(back.copied, vec![CRED_REL.to_string()]);
        assert_eq!(mode(&fx.shared()), 0o700);
        assert_eq!(json(&fx.shared_cred().unwrap()), json(CLAUDE_CRED));
    }

    /// Copy-back re-serializes, so compare values, not bytes.
    fn json(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn parsed_credentials_are_wiped_and_serialized_without_regrowing() {
        let mut v = json(r#"{"a":"token","b":["t2",{"c":"t3"}],"n":1}"#);
        wipe(&mut v);
        assert_eq!(v, json(r#"{"a":"","b":["",{"c":""}],"n":1}"#));
        // A replaced value is wiped as it leaves.
        let mut parsed = SecretJson::object(br#"{"a":"old"}"#).unwrap();
        parsed.set("a", Some(serde_json::Value::String("new".into())));
        assert_eq!(parsed.map()["a"], "new");
        // The output buffer never reallocates: too small is None, not a bigger copy.
        assert!(parsed.to_bytes(4).is_none());
        let out = parsed.to_bytes(64).unwrap();
        assert_eq!(out.as_slice(), br#"{"a":"new"}"#);
        assert!(out.capacity() >= 64);
    }

    #[test]
    fn only_the_credentials_own_fields_cross_to_other_repos() {
        use CredentialFormat::*;
        let planted = br#"{"claudeAiOauth":{"accessToken":"a","scopes":["x"],"nested":{"k":"v"},"leak":"A-TRANSCRIPT"},"mcpServers":{"evil":{}},"note":"A-TRANSCRIPT"}"#;
        let kept = credential_only(ClaudeOauth, planted).unwrap();
        assert_eq!(kept.as_slice(), br#"{"claudeAiOauth":{"accessToken":"a","scopes":["x"]}}"#);
        let codex = br#"{"OPENAI_API_KEY":null,"tokens":{"access_token":"t","deep":{"x":1},"leak":"z"},"last_refresh":"2026","x":"y"}"#;
        let kept = credential_only(CodexAuth, codex).unwrap();
        assert_eq!(
            kept.as_slice(),
            br#"{"OPENAI_API_KEY":null,"last_refresh":"2026","tokens":{"access_token":"t"}}"#
        );
        let huge = format!(r#"{{"claudeAiOauth":{{"accessToken":"{}"}}}}"#, "x".repeat(20_000));
        assert!(credential_only(ClaudeOauth, huge.as_bytes()).is_none());
        assert!(credential_only(ClaudeOauth, b"{}").is_none());
    }

    #[test]
    fn copy_in_keeps_the_homes_own_fields() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED2);
        let home = fx.open();
        let dst = home.path().join(CRED_REL);
        fs::write(&dst, r#"{"claudeAiOauth":{"accessToken":"old"},"mcpOAuth":{"srv":"t"}}"#)
            .unwrap();
        home.copy_in().unwrap();
        let v = json(&fs::read_to_string(&dst).unwrap());
        assert_eq!(v["claudeAiOauth"], json(CLAUDE_CRED2)["claudeAiOauth"]);
        assert_eq!(v["mcpOAuth"]["srv"], "t", "per-repo fields survive: {v}");
        // And they never reach the shared store.
        let copied = home.copy_in().unwrap();
        fs::write(&dst, r#"{"claudeAiOauth":{"accessToken":"new"},"mcpOAuth":{"srv":"t2"}}"#)
            .unwrap();
        home.copy_back(&copied);
        assert!(!fx.shared_cred().unwrap().contains("mcpOAuth"));
    }

    #[test]
    fn a_stale_home_credential_is_not_promoted_after_a_sign_out() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED);
        let home = fx.open();
        home.copy_in().unwrap();
        // The user signs out everywhere by deleting the shared copy; the home still holds one.
        fs::remove_file(fx.shared().join(".credentials.json")).unwrap();
        let copied = home.copy_in().unwrap();
        assert_eq!(home.copy_back(&copied), CopyBack::default());
        assert!(fx.shared_cred().is_none(), "the retired credential came back");
    }

    #[test]
    fn copy_back_unchanged_is_not_listed() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED);
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        assert_eq!(home.copy_back(&copied), CopyBack::default());
        // Missing: nothing either.
        fs::remove_file(home.path().join(CRED_REL)).unwrap();
        assert_eq!(home.copy_back(&copied), CopyBack::default());
        assert_eq!(fx.shared_cred().unwrap(), CLAUDE_CRED);
    }

    fn assert_skipped(back: &CopyBack, needle: &str) {
        assert!(back.copied.is_empty(), "{back:?}");
        assert_eq!(back.skipped.len(), 1, "{back:?}");
        assert_eq!(back.skipped[0].0, CRED_REL);
        assert!(back.skipped[0].1.contains(needle), "{back:?}");
    }

    #[test]
    fn copy_back_skips_symlink_to_outside_file() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED);
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        let target = fx.outside().join("creds.json");
        fs::write(&target, CLAUDE_CRED2).unwrap();
        fs::remove_file(home.path().join(CRED_REL)).unwrap();
        symlink(&target, home.path().join(CRED_REL)).unwrap();
        assert_skipped(&home.copy_back(&copied), "is a symlink");
        assert_eq!(fx.shared_cred().unwrap(), CLAUDE_CRED);
    }

    #[test]
    fn copy_back_skips_symlinked_credential_dir() {
        let fx = Fixture::new();
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        let outside = fx.outside();
        fs::write(outside.join(".credentials.json"), CLAUDE_CRED2).unwrap();
        fs::remove_dir(home.path().join(".claude")).unwrap();
        symlink(&outside, home.path().join(".claude")).unwrap();
        assert_skipped(&home.copy_back(&copied), ".claude is a symlink");
        assert!(fx.shared_cred().is_none());
    }

    #[test]
    fn copy_back_skips_fifo_without_hanging() {
        let fx = Fixture::new();
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        nix::unistd::mkfifo(&home.path().join(CRED_REL), Mode::from_bits_truncate(0o600)).unwrap();
        let back = within(move || home.copy_back(&copied));
        assert_skipped(&back, "not a regular file");
        assert!(fx.shared_cred().is_none());
    }

    #[test]
    fn copy_back_skips_oversize_unparsable_and_hard_linked() {
        let fx = Fixture::new();
        fx.put_shared(CLAUDE_CRED);
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        let dst = home.path().join(CRED_REL);

        let mut big = CLAUDE_CRED2.as_bytes().to_vec();
        big.resize(CREDENTIAL_CAP as usize + 1, b' ');
        assert!(parses_as(CredentialFormat::ClaudeOauth, &big));
        fs::write(&dst, &big).unwrap();
        assert_skipped(&home.copy_back(&copied), "larger than");

        fs::write(&dst, r#"{"claudeAiOauth":{}}"#).unwrap();
        assert_skipped(&home.copy_back(&copied), "does not parse");

        fs::write(&dst, CLAUDE_CRED2).unwrap();
        let other = fx.outside().join("other");
        fs::hard_link(&dst, &other).unwrap();
        assert_skipped(&home.copy_back(&copied), "hard links");

        assert_eq!(fx.shared_cred().unwrap(), CLAUDE_CRED);
    }

    #[test]
    fn copy_back_never_creates_other_files_in_shared() {
        let fx = Fixture::new();
        let home = fx.open();
        let copied = home.copy_in().unwrap();
        for name in ["settings.json", "auth.json", ".credentials.json.bak", "evil"] {
            fs::write(home.path().join(".claude").join(name), CLAUDE_CRED2).unwrap();
        }
        fs::write(home.path().join(CRED_REL), CLAUDE_CRED2).unwrap();
        home.copy_back(&copied);
        let names: Vec<_> =
            fs::read_dir(fx.shared()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![OsString::from(".credentials.json")]);
    }

    #[test]
    fn codex_round_trip() {
        let fx = Fixture::new();
        let home = AgentHome::open(&fx.root(), &Agent::Codex, "r").unwrap();
        let copied = home.copy_in().unwrap();
        assert_eq!(copied.copied, vec![(".codex/auth.json".to_string(), None)]);
        fs::write(home.path().join(".codex/auth.json"), r#"{"OPENAI_API_KEY":"k"}"#).unwrap();
        assert_eq!(home.copy_back(&copied).copied, vec![".codex/auth.json".to_string()]);
        let shared = fx.root().join("codex/shared/auth.json");
        assert_eq!(fs::read_to_string(shared).unwrap(), r#"{"OPENAI_API_KEY":"k"}"#);
    }

    #[test]
    fn parses_as_claude_and_codex_shapes() {
        use CredentialFormat::{ClaudeOauth, CodexAuth};
        assert!(parses_as(ClaudeOauth, CLAUDE_CRED.as_bytes()));
        assert!(parses_as(ClaudeOauth, br#"{"claudeAiOauth":{"accessToken":"x"},"other":1}"#));
        for bad in [
            &b""[..],
            b"null",
            b"[]",
            b"{}",
            br#"{"claudeAiOauth":"x"}"#,
            br#"{"claudeAiOauth":{"accessToken":1}}"#,
            br#"{"claudeAiOauth":{"refreshToken":"y"}}"#,
            br#"{"OPENAI_API_KEY":"k"}"#,
            b"-----BEGIN OPENSSH PRIVATE KEY-----",
        ] {
            assert!(!parses_as(ClaudeOauth, bad), "{}", String::from_utf8_lossy(bad));
        }
        assert!(parses_as(CodexAuth, br#"{"OPENAI_API_KEY":"k"}"#));
        assert!(parses_as(
            CodexAuth,
            br#"{"OPENAI_API_KEY":null,"tokens":{"id_token":"a","access_token":"b"},"x":1}"#
        ));
        for bad in [
            &b"{}"[..],
            br#"{"OPENAI_API_KEY":null}"#,
            br#"{"OPENAI_API_KEY":5}"#,
            br#"{"tokens":"x"}"#,
            br#"["OPENAI_API_KEY"]"#,
            CLAUDE_CRED.as_bytes(),
        ] {
            assert!(!parses_as(CodexAuth, bad), "{}", String::from_utf8_lossy(bad));
        }
    }
}
