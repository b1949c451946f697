//! `airlock verify --checkpoint FILE`: a checkpoint obtained out of band (a colleague, CI, a
//! ticket) against the one this client holds (docs/evidence.md "Comparing with others"). Two
//! heads of one honest log are always consistent: the same size has the same root, and the
//! server can prove the smaller tree a prefix of the larger. When it cannot, the server showed
//! the two clients different trees: a split view.

use super::{ApiError, Head, LogApi, ProofAnswer, hashes_from_b64};
use crate::tlog::merkle::verify_consistency;

/// What the comparison found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The same tree.
    Same,
    /// Consistent: the server proved the smaller tree a prefix of the larger.
    Consistent { from: u64, to: u64 },
    /// A split view (or a rewritten history): why, in words.
    Split(String),
}

/// Why the comparison could not be made (exit 125).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompareError {
    #[error("cannot reach the review server for a consistency proof: {0}; try again later")]
    Transient(String),
    #[error("{0}; run `airlock login --server URL` again")]
    Unauthorized(String),
    #[error("the review server did not give a consistency proof: HTTP {status}: {message}")]
    Server { status: u16, message: String },
}

impl From<ApiError> for CompareError {
    fn from(e: ApiError) -> Self {
        match e {
            ApiError::Transient(m) => CompareError::Transient(m),
            ApiError::Unauthorized(m) => CompareError::Unauthorized(m),
        }
    }
}

/// Compares `other` with `held`, both already opened with the pinned key. The network is used
/// only when the sizes differ.
pub async fn compare<A: LogApi>(
    api: &A,
    held: &Head,
    other: &Head,
) -> Result<(Outcome, Option<Vec<u8>>), CompareError> {
    let (a, b) = if held.cp.size <= other.cp.size { (held, other) } else { (other, held) };
    if a.cp.size == b.cp.size {
        return Ok((
            if a.cp.root == b.cp.root {
                Outcome::Same
            } else {
                Outcome::Split("the two checkpoints have the same size and different roots".into())
            },
            None,
        ));
    }
    if a.cp.size == 0 {
        // The empty tree is a prefix of every tree.
        return Ok((Outcome::Consistent { from: 0, to: b.cp.size }, None));
    }
    let path = format!("/api/v1/log/proof/consistency?from={}&to={}", a.cp.size, b.cp.size);
    let ans = api.get(&path).await?;
    match ans.status {
        200 => {}
        400 => {
            return Ok((
                Outcome::Split(format!(
                    "the server cannot prove tree size {} consistent with size {} (HTTP 400: \
                     it does not hold that tree now): it rolled back, or showed one of the two \
                     clients another tree",
                    a.cp.size, b.cp.size
                )),
                Some(ans.body),
            ));
        }
        status => {
            return Err(CompareError::Server {
                status,
                message: String::from_utf8_lossy(&ans.body).chars().take(300).collect(),
            });
        }
    }
    let proof = serde_json::from_slice::<ProofAnswer>(&ans.body)
        .ok()
        .and_then(|p| hashes_from_b64(&p.hashes));
    let Some(proof) = proof else {
        return Ok((
            Outcome::Split("the server's consistency proof is not a list of hashes".into()),
            Some(ans.body),
        ));
    };
    Ok(match verify_consistency(a.cp.size, b.cp.size, &a.cp.root, &b.cp.root, &proof) {
        Ok(()) => (Outcome::Consistent { from: a.cp.size, to: b.cp.size }, Some(ans.body)),
        Err(e) => (
            Outcome::Split(format!(
                "the consistency proof from size {} to {} does not verify ({e})",
                a.cp.size, b.cp.size
            )),
            Some(ans.body),
        ),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::evidence::fake::FakeServer;
    use crate::tlog::note::NoteSigner;

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
    }

    #[test]
    fn consistent_heads_pass_and_a_split_view_is_caught() {
        let srv = FakeServer::new(40);
        let key = srv.key();
        let log = srv.log.borrow();
        let h10 = Head::open(&log.note_at(10, log.root_at(10), 100), &key).unwrap();
        let h40 = Head::open(&log.note(200), &key).unwrap();
        drop(log);
        assert_eq!(
            run(compare(&srv, &h10, &h40)).unwrap().0,
            Outcome::Consistent { from: 10, to: 40 }
        );
        assert_eq!(
            run(compare(&srv, &h40, &h10)).unwrap().0,
            Outcome::Consistent { from: 10, to: 40 }
        );
        assert_eq!(run(compare(&srv, &h40, &h40)).unwrap().0, Outcome::Same);
        // Another client was shown a fork of size 25 signed with the same key.
        let mut fork = crate::evidence::export::tests::FakeLog::new(24);
        fork.signer = NoteSigner::parse(&srv.log.borrow().signer.to_private_string()).unwrap();
        fork.add("forked", "{}");
        let f25 = Head::open(&fork.note(150), &key).unwrap();
        let (o, _) = run(compare(&srv, &h40, &f25)).unwrap();
        assert!(matches!(o, Outcome::Split(ref m) if m.contains("does not verify")), "{o:?}");
        // Same size, different root.
        let mut fork40 = crate::evidence::export::tests::FakeLog::new(39);
        fork40.signer = NoteSigner::parse(&srv.log.borrow().signer.to_private_string()).unwrap();
        fork40.add("x", "{}");
        let f40 = Head::open(&fork40.note(150), &key).unwrap();
        assert!(matches!(run(compare(&srv, &h40, &f40)).unwrap().0, Outcome::Split(_)));
        // A head larger than the server's tree: it cannot prove it.
        let mut big = crate::evidence::export::tests::FakeLog::new(50);
        big.signer = NoteSigner::parse(&srv.log.borrow().signer.to_private_string()).unwrap();
        let b50 = Head::open(&big.note(300), &key).unwrap();
        let (o, _) = run(compare(&srv, &h40, &b50)).unwrap();
        assert!(matches!(o, Outcome::Split(ref m) if m.contains("HTTP 400")), "{o:?}");
        // Unreachable: cannot check.
        srv.down.set(true);
        assert!(matches!(run(compare(&srv, &h10, &h40)), Err(CompareError::Transient(_))));
    }
}
