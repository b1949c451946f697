//! Console sign-in primitives (docs/console.md, "Signing in"): session ids and their cookie,
//! CSRF tokens, cookie parsing, argon2id passwords and the password rule, and the judgment of
//! a stored session (idle and absolute expiry, logout, role change, token revocation).
//!
//! Everything here is pure (time comes in as an argument) except the random source and the
//! argon2 work; the routes that use it are in [`super`].

use crate::review::Micros;
use crate::review::store::ConsoleSessionRow;
use argon2::Argon2;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use sha2::{Digest, Sha256};
use std::time::Duration;
use zeroize::Zeroizing;

/// The session cookie's name; the `__Host-` prefix makes browsers refuse it unless it is
/// `Secure`, has `Path=/` and no `Domain`, so no other site or subdomain can plant it.
pub const SESSION_COOKIE: &str = "__Host-airlock_session";
/// The pre-session CSRF cookie (double submit) of the sign-in and invite forms.
pub const CSRF_COOKIE: &str = "__Host-airlock_csrf";
/// Shortest password accepted, in characters.
pub const MIN_PASSWORD_CHARS: usize = 12;
/// Longest password accepted, in bytes (argon2 takes any length; this bounds the work).
pub const MAX_PASSWORD_BYTES: usize = 1024;
/// Default idle expiry (`--console-idle-timeout`).
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Default absolute expiry (`--console-max-age`).
pub const MAX_AGE: Duration = Duration::from_secs(12 * 60 * 60);
/// How long an invite link stays usable.
pub const INVITE_LIFETIME: Duration = Duration::from_secs(7 * 24 * 60 * 60);

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("the OS random source failed: {0}")]
    Random(String),
    #[error("cannot hash the password: {0}")]
    Hash(String),
}

/// A fresh 256-bit secret (a session id, an invite token, a CSRF value) as 64 hex digits.
pub fn new_secret() -> Result<Zeroizing<String>, AuthError> {
    let mut b = Zeroizing::new([0u8; 32]);
    getrandom::fill(b.as_mut()).map_err(|e| AuthError::Random(e.to_string()))?;
    Ok(Zeroizing::new(hex::encode(b.as_ref())))
}

/// Whether `s` has the shape [`new_secret`] makes (so nothing else reaches the store).
pub fn is_secret(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The SHA-256 a secret is stored as.
pub fn secret_hash(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// The CSRF token of a signed-in session: derived from the session id, so it needs no
/// storage, and the store (which holds only the id's SHA-256) cannot derive it.
pub fn session_csrf(session_id: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"airlock-console-csrf\0");
    h.update(session_id.as_bytes());
    hex::encode(h.finalize())
}

/// Compares two strings in time independent of where they differ.
pub fn ct_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The `Set-Cookie` value that starts a session: exactly these attributes.
pub fn session_cookie(session_id: &str) -> String {
    format!("{SESSION_COOKIE}={session_id}; Secure; Path=/; HttpOnly; SameSite=Strict")
}

/// The `Set-Cookie` value that removes the session cookie.
pub fn clear_session_cookie() -> String {
    format!("{SESSION_COOKIE}=; Secure; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

/// The `Set-Cookie` value of the pre-session CSRF cookie.
pub fn csrf_cookie(value: &str) -> String {
    format!("{CSRF_COOKIE}={value}; Secure; Path=/; HttpOnly; SameSite=Strict")
}

/// The value of cookie `name` in the request's `Cookie` header values (RFC 6265 §5.4:
/// `name=value` pairs separated by `; `); the first occurrence wins.
pub fn cookie_value<'a>(headers: impl IntoIterator<Item = &'a str>, name: &str) -> Option<&'a str> {
    headers
        .into_iter()
        .flat_map(|h| h.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().trim_matches('"'))
}

/// Checks a new password against the rule: at least [`MIN_PASSWORD_CHARS`] characters, at
/// most [`MAX_PASSWORD_BYTES`] bytes, no NUL. The message says what to change.
pub fn check_new_password(pw: &str) -> Result<(), String> {
    if pw.is_empty() {
        return Err("the password is empty; give one of at least 12 characters".into());
    }
    let n = pw.chars().count();
    if n < MIN_PASSWORD_CHARS {
        return Err(format!(
            "the password is too short ({n} characters); give one of at least \
             {MIN_PASSWORD_CHARS} characters"
        ));
    }
    if pw.len() > MAX_PASSWORD_BYTES {
        return Err(format!("the password is longer than {MAX_PASSWORD_BYTES} bytes; shorten it"));
    }
    if pw.contains('\0') {
        return Err("the password contains a NUL character; remove it".into());
    }
    Ok(())
}

/// Hashes a password to an argon2id PHC string (default parameters, a random salt).
pub fn hash_password(pw: &str) -> Result<String, AuthError> {
    Argon2::default()
        .hash_password(pw.as_bytes())
        .map(|h| h.to_string())
        .map_err(|e| AuthError::Hash(e.to_string()))
}

/// A PHC string that matches no password the form can send (made once, with a random
/// password): verified against when an email has no user or no password, so the answer
/// takes as long as a real check and does not tell which emails exist.
fn dummy_phc() -> Option<&'static str> {
    static DUMMY: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    DUMMY.get_or_init(|| new_secret().ok().and_then(|pw| hash_password(&pw).ok())).as_deref()
}

