//! C2SP signed notes (`signed-note`), checkpoints (`tlog-checkpoint`) and cosignatures
//! (`tlog-cosignature`, `cosignature/v1`), with Ed25519 keys in the signed-note key
//! encodings:
//!
//! - verifier key: `<name>+<8 hex key id>+<base64(type || public key)>`;
//! - signer key: `PRIVATE+KEY+<name>+<8 hex key id>+<base64(type || seed)>`;
//! - key id: the first 4 bytes of `SHA-256(name || "\n" || type || public key)`, type `0x01`
//!   (Ed25519 note signature) or `0x04` (`cosignature/v1`), so one Ed25519 key has a different
//!   id in each role.
//!
//! A note is UTF-8 text ending in a newline, a blank line, then signature lines
//! `— <name> <base64(key id || signature)>` (U+2014, space). Signatures from keys the reader
//! does not know are ignored, as the spec requires.

use super::merkle::Hash;
use super::{b64, hash_from_b64, sha256, unb64};
use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use zeroize::Zeroizing;

/// Signature type bytes (C2SP signed-note "Signature types").
pub const ALG_ED25519: u8 = 0x01;
pub const ALG_COSIGNATURE_V1: u8 = 0x04;

/// The signature line prefix: EM DASH and a space.
const SIG_PREFIX: &str = "\u{2014} ";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    #[error("key name {0:?} is not usable: it must be non-empty and hold no '+' or whitespace")]
    BadName(String),
    #[error("malformed key: {0}")]
    BadKey(String),
    #[error("malformed note: {0}")]
    Malformed(String),
    #[error("the note has no signature by {0}")]
    NotSigned(String),
    #[error("the signature by {0} does not verify")]
    BadSignature(String),
    #[error("malformed checkpoint: {0}")]
    BadCheckpoint(String),
    #[error("could not make a key: {0}")]
    Crypto(String),
}

fn check_name(name: &str) -> Result<(), NoteError> {
    if name.is_empty() || name.contains('+') || name.chars().any(|c| c.is_whitespace()) {
        return Err(NoteError::BadName(name.to_string()));
    }
    Ok(())
}

fn key_id(name: &str, alg: u8, public: &[u8]) -> [u8; 4] {
    let mut m = Vec::with_capacity(name.len() + 2 + public.len());
    m.extend_from_slice(name.as_bytes());
    m.push(b'\n');
    m.push(alg);
    m.extend_from_slice(public);
    let h = sha256(&m);
    [h[0], h[1], h[2], h[3]]
}

/// An Ed25519 signing key with its name. The seed is zeroized when dropped.
pub struct NoteSigner {
    name: String,
    seed: Zeroizing<[u8; 32]>,
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for NoteSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NoteSigner").field("name", &self.name).finish_non_exhaustive()
    }
}

impl NoteSigner {
    /// A new random key named `name`.
    pub fn generate(name: &str) -> Result<Self, NoteError> {
        check_name(name)?;
        let mut seed = Zeroizing::new([0u8; 32]);
        getrandom::fill(&mut seed[..]).map_err(|e| NoteError::Crypto(e.to_string()))?;
        Self::from_seed(name, seed)
    }

