//! `airlock policy check --resolve TARGET`: after the policy's decision, resolve the name on the
//! host once and run every answer through the same address guard the proxy runs
//! ([`crate::proxy::guard::judge_answers`] → `Policy::check_answer_port`, with the host's own
//! addresses), so "check says allow, the proxy says `private_address`" shows up here with the
//! answer that caused it. Exit 1 if any answer is refused, 4 if the name does not resolve.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::env::Env;
use crate::policy::{Decision, Host, LocalAddrs, Policy};
use crate::proxy::Resolver;

/// Exit code of `policy check --resolve` when the name does not resolve on the host.
pub const EXIT_RESOLVE_FAILED: i32 = 4;

/// How long the host's resolver may take (the proxy's default DNS timeout).
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(10);

/// One answer and the guard's verdict, as `--json` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AnswerJson {
    pub addr: String,
    /// `allow` or `deny`.
    pub verdict: &'static str,
    /// `allowed`, or the refusal code (`private_address`, `blocked_address`, `review_plane`).
    pub reason: &'static str,
}

/// The answers of one resolution, judged; `Err` says why the name did not resolve.
pub fn resolve_and_judge(
    policy: &Policy,
    host: &Host,
    port: u16,
    env: &dyn Env,
) -> Result<Vec<AnswerJson>, String> {
    let ips: Vec<IpAddr> = match host {
        Host::Ip(ip) => vec![*ip],
        Host::Name(name) => resolve(name, env)?,
    };
    let local = crate::proxy::local_addrs();
    Ok(judge(policy, &ips, port, &local))
}

/// Each answer through the address guard, in the resolver's order.
pub fn judge(policy: &Policy, ips: &[IpAddr], port: u16, local: &LocalAddrs) -> Vec<AnswerJson> {
    ips.iter()
        .map(|ip| match policy.check_answer_port(*ip, port, local) {
            None => AnswerJson { addr: ip.to_string(), verdict: "allow", reason: "allowed" },
            Some(Decision { reason, .. }) => {
                AnswerJson { addr: ip.to_string(), verdict: "deny", reason: reason.as_str() }
            }
        })
        .collect()
}

fn resolver(env: &dyn Env) -> Result<Arc<dyn Resolver>, String> {
    #[cfg(feature = "test-hooks")]
    if let Some(file) = env.var("AIRLOCK_TEST_RESOLVER") {
        // Loud on purpose, like the daemon's: a test hook decides what names mean.
        eprintln!("airlock: WARNING: TEST RESOLVER IN FORCE ({file}); test-hooks build");
        let path = std::path::PathBuf::from(&file);
        let r = crate::proxy::resolver::FileResolver::load(&path, None)
            .map_err(|e| format!("AIRLOCK_TEST_RESOLVER={file}: {e}"))?;
        return Ok(Arc::new(r));
    }
    let _ = env;
    Ok(Arc::new(crate::proxy::SystemResolver))
}

fn resolve(name: &str, env: &dyn Env) -> Result<Vec<IpAddr>, String> {
    let resolver = resolver(env)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the resolver: {e}"))?;
    let answers =
        rt.block_on(async { tokio::time::timeout(RESOLVE_TIMEOUT, resolver.resolve(name)).await });
    match answers {
        Ok(Ok(a)) if !a.is_empty() => Ok(a),
        Ok(Ok(_)) => Err(format!("{name} has no addresses")),
        Ok(Err(e)) => Err(format!("cannot resolve {name} on this host: {e}")),
        Err(_) => Err(format!("resolving {name} took longer than {}s", RESOLVE_TIMEOUT.as_secs())),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::policy::{Entry, EntryKind, LayerKind, PolicyLayer};

    #[test]
    fn every_answer_gets_the_proxy_guards_verdict() {
        let mut layer = PolicyLayer::new(LayerKind::User, "config.toml");
        layer.allow = vec![Entry::parse("a.test", EntryKind::Allow).unwrap()];
        layer.block = vec![Entry::parse("127.0.0.9/32", EntryKind::Block).unwrap()];
        layer.allow_private = vec!["127.0.0.2/32".parse().unwrap()];
        let (policy, _) = Policy::build(vec![layer], Vec::new()).unwrap();
        let ips: Vec<IpAddr> =
            ["127.0.0.2", "127.0.0.3", "127.0.0.9"].iter().map(|s| s.parse().unwrap()).collect();
        let got = judge(&policy, &ips, 443, &LocalAddrs::default());
        let want = [
            ("127.0.0.2", "allow", "allowed"),
            ("127.0.0.3", "deny", "private_address"),
            ("127.0.0.9", "deny", "blocked_address"),
        ];
        let got: Vec<_> = got.iter().map(|a| (a.addr.as_str(), a.verdict, a.reason)).collect();
        assert_eq!(got, want);
    }
}