/// Whether `pw` matches `phc`; `None` verifies against a dummy and is always false.
pub fn verify_password(pw: &str, phc: Option<&str>) -> bool {
    let target: Option<&str> = match phc {
        Some(p) => Some(p),
        None => dummy_phc(),
    };
    let Some(target) = target else { return false };
    let ok = Argon2::default().verify_password(pw.as_bytes(), target).is_ok();
    ok && phc.is_some()
}

/// Session lifetimes (`--console-idle-timeout`, `--console-max-age`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    pub idle: Duration,
    pub max_age: Duration,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self { idle: IDLE_TIMEOUT, max_age: MAX_AGE }
    }
}

impl SessionLimits {
    /// How stale the latest "seen" mark may get before a request appends a new one: a
    /// quarter of the idle timeout, at most a minute (so a session ends between
    /// `idle - granularity` and `idle` after its last request, and a busy one writes a row a
    /// minute at most).
    pub fn touch_granularity(&self) -> Duration {
        (self.idle / 4).min(Duration::from_secs(60))
    }
}

/// Why a stored session no longer signs anyone in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    LoggedOut,
    Idle,
    MaxAge,
    RoleChanged,
    /// A token of the user was revoked, or their password changed, since sign-in.
    AuthEpoch,
}

fn micros(d: Duration) -> Micros {
    Micros::try_from(d.as_micros()).unwrap_or(Micros::MAX)
}

/// Whether `row` still signs its user in at `now`.
pub fn judge(row: &ConsoleSessionRow, now: Micros, limits: SessionLimits) -> Result<(), Ended> {
    if row.ended {
        return Err(Ended::LoggedOut);
    }
    if now.saturating_sub(row.created_at) >= micros(limits.max_age) {
        return Err(Ended::MaxAge);
    }
    if now.saturating_sub(row.last_seen) >= micros(limits.idle) {
        return Err(Ended::Idle);
    }
    if row.role_at_login != row.user.role {
        return Err(Ended::RoleChanged);
    }
    if row.epoch_at_login != row.epoch_now {
        return Err(Ended::AuthEpoch);
    }
    Ok(())
}