    fn from_seed(name: &str, seed: Zeroizing<[u8; 32]>) -> Result<Self, NoteError> {
        check_name(name)?;
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed[..])
            .map_err(|e| NoteError::Crypto(e.to_string()))?;
        Ok(Self { name: name.to_string(), seed, pair })
    }

    /// Parses `PRIVATE+KEY+<name>+<id>+<base64(0x01 || seed)>` (surrounding whitespace is
    /// ignored, so a key file may end in a newline).
    pub fn parse(text: &str) -> Result<Self, NoteError> {
        let text = text.trim();
        let rest = text
            .strip_prefix("PRIVATE+KEY+")
            .ok_or_else(|| NoteError::BadKey("a signer key starts with PRIVATE+KEY+".into()))?;
        // The name holds no '+' and the id none, but base64 may: split from the left.
        let mut parts = rest.splitn(3, '+');
        let (Some(name), Some(id), Some(data)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(NoteError::BadKey("expected PRIVATE+KEY+<name>+<id>+<key>".into()));
        };
        let raw = Zeroizing::new(
            unb64(data).ok_or_else(|| NoteError::BadKey("the key is not base64".into()))?,
        );
        if raw.len() != 33 || raw[0] != ALG_ED25519 {
            return Err(NoteError::BadKey("not an Ed25519 signer key".into()));
        }
        let mut seed = Zeroizing::new([0u8; 32]);
        seed.copy_from_slice(&raw[1..]);
        let signer = Self::from_seed(name, seed)?;
        if hex::encode(signer.key_id()) != id.to_ascii_lowercase() {
            return Err(NoteError::BadKey(format!("key id {id} does not match the key")));
        }
        Ok(signer)
    }

    /// The signer key's text form (a secret: write it 0600).
    pub fn to_private_string(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(Vec::with_capacity(33));
        raw.push(ALG_ED25519);
        raw.extend_from_slice(&self.seed[..]);
        Zeroizing::new(format!(
            "PRIVATE+KEY+{}+{}+{}",
            self.name,
            hex::encode(self.key_id()),
            b64(&raw)
        ))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn public(&self) -> [u8; 32] {
        let mut p = [0u8; 32];
        p.copy_from_slice(self.pair.public_key().as_ref());
        p
    }

    /// The note-signature key id (type 0x01).
    pub fn key_id(&self) -> [u8; 4] {
        key_id(&self.name, ALG_ED25519, &self.public())
    }

    /// The verifier for this key's note signatures.
    pub fn verifier(&self) -> NoteVerifier {
        NoteVerifier::new(&self.name, ALG_ED25519, self.public())
    }

    /// The verifier for this key's `cosignature/v1` signatures.
    pub fn cosigner_verifier(&self) -> NoteVerifier {
        NoteVerifier::new(&self.name, ALG_COSIGNATURE_V1, self.public())
    }

    /// Signs `text` (a note's text: ends in a newline) and returns the whole signed note.
    pub fn sign_note(&self, text: &str) -> Result<String, NoteError> {
        check_text(text)?;
        let sig = self.pair.sign(text.as_bytes());
        let mut blob = self.key_id().to_vec();
        blob.extend_from_slice(sig.as_ref());
        Ok(format!("{text}\n{SIG_PREFIX}{} {}\n", self.name, b64(&blob)))
    }

    /// A `cosignature/v1` signature line over a checkpoint's `body` at `time` (Unix seconds).
    pub fn cosign(&self, body: &str, time: u64) -> Result<String, NoteError> {
        check_text(body)?;
        let msg = cosigned_message(body, time);
        let sig = self.pair.sign(msg.as_bytes());
        let mut blob = key_id(&self.name, ALG_COSIGNATURE_V1, &self.public()).to_vec();
        blob.extend_from_slice(&time.to_be_bytes());
        blob.extend_from_slice(sig.as_ref());
        Ok(format!("{SIG_PREFIX}{} {}\n", self.name, b64(&blob)))
    }
}

fn cosigned_message(body: &str, time: u64) -> String {
    format!("cosignature/v1\ntime {time}\n{body}")
}

/// A public key that checks one kind of signature ([`ALG_ED25519`] note signatures or
/// [`ALG_COSIGNATURE_V1`] cosignatures).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoteVerifier {
    pub name: String,
    pub alg: u8,
    pub public: [u8; 32],
    pub key_id: [u8; 4],
}

impl NoteVerifier {
    pub fn new(name: &str, alg: u8, public: [u8; 32]) -> Self {
        Self { name: name.to_string(), alg, public, key_id: key_id(name, alg, &public) }
    }

