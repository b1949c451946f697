//! Names of the engine objects a session makes: per repo, the network `airlock-net-<key8>`
//! (the product page's `airlock-net`, keyed so two repos never share a network and two
//! checkouts with the same name never collide); per session, the proxy container
//! `airlock-proxy-<name>-<key8>-<session8>` and the sandbox container
//! `airlock-sandbox-<name>-<key8>-<session8>`. `<key8>` is the first 8 hex digits of the
//! checkout's repo key digest ([`crate::audit::logdir::path_digest`]), as in the log directory.

use crate::repo::Repo;

/// Repo names are sanitized to `a-z 0-9 _ . -` ([`crate::repo::sanitize_name`]); engines
/// accept those after a leading alphanumeric, which our prefixes supply. Long names are cut so
/// the whole name stays well inside every engine's limit.
const NAME_PART: usize = 40;

/// The 8 hex digits that key a checkout.
pub fn key8(repo: &Repo) -> String {
    crate::audit::logdir::path_digest(&repo.path)[..8].to_owned()
}

/// The repo's internal network.
pub fn network(repo: &Repo) -> String {
    format!("airlock-net-{}", key8(repo))
}

/// The Linux bridge device of the repo's Docker network (`com.docker.network.bridge.name`):
/// named, so the host-side drop rule can name it (`airlockd bridge-guard`). 15 bytes at most
/// (IFNAMSIZ).
pub fn bridge(repo: &Repo) -> String {
    format!("{BRIDGE_PREFIX}{}", key8(repo))
}

/// The bridge of the network named `network`, when it is a repo network's name.
pub fn bridge_of_network(network: &str) -> Option<String> {
    let key8 = network.strip_prefix("airlock-net-")?;
    (key8.len() == 8 && key8.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| format!("{BRIDGE_PREFIX}{key8}"))
}

const BRIDGE_PREFIX: &str = "alk-";

/// This session's proxy container.
pub fn proxy(repo: &Repo, session: &str) -> String {
    format!("airlock-proxy-{}-{}-{}", short_name(repo), key8(repo), session8(session))
}

/// This session's sandbox container.
pub fn sandbox(repo: &Repo, session: &str) -> String {
    format!("airlock-sandbox-{}-{}-{}", short_name(repo), key8(repo), session8(session))
}

/// The host name the sandbox reaches its proxy by (`--add-host`).
pub const PROXY_HOST: &str = "airlock-proxy";

/// The proxy's port on the internal network (the product page's contract).
pub const PROXY_PORT: u16 = 8888;

fn short_name(repo: &Repo) -> &str {
    // Names are ASCII, so any byte index is a char boundary.
    &repo.name[..repo.name.len().min(NAME_PART)]
}

fn session8(session: &str) -> &str {
    let end = session.len().min(8);
    session.get(..end).unwrap_or(session)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn repo(name: &str, path: &str) -> Repo {
        Repo { name: name.into(), path: PathBuf::from(path) }
    }

    #[test]
    fn same_named_checkouts_get_their_own_network_and_names() {
        let a = repo("app", "/home/u/work/app");
        let b = repo("app", "/home/u/other/app");
        assert_ne!(network(&a), network(&b));
        assert!(network(&a).starts_with("airlock-net-") && network(&a).len() == 20);
        let s = "0123456789abcdef0123456789abcdef";
        assert_eq!(proxy(&a, s), format!("airlock-proxy-app-{}-01234567", key8(&a)));
        assert_eq!(sandbox(&a, s), format!("airlock-sandbox-app-{}-01234567", key8(&a)));
        assert_ne!(proxy(&a, s), proxy(&b, s));
        assert_eq!(bridge(&a), format!("alk-{}", key8(&a)));
        assert!(crate::sys::bridge_guard::check_name(&bridge(&a)).is_ok(), "a device name");
        assert_eq!(bridge_of_network(&network(&a)), Some(bridge(&a)));
    }

    #[test]
    fn only_a_repo_network_name_has_a_bridge_name() {
        for other in ["bridge", "airlock-net-", "airlock-net-0123456", "airlock-net-0123456z"] {
            assert_eq!(bridge_of_network(other), None, "{other}");
        }
    }

    #[test]
    fn names_are_valid_engine_names_whatever_the_repo_name() {
        let valid = |n: &str| {
            n.len() <= 128
                && n.chars().next().unwrap().is_ascii_alphanumeric()
                && n.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        };
        for name in ["-", "..x", "_a", &"x".repeat(200), "a.b-c_d"] {
            let r = repo(name, "/r");
            for n in [network(&r), proxy(&r, "ff"), sandbox(&r, "0123456789")] {
                assert!(valid(&n), "{n}");
            }
        }
    }
}
