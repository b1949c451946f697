//! The sandbox's environment (DESIGN §7): a minimal base, plus `[env] pass` and `[mcp.*]`
//! credentials from trusted layers — nothing else from the host.

use std::ffi::{OsStr, OsString};
use std::path::Path;

use crate::env::Env;

/// The proxy listener inside the sandbox.
pub const PROXY_URL: &str = "http://127.0.0.1:8888";
/// `PATH` inside the sandbox for `exec`.
pub const SANDBOX_PATH: &str = "/usr/local/bin:/usr/bin:/bin";
/// `HOME` inside the sandbox.
pub const SANDBOX_HOME: &str = "/home/agent";

/// Who the session runs for (identity file).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentityEnv {
    pub user_id: Option<String>,
    pub email: Option<String>,
}

/// What, besides the base, trusted configuration lets in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Extra {
    /// `[env] pass`: names copied from the host environment if set there.
    pub pass: Vec<String>,
    /// Variables already resolved by the configuration layer (`[env] pass` values and
    /// `[mcp.*]` credentials, see `config::sandbox_env`).
    pub vars: Vec<(String, String)>,
}

/// Names the base owns; `[env] pass` cannot override them.
pub const BASE_NAMES: &[&str] = &[
    "PATH",
    "HOME",
    "TERM",
    "LANG",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "NO_PROXY",
    "no_proxy",
    "AIRLOCK_REPO",
    "AIRLOCK_USER_ID",
    "AIRLOCK_USER_EMAIL",
];

/// Builds the environment, sorted by name, plus the names of `pass` entries that were ignored
/// because the base owns them.
pub fn build(
    host: &dyn Env,
    repo_sandbox: &Path,
    identity: &IdentityEnv,
    extra: &Extra,
) -> (Vec<(OsString, OsString)>, Vec<String>) {
    let mut env: Vec<(OsString, OsString)> = Vec::new();
    let mut set = |k: &str, v: &OsStr| {
        env.retain(|(name, _)| name != k);
        env.push((k.into(), v.to_owned()));
    };
    set("PATH", OsStr::new(SANDBOX_PATH));
    set("HOME", OsStr::new(SANDBOX_HOME));
    set("TERM", host.var_os("TERM").as_deref().unwrap_or(OsStr::new("dumb")));
    set("LANG", host.var_os("LANG").as_deref().unwrap_or(OsStr::new("C.UTF-8")));
    for k in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
        set(k, OsStr::new(PROXY_URL));
    }
    set("NO_PROXY", OsStr::new("localhost,127.0.0.1"));
    set("no_proxy", OsStr::new("localhost,127.0.0.1"));
    set("AIRLOCK_REPO", repo_sandbox.as_os_str());
    if let Some(id) = &identity.user_id {
        set("AIRLOCK_USER_ID", OsStr::new(id));
    }
    if let Some(email) = &identity.email {
        set("AIRLOCK_USER_EMAIL", OsStr::new(email));
    }
    let mut ignored = Vec::new();
    for name in &extra.pass {
        if BASE_NAMES.contains(&name.as_str()) {
            ignored.push(name.clone());
        } else if let Some(v) = host.var_os(name) {
            set(name, &v);
        }
    }
    for (name, value) in &extra.vars {
        if BASE_NAMES.contains(&name.as_str()) {
            ignored.push(name.clone());
        } else {
            set(name, OsStr::new(value));
        }
    }
    env.sort();
    (env, ignored)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::env::MapEnv;

    fn get<'a>(env: &'a [(OsString, OsString)], k: &str) -> Option<&'a OsStr> {
        env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_os_str())
    }

    #[test]
    fn base_only_unless_passed() {
        let host = MapEnv::new()
            .with("AWS_SECRET_ACCESS_KEY", "s3cr3t")
            .with("GITHUB_TOKEN", "ghp")
            .with("TERM", "xterm-256color")
            .with("PATH", "/root/bin:/usr/bin")
            .with("SSH_AUTH_SOCK", "/tmp/agent.sock");
        let id = IdentityEnv { user_id: Some("u-1".into()), email: Some("a@b.test".into()) };
        let extra = Extra {
            pass: vec!["GITHUB_TOKEN".into(), "PATH".into(), "UNSET".into()],
            vars: vec![],
        };
        let (env, ignored) = build(&host, Path::new("/pay"), &id, &extra);
        assert_eq!(get(&env, "PATH").unwrap(), SANDBOX_PATH);
        assert_eq!(get(&env, "HOME").unwrap(), "/home/agent");
        assert_eq!(get(&env, "TERM").unwrap(), "xterm-256color");
        assert_eq!(get(&env, "HTTPS_PROXY").unwrap(), PROXY_URL);
        assert_eq!(get(&env, "http_proxy").unwrap(), PROXY_URL);
        assert_eq!(get(&env, "NO_PROXY").unwrap(), "localhost,127.0.0.1");
        assert_eq!(get(&env, "AIRLOCK_REPO").unwrap(), "/pay");
        assert_eq!(get(&env, "AIRLOCK_USER_ID").unwrap(), "u-1");
        assert_eq!(get(&env, "AIRLOCK_USER_EMAIL").unwrap(), "a@b.test");
        assert_eq!(get(&env, "GITHUB_TOKEN").unwrap(), "ghp");
        assert!(get(&env, "AWS_SECRET_ACCESS_KEY").is_none());
        assert!(get(&env, "SSH_AUTH_SOCK").is_none());
        assert!(get(&env, "UNSET").is_none());
        assert_eq!(ignored, vec!["PATH".to_string()]);
        assert_eq!(env.len(), 14);
    }

    #[test]
    fn unattributed_runs_omit_identity_and_mcp_is_added() {
        let extra = Extra { pass: vec![], vars: vec![("MCP_TOKEN".into(), "t".into())] };
        let (env, _) = build(&MapEnv::new(), Path::new("/r"), &IdentityEnv::default(), &extra);
        assert!(get(&env, "AIRLOCK_USER_ID").is_none());
        assert!(get(&env, "AIRLOCK_USER_EMAIL").is_none());
        assert_eq!(get(&env, "MCP_TOKEN").unwrap(), "t");
        assert_eq!(get(&env, "TERM").unwrap(), "dumb");
    }
}