    /// Parses `<name>+<id>+<base64(type || key)>`.
    pub fn parse(text: &str) -> Result<Self, NoteError> {
        let text = text.trim();
        let mut parts = text.splitn(3, '+');
        let (Some(name), Some(id), Some(data)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(NoteError::BadKey("expected <name>+<key id>+<base64 key>".into()));
        };
        check_name(name)?;
        let raw = unb64(data).ok_or_else(|| NoteError::BadKey("the key is not base64".into()))?;
        if raw.len() != 33 || !matches!(raw[0], ALG_ED25519 | ALG_COSIGNATURE_V1) {
            return Err(NoteError::BadKey(
                "not an Ed25519 (0x01) or cosignature/v1 (0x04) key".into(),
            ));
        }
        let mut public = [0u8; 32];
        public.copy_from_slice(&raw[1..]);
        let v = Self::new(name, raw[0], public);
        if hex::encode(v.key_id) != id.to_ascii_lowercase() {
            return Err(NoteError::BadKey(format!("key id {id} does not match the key")));
        }
        Ok(v)
    }

    fn matches(&self, sig: &SigLine) -> bool {
        sig.name == self.name && sig.blob.len() >= 4 && sig.blob[..4] == self.key_id
    }
}

impl std::fmt::Display for NoteVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut raw = vec![self.alg];
        raw.extend_from_slice(&self.public);
        write!(f, "{}+{}+{}", self.name, hex::encode(self.key_id), b64(&raw))
    }
}

/// One signature line of a note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SigLine {
    pub name: String,
    /// Key id, then the signature (and for cosignatures, the timestamp before it).
    pub blob: Vec<u8>,
}

impl SigLine {
    pub fn to_line(&self) -> String {
        format!("{SIG_PREFIX}{} {}\n", self.name, b64(&self.blob))
    }
}

/// A note split into its text and signature lines (nothing verified yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub text: String,
    pub sigs: Vec<SigLine>,
}

fn check_text(text: &str) -> Result<(), NoteError> {
    if !text.ends_with('\n') {
        return Err(NoteError::Malformed("the text does not end with a newline".into()));
    }
    if text.chars().any(|c| c.is_control() && c != '\n') {
        return Err(NoteError::Malformed("the text holds a control character".into()));
    }
    if text.contains("\n\n") || text.starts_with('\n') {
        return Err(NoteError::Malformed("the text holds an empty line".into()));
    }
    Ok(())
}

/// Parses a single signature line (with or without its trailing newline).
pub fn parse_sig_line(line: &str) -> Result<SigLine, NoteError> {
    let line = line.strip_suffix('\n').unwrap_or(line);
    let rest = line.strip_prefix(SIG_PREFIX).ok_or_else(|| {
        NoteError::Malformed("a signature line starts with \u{2014} and a space".into())
    })?;
    let (name, data) = rest
        .split_once(' ')
        .ok_or_else(|| NoteError::Malformed("a signature line is `\u{2014} name sig`".into()))?;
    check_name(name)?;
    let blob = unb64(data)
        .filter(|b| b.len() >= 5)
        .ok_or_else(|| NoteError::Malformed(format!("signature by {name} is not base64")))?;
    Ok(SigLine { name: name.to_string(), blob })
}

impl Note {
    /// Splits a signed note at its last blank line.
    pub fn parse(note: &str) -> Result<Self, NoteError> {
        if note.len() > 1 << 20 {
            return Err(NoteError::Malformed("the note is larger than 1 MiB".into()));
        }
        let at = note
            .rfind("\n\n")
            .ok_or_else(|| NoteError::Malformed("no blank line before the signatures".into()))?;
        let text = &note[..at + 1];
        check_text(text)?;
        let sigs_text = &note[at + 2..];
        if !sigs_text.ends_with('\n') {
            return Err(NoteError::Malformed("the signatures do not end with a newline".into()));
        }
        let sigs = sigs_text.lines().map(parse_sig_line).collect::<Result<Vec<_>, _>>()?;
        if sigs.is_empty() {
            return Err(NoteError::Malformed("no signature lines".into()));
        }
        Ok(Self { text: text.to_string(), sigs })
    }

    /// Checks the note signature of `key` (type 0x01).
    pub fn verify(&self, key: &NoteVerifier) -> Result<(), NoteError> {
        let sig = self
            .sigs
            .iter()
            .find(|s| key.alg == ALG_ED25519 && key.matches(s))
            .ok_or_else(|| NoteError::NotSigned(key.name.clone()))?;
        UnparsedPublicKey::new(&ED25519, &key.public)
            .verify(self.text.as_bytes(), &sig.blob[4..])
            .map_err(|_| NoteError::BadSignature(key.name.clone()))
    }