/// Whether a request at `now` should append a "seen" mark to `row`.
pub fn touch_due(row: &ConsoleSessionRow, now: Micros, limits: SessionLimits) -> bool {
    now.saturating_sub(row.last_seen) >= micros(limits.touch_granularity())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::review::{Role, User};

    #[test]
    fn secrets_are_256_bit_hex_and_distinct() {
        let (a, b) = (new_secret().unwrap(), new_secret().unwrap());
        assert_ne!(*a, *b);
        assert!(is_secret(&a) && is_secret(&b));
        assert!(!is_secret(&a[..63]) && !is_secret(&a.to_uppercase()) && !is_secret(""));
        assert!(!is_secret(&format!("{}g", &a[..63])));
        assert_eq!(secret_hash(&a), secret_hash(&a));
        assert_ne!(secret_hash(&a), secret_hash(&b));
    }

    #[test]
    fn session_csrf_is_derived_and_not_the_stored_hash() {
        let id = new_secret().unwrap();
        let csrf = session_csrf(&id);
        assert_eq!(csrf, session_csrf(&id));
        assert!(is_secret(&csrf));
        assert_ne!(csrf, hex::encode(secret_hash(&id)));
        assert_ne!(csrf, session_csrf(&new_secret().unwrap()));
        assert!(ct_eq(&csrf, &session_csrf(&id)));
        assert!(!ct_eq(&csrf, &csrf[..63]) && !ct_eq(&csrf, ""));
    }

    #[test]
    fn cookies_have_exactly_the_attributes() {
        assert_eq!(
            session_cookie("abc"),
            "__Host-airlock_session=abc; Secure; Path=/; HttpOnly; SameSite=Strict"
        );
        assert!(clear_session_cookie().ends_with("; Max-Age=0"));
        assert!(csrf_cookie("x").starts_with("__Host-airlock_csrf=x; Secure; Path=/;"));
    }

    #[test]
    fn cookie_headers_are_parsed() {
        let h = ["a=1; __Host-airlock_session=s1 ;b=2", "__Host-airlock_session=s2"];
        assert_eq!(cookie_value(h, SESSION_COOKIE), Some("s1"));
        assert_eq!(cookie_value(["b=2"], SESSION_COOKIE), None);
        assert_eq!(cookie_value(["x", ""], "x"), None);
        assert_eq!(cookie_value(["c=\"q\""], "c"), Some("q"));
        // A name that only ends like ours is someone else's.
        assert_eq!(cookie_value(["evil__Host-airlock_session=x"], SESSION_COOKIE), None);
        assert_eq!(cookie_value(["__Host-airlock_csrf=v=w"], CSRF_COOKIE), Some("v=w"));
    }

    #[test]
    fn password_rule() {
        assert!(check_new_password("").unwrap_err().contains("empty"));
        assert!(check_new_password("short").unwrap_err().contains("at least 12"));
        assert!(check_new_password("ééééééééééé").is_err()); // 11 characters, 22 bytes
        assert!(check_new_password("éééééééééééé").is_ok());
        assert!(check_new_password(&"x".repeat(1025)).unwrap_err().contains("longer"));
        assert!(check_new_password("correct horse\0battery").unwrap_err().contains("NUL"));
    }

    #[test]
    fn passwords_hash_to_argon2id_and_verify() {
        let phc = hash_password("correct horse battery").unwrap();
        assert!(phc.starts_with("$argon2id$v=19$"), "{phc}");
        assert!(verify_password("correct horse battery", Some(&phc)));
        assert!(!verify_password("correct horse batterz", Some(&phc)));
        assert!(!verify_password("anything", None));
        assert!(!verify_password("x", Some("not a phc string")));
        assert_ne!(phc, hash_password("correct horse battery").unwrap(), "salted");
    }

    fn row() -> ConsoleSessionRow {
        ConsoleSessionRow {
            user: User { id: "u".into(), email: "u@example.test".into(), role: Role::Reviewer },
            role_at_login: Role::Reviewer,
            epoch_at_login: 2,
            epoch_now: 2,
            created_at: 1_000_000,
            last_seen: 1_000_000,
            ended: false,
        }
    }

    #[test]
    fn sessions_end_by_every_rule() {
        let l = SessionLimits { idle: Duration::from_secs(10), max_age: Duration::from_secs(100) };
        let s = 1_000_000;
        assert_eq!(judge(&row(), 1_000_000 + 9 * s, l), Ok(()));
        assert_eq!(judge(&row(), 1_000_000 + 10 * s, l), Err(Ended::Idle));
        let seen = ConsoleSessionRow { last_seen: 1_000_000 + 95 * s, ..row() };
        assert_eq!(judge(&seen, 1_000_000 + 99 * s, l), Ok(()));
        assert_eq!(judge(&seen, 1_000_000 + 100 * s, l), Err(Ended::MaxAge));
        assert_eq!(judge(&ConsoleSessionRow { ended: true, ..row() }, s, l), Err(Ended::LoggedOut));
        let demoted =
            ConsoleSessionRow { user: User { role: Role::Member, ..row().user }, ..row() };
        assert_eq!(judge(&demoted, s, l), Err(Ended::RoleChanged));
        assert_eq!(
            judge(&ConsoleSessionRow { epoch_now: 3, ..row() }, s, l),
            Err(Ended::AuthEpoch)
        );
    }

    #[test]
    fn seen_marks_are_coarse() {
        let l = SessionLimits { idle: Duration::from_secs(1800), max_age: MAX_AGE };
        assert_eq!(l.touch_granularity(), Duration::from_secs(60));
        assert!(!touch_due(&row(), 1_000_000 + 59_000_000, l));
        assert!(touch_due(&row(), 1_000_000 + 60_000_000, l));
        let short = SessionLimits { idle: Duration::from_secs(2), max_age: MAX_AGE };
        assert_eq!(short.touch_granularity(), Duration::from_millis(500));
    }
}
