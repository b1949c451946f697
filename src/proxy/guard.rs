//! Glue between the proxy and the policy's address guard (SECURITY §3): resolve a name exactly
//! once, check **every** answer (any refused answer refuses the whole attempt), dial exactly the
//! checked addresses in order, and judge the ClientHello's SNI against the CONNECT target.
//!
//! It also owns the cap on host-side resolutions in flight ([`super::Limits::max_resolutions`]
//! per session, [`super::DaemonResolutions`] per process): an attempt past either waits for a
//! slot within its DNS timeout and is refused `dns_limit` if none comes free.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

use crate::policy::{Decision, Host, Reason, canonicalize_host};

use super::SessionProxy;
use super::tls_peek::Peek;

/// Why an allowed target could not be reached.
#[derive(Debug)]
pub enum Unreachable {
    /// An answer failed the address guard: the attempt is refused. `decision` is the first
    /// refused answer's; `answers` are the refused answers (at most
    /// [`crate::audit::MAX_REFUSED_ADDRS`]), for the line's `refused_addrs`.
    Refused { decision: Decision, answers: Vec<IpAddr> },
    /// Resolution failed (`timed_out`: the DNS timeout ran out).
    ResolveFailed { detail: String, timed_out: bool },
    /// No resolution slot (session's or process's) came free within the DNS timeout; the name
    /// was never resolved.
    DnsLimit { detail: String },
    /// No checked address accepted the connection.
    ConnectFailed { detail: String, timed_out: bool },
    /// A gated attempt was not approved (`gate_*`), or its gate could not be recorded
    /// (`audit_unavailable`) ([`super::gatehold`]); `rule`, `layer` and `policy` are the gate
    /// entry's.
    Gated {
        reason: Reason,
        detail: String,
        rule: String,
        layer: crate::policy::LayerKind,
        policy: String,
    },
}

impl Unreachable {
    pub fn reason(&self) -> Reason {
        match self {
            Self::Refused { decision, .. } => decision.reason,
            Self::ResolveFailed { .. } => Reason::ResolveFailed,
            Self::DnsLimit { .. } => Reason::DnsLimit,
            Self::ConnectFailed { .. } => Reason::ConnectFailed,
            Self::Gated { reason, .. } => *reason,
        }
    }
}

/// The addresses to dial for an allowed target, every one checked for a connection to `port`
/// (a block CIDR that names another port does not refuse the answer). An IP-literal target was
/// already decided in full by `Policy::decide`; a name is resolved once, here.
pub async fn resolve_checked(
    session: &SessionProxy,
    policy: &crate::policy::Policy,
    host: &Host,
    port: u16,
) -> Result<Vec<IpAddr>, Unreachable> {
    let name = match host {
        Host::Ip(ip) => return Ok(vec![*ip]),
        Host::Name(name) => name,
    };
    // One deadline for the wait for a slot and the resolution: the agent sees one bound.
    let deadline = tokio::time::Instant::now() + session.limits.dns_timeout;
    let Ok(Some(slots)) = tokio::time::timeout_at(deadline, resolution_slots(session)).await else {
        return Err(Unreachable::DnsLimit {
            detail: format!(
                "no name resolution slot came free within {}s (at most {} resolutions in flight \
                 per session and {} per daemon); {name} was not resolved",
                session.limits.dns_timeout.as_secs_f32(),
                session.limits.max_resolutions,
                session.limits.daemon_resolutions.capacity(),
            ),
        });
    };
    // Spawned, with the slots moved in, so they are held until the resolver itself returns and
    // not merely until this attempt gives up: getaddrinfo(3) cannot be cancelled, and a
    // timed-out lookup keeps its thread of the blocking pool until it returns. The cap counts
    // the threads really in use.
    let resolver = Arc::clone(&session.resolver);
    let owned = name.clone();
    let lookup = tokio::spawn(async move {
        let _slots = slots;
        resolver.resolve(&owned).await
    });
    let answers = match tokio::time::timeout_at(deadline, lookup).await {
        Ok(Ok(Ok(a))) if !a.is_empty() => a,
        Ok(Ok(Ok(_))) => {
            return Err(Unreachable::ResolveFailed {
                detail: format!("{name} has no addresses"),
                timed_out: false,
            });
        }
        Ok(Ok(Err(e))) => {
            return Err(Unreachable::ResolveFailed {
                detail: format!("cannot resolve {name}: {e}"),
                timed_out: false,
            });
        }
        Ok(Err(e)) => {
            return Err(Unreachable::ResolveFailed {
                detail: format!("cannot resolve {name}: the resolver task failed: {e}"),
                timed_out: false,
            });
        }
        Err(_) => {
            return Err(Unreachable::ResolveFailed {
                detail: format!(
                    "resolving {name} took longer than {}s",
                    session.limits.dns_timeout.as_secs_f32()
                ),
                timed_out: true,
            });
        }
    };
    let local = session.local();
    match judge_answers(policy, &answers, port, &local) {
        Some((decision, refused)) => Err(Unreachable::Refused { decision, answers: refused }),
        None => Ok(answers),
    }
}

/// The address guard over every answer of one resolution (any refused answer refuses the
/// whole attempt): `None` if all may be dialed, else the first refusal and the refused
/// answers (at most [`crate::audit::MAX_REFUSED_ADDRS`]). `airlock policy check --resolve`
/// runs the same checks answer by answer.
pub fn judge_answers(
    policy: &crate::policy::Policy,
    answers: &[IpAddr],
    port: u16,
    local: &crate::policy::LocalAddrs,
) -> Option<(Decision, Vec<IpAddr>)> {
    let mut first = None;
    let mut refused = Vec::new();
    for ip in answers {
        if let Some(refusal) = policy.check_answer_port(*ip, port, local) {
            first.get_or_insert(refusal);
            if refused.len() < crate::audit::MAX_REFUSED_ADDRS {
                refused.push(*ip);
            }
        }
    }
    first.map(|d| (d, refused))
}

