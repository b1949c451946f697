//! Environment lookup behind a trait, so tests never mutate the process environment
//! (`std::env::set_var` is unsound once threads exist).

use std::collections::HashMap;
use std::ffi::{OsStr, OsString};

/// Read-only access to environment variables.
pub trait Env: Send + Sync {
    /// The variable's value, if set (may be non-UTF-8).
    fn var_os(&self, key: &str) -> Option<OsString>;

    /// The variable's value if set and valid UTF-8; an empty value counts as unset.
    fn var(&self, key: &str) -> Option<String> {
        self.var_os(key).and_then(|v| v.into_string().ok()).filter(|v| !v.is_empty())
    }
}

/// The real process environment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcessEnv;

impl Env for ProcessEnv {
    fn var_os(&self, key: &str) -> Option<OsString> {
        std::env::var_os(key)
    }
}

/// A fixed environment for tests and for code that must not see the caller's variables.
#[derive(Debug, Clone, Default)]
pub struct MapEnv(HashMap<String, OsString>);

impl MapEnv {
    pub fn new() -> Self {
        Self::default()
    }

    /// Builder-style insert.
    pub fn with(mut self, key: &str, value: impl AsRef<OsStr>) -> Self {
        self.0.insert(key.to_owned(), value.as_ref().to_owned());
        self
    }
}

impl Env for MapEnv {
    fn var_os(&self, key: &str) -> Option<OsString> {
        self.0.get(key).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_values_count_as_unset() {
        let env = MapEnv::new().with("A", "").with("B", "x");
        assert_eq!(env.var("A"), None);
        assert_eq!(env.var("B").as_deref(), Some("x"));
        assert_eq!(env.var("C"), None);
    }
}