    /// Checks `key`'s `cosignature/v1` over this note's text; returns its timestamp.
    pub fn verify_cosignature(&self, key: &NoteVerifier) -> Result<u64, NoteError> {
        let sig = self
            .sigs
            .iter()
            .find(|s| key.alg == ALG_COSIGNATURE_V1 && key.matches(s))
            .ok_or_else(|| NoteError::NotSigned(key.name.clone()))?;
        verify_cosignature_line(&self.text, sig, key)
    }

    /// The whole note again, text and signature lines.
    pub fn to_text(&self) -> String {
        let mut out = self.text.clone();
        out.push('\n');
        self.sigs.iter().for_each(|s| out.push_str(&s.to_line()));
        out
    }
}

/// Checks one cosignature line over `body`; returns its timestamp.
pub fn verify_cosignature_line(
    body: &str,
    sig: &SigLine,
    key: &NoteVerifier,
) -> Result<u64, NoteError> {
    if key.alg != ALG_COSIGNATURE_V1 || !key.matches(sig) || sig.blob.len() != 4 + 8 + 64 {
        return Err(NoteError::BadSignature(key.name.clone()));
    }
    let mut t = [0u8; 8];
    t.copy_from_slice(&sig.blob[4..12]);
    let time = u64::from_be_bytes(t);
    UnparsedPublicKey::new(&ED25519, &key.public)
        .verify(cosigned_message(body, time).as_bytes(), &sig.blob[12..])
        .map_err(|_| NoteError::BadSignature(key.name.clone()))?;
    Ok(time)
}

/// A C2SP checkpoint: origin, tree size, root hash and extension lines. Airlock writes one
/// extension, `time <Unix seconds>` (when the log signed it), so a replayed old checkpoint of
/// the same size is told apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub origin: String,
    pub size: u64,
    pub root: Hash,
    pub extensions: Vec<String>,
}

impl Checkpoint {
    /// The note text (body) of this checkpoint.
    pub fn body(&self) -> String {
        let mut out = format!("{}\n{}\n{}\n", self.origin, self.size, b64(&self.root));
        for e in &self.extensions {
            out.push_str(e);
            out.push('\n');
        }
        out
    }

    /// Parses a checkpoint body.
    pub fn parse(body: &str) -> Result<Self, NoteError> {
        let bad = |m: &str| NoteError::BadCheckpoint(m.to_string());
        check_text(body)?;
        let mut lines = body.lines();
        let origin = lines.next().filter(|o| !o.is_empty()).ok_or_else(|| bad("no origin"))?;
        let size_text = lines.next().ok_or_else(|| bad("no tree size"))?;
        if size_text.is_empty()
            || !size_text.bytes().all(|b| b.is_ascii_digit())
            || (size_text.len() > 1 && size_text.starts_with('0'))
        {
            return Err(bad("the tree size is not a decimal number without leading zeros"));
        }
        let size = size_text.parse().map_err(|_| bad("the tree size is out of range"))?;
        let root = lines
            .next()
            .and_then(hash_from_b64)
            .ok_or_else(|| bad("the root hash is not 32 bytes of base64"))?;
        let extensions = lines.map(str::to_string).collect();
        Ok(Self { origin: origin.to_string(), size, root, extensions })
    }

    /// The `time` extension, if present.
    pub fn time(&self) -> Option<u64> {
        self.extensions.iter().find_map(|e| e.strip_prefix("time ")?.parse().ok())
    }
}