/// A slot of the session's, then of the process's resolution cap (in that order, so one
/// session's waiters queue on its own semaphore and hold at most `max_resolutions` places in
/// the process-wide queue). `None` only if a semaphore was closed, which never happens.
async fn resolution_slots(
    session: &SessionProxy,
) -> Option<(OwnedSemaphorePermit, OwnedSemaphorePermit)> {
    let own = Arc::clone(&session.resolutions).acquire_owned().await.ok()?;
    let daemon = Arc::clone(&session.limits.daemon_resolutions.slots).acquire_owned().await.ok()?;
    Some((own, daemon))
}

/// [`resolve_checked`] then [`dial`]: the upstream of an allowed attempt (CONNECT, plain HTTP
/// or captured), every answer through the address guard.
pub async fn reach(
    session: &SessionProxy,
    policy: &crate::policy::Policy,
    host: &Host,
    port: u16,
) -> Result<(TcpStream, SocketAddr), Unreachable> {
    let addrs = resolve_checked(session, policy, host, port).await?;
    dial(session, &addrs, port).await
}

/// Dials the checked addresses in order within the connect timeout (shared by all of them).
pub async fn dial(
    session: &SessionProxy,
    addrs: &[IpAddr],
    port: u16,
) -> Result<(TcpStream, SocketAddr), Unreachable> {
    let deadline = tokio::time::Instant::now() + session.limits.connect_timeout;
    let mut last: Option<io::Error> = None;
    for ip in addrs {
        let sa = SocketAddr::new(*ip, port);
        match tokio::time::timeout_at(deadline, TcpStream::connect(sa)).await {
            Ok(Ok(s)) => {
                let _ = s.set_nodelay(true);
                return Ok((s, sa));
            }
            Ok(Err(e)) => last = Some(e),
            Err(_) => {
                return Err(Unreachable::ConnectFailed {
                    detail: format!(
                        "connecting to {sa} took longer than {}s",
                        session.limits.connect_timeout.as_secs_f32()
                    ),
                    timed_out: true,
                });
            }
        }
    }
    let detail = match last {
        Some(e) => format!("connecting to port {port} failed: {e}"),
        None => "no address to connect to".to_owned(),
    };
    Err(Unreachable::ConnectFailed { detail, timed_out: false })
}

/// The SNI the agent's ClientHello carried, for an `sni_*` line (`None`: no hello, or one
/// without SNI).
pub fn seen_sni(seen: Option<&Peek>) -> Option<String> {
    match seen {
        Some(Peek::Hello { sni: Some(sni) }) => Some(sni.clone()),
        _ => None,
    }
}

/// The SNI rule of SECURITY §3, given what the agent sent after `200` (`None`: the ClientHello
/// did not arrive in time or the agent closed). `Ok` lets the tunnel proceed.
pub fn judge_sni(target: &Host, seen: Option<&Peek>) -> Result<(), Reason> {
    match (target, seen) {
        (Host::Name(want), Some(Peek::Hello { sni: Some(sni) })) => match canonicalize_host(sni) {
            Ok(Host::Name(got)) if &got == want => Ok(()),
            _ => Err(Reason::SniMismatch),
        },
        (Host::Name(_), _) => Err(Reason::SniMissing),
        (Host::Ip(_), Some(Peek::NotTls | Peek::Hello { sni: None })) => Ok(()),
        (Host::Ip(ip), Some(Peek::Hello { sni: Some(sni) })) => match canonicalize_host(sni) {
            Ok(Host::Ip(got)) if got == *ip => Ok(()),
            _ => Err(Reason::SniMismatch),
        },
        (Host::Ip(_), _) => Err(Reason::SniMissing),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn sni_rules() {
        let name = Host::Name("example.test".into());
        let ip = Host::Ip("127.0.0.2".parse().unwrap());
        let hello = |s: Option<&str>| Peek::Hello { sni: s.map(str::to_owned) };
        assert_eq!(judge_sni(&name, Some(&hello(Some("example.test")))), Ok(()));
        assert_eq!(judge_sni(&name, Some(&hello(Some("EXAMPLE.test.")))), Ok(()));
        assert_eq!(judge_sni(&name, Some(&hello(Some("pastebin.com")))), Err(Reason::SniMismatch));
        assert_eq!(
            judge_sni(&name, Some(&hello(Some("sub.example.test")))),
            Err(Reason::SniMismatch)
        );
        assert_eq!(judge_sni(&name, Some(&hello(None))), Err(Reason::SniMissing));
        assert_eq!(judge_sni(&name, Some(&Peek::NotTls)), Err(Reason::SniMissing));
        assert_eq!(judge_sni(&name, None), Err(Reason::SniMissing));
        assert_eq!(judge_sni(&name, Some(&Peek::Malformed("x"))), Err(Reason::SniMissing));
        assert_eq!(judge_sni(&ip, Some(&hello(None))), Ok(()));
        assert_eq!(judge_sni(&ip, Some(&Peek::NotTls)), Ok(()));
        assert_eq!(judge_sni(&ip, Some(&hello(Some("example.test")))), Err(Reason::SniMismatch));
        assert_eq!(judge_sni(&ip, None), Err(Reason::SniMissing));
    }
}
