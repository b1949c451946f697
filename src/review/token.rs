//! API tokens: 32 random bytes shown once as `alk_<64 hex>`, stored only as their SHA-256.
//! The secret lives in a [`Zeroizing`] buffer and is never logged (its `Debug` is redacted).

use sha2::{Digest, Sha256};
use std::fmt;
use zeroize::Zeroizing;

/// Prefix that makes a leaked token recognizable to secret scanners.
pub const PREFIX: &str = "alk_";

/// A freshly generated token secret.
pub struct Token {
    secret: Zeroizing<String>,
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Errors making a token.
#[derive(Debug, thiserror::Error)]
#[error("cannot generate a token: the OS random source failed: {0}")]
pub struct TokenError(String);

impl Token {
    pub fn generate() -> Result<Self, TokenError> {
        let mut bytes = Zeroizing::new([0u8; 32]);
        getrandom::fill(bytes.as_mut()).map_err(|e| TokenError(e.to_string()))?;
        let mut s = Zeroizing::new(String::with_capacity(PREFIX.len() + 64));
        s.push_str(PREFIX);
        s.push_str(&hex::encode(bytes.as_ref()));
        Ok(Self { secret: s })
    }

    /// The secret, to print once.
    pub fn expose(&self) -> &str {
        &self.secret
    }

    pub fn hash(&self) -> [u8; 32] {
        hash(&self.secret)
    }
}

/// SHA-256 of a presented token.
pub fn hash(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_unique_prefixed_and_redacted() {
        let (Ok(a), Ok(b)) = (Token::generate(), Token::generate()) else {
            panic!("random source failed");
        };
        assert_ne!(a.expose(), b.expose());
        assert!(a.expose().starts_with(PREFIX));
        assert_eq!(a.expose().len(), 68);
        assert_eq!(format!("{a:?}"), "Token(<redacted>)");
        assert_eq!(a.hash(), hash(a.expose()));
    }
}