/// A checkpoint from a signed note, verified with the log's `key`; the origin must be the
/// key's name.
pub fn open_checkpoint(note: &str, key: &NoteVerifier) -> Result<(Checkpoint, Note), NoteError> {
    let n = Note::parse(note)?;
    n.verify(key)?;
    let c = Checkpoint::parse(&n.text)?;
    if c.origin != key.name {
        return Err(NoteError::BadCheckpoint(format!(
            "origin {:?} is not the log key's name {:?}",
            c.origin, key.name
        )));
    }
    Ok((c, n))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn signer_and_verifier_keys_roundtrip() {
        let s = NoteSigner::generate("review.example/log").unwrap();
        let text = s.to_private_string();
        assert!(text.starts_with("PRIVATE+KEY+review.example/log+"));
        let again = NoteSigner::parse(&format!("{}\n", &*text)).unwrap();
        assert_eq!(again.verifier(), s.verifier());
        let v = NoteVerifier::parse(&s.verifier().to_string()).unwrap();
        assert_eq!(v, s.verifier());
        assert_ne!(s.verifier().key_id, s.cosigner_verifier().key_id);
        assert!(NoteSigner::generate("has space").is_err());
        assert!(NoteSigner::generate("a+b").is_err());
        // A key id that does not match is refused.
        let vt = s.verifier().to_string();
        let parts: Vec<&str> = vt.splitn(3, '+').collect();
        let forged = format!("{}+00000000+{}", parts[0], parts[2]);
        assert!(NoteVerifier::parse(&forged).is_err());
    }

    #[test]
    fn the_c2sp_signed_note_vector_verifies() {
        // The example from C2SP signed-note ("PeterNeumann").
        let vkey = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";
        let note = "If you think cryptography is the answer to your problem,\n\
                    then you don't know what your problem is.\n\
                    \n\
                    \u{2014} PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n";
        let v = NoteVerifier::parse(vkey).unwrap();
        let n = Note::parse(note).unwrap();
        n.verify(&v).unwrap();
        let mut changed = n.clone();
        changed.text = changed.text.replace("answer", "Answer");
        assert_eq!(changed.verify(&v), Err(NoteError::BadSignature("PeterNeumann".into())));
    }

    #[test]
    fn checkpoints_sign_parse_and_cosign() {
        let log = NoteSigner::generate("airlock.test/log").unwrap();
        let cp = Checkpoint {
            origin: "airlock.test/log".into(),
            size: 42,
            root: sha256(b"r"),
            extensions: vec!["time 1700000000".into()],
        };
        let note = log.sign_note(&cp.body()).unwrap();
        let (back, n) = open_checkpoint(&note, &log.verifier()).unwrap();
        assert_eq!(back, cp);
        assert_eq!(back.time(), Some(1_700_000_000));
        // Another log's key does not open it.
        let other = NoteSigner::generate("airlock.test/log").unwrap();
        assert!(open_checkpoint(&note, &other.verifier()).is_err());
        // A witness cosigns; the line verifies over the body and binds the time.
        let w = NoteSigner::generate("alice@example.com/laptop").unwrap();
        let line = w.cosign(&n.text, 1_700_000_100).unwrap();
        let sig = parse_sig_line(&line).unwrap();
        assert_eq!(
            verify_cosignature_line(&n.text, &sig, &w.cosigner_verifier()).unwrap(),
            1_700_000_100
        );
        assert!(verify_cosignature_line(&n.text, &sig, &w.verifier()).is_err());
        let mut later = sig.clone();
        later.blob[11] ^= 1;
        assert!(verify_cosignature_line(&n.text, &later, &w.cosigner_verifier()).is_err());
        // The cosigned note carries both; each reader checks the key it knows.
        let mut both = n.clone();
        both.sigs.push(sig);
        let reparsed = Note::parse(&both.to_text()).unwrap();
        reparsed.verify(&log.verifier()).unwrap();
        assert_eq!(reparsed.verify_cosignature(&w.cosigner_verifier()).unwrap(), 1_700_000_100);
    }

    #[test]
    fn malformed_checkpoints_are_refused() {
        for body in [
            "o\n01\nAAAA\n",
            "o\n1\n\n",
            "o\n-1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
            "o\n1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=",
            "\n1\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
            "o\n99999999999999999999999\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n",
        ] {
            assert!(Checkpoint::parse(body).is_err(), "{body:?}");
        }
        assert!(Checkpoint::parse("o\n0\n47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n").is_ok());
    }

    proptest! {
        #[test]
        fn note_parsing_never_panics(s in "\\PC{0,200}") {
            let _ = Note::parse(&s);
            let _ = Checkpoint::parse(&s);
            let _ = NoteVerifier::parse(&s);
            let _ = NoteSigner::parse(&s);
        }
    }
}
