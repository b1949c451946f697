//! Receipts of this client's own uploads, `~/.airlock/publish/receipts/<UTC date>.jsonl`
//! (directory 0700, files 0600, append-only): one JSON line per item the review server
//! answered `created` while a log key is pinned (docs/evidence.md "Clients witness"):
//!
//! ```json
//! {"user_id":"u_…","source":"egress","id":"…","received_at":"2026-07-24T18:03:11.482113Z",
//!  "payload_sha256":"sha256:<hex of the payload bytes sent>","leaf_index":17}
//! ```
//!
//! `leaf_index` is absent while the server had not sequenced the event (`leaf_pending`); the
//! line then carries the server's `deadline`. Everything a leaf is made of is here, so the
//! witness step rebuilds the leaf from what this client sent, not from what the server says.

use std::fs::OpenOptions;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::config::fsutil::private_dir;
use crate::tlog::merkle::Hash;

/// One uploaded item as the server acknowledged it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub user_id: String,
    pub source: String,
    pub id: String,
    /// The server's `received_at`, as it answered it.
    pub received_at: String,
    /// `sha256:<hex>` of the payload's JSON text exactly as sent.
    pub payload_sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaf_index: Option<u64>,
    /// While pending: when the server promised to have sequenced it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
}

impl Receipt {
    /// The payload hash as bytes (`None`: the line was altered).
    pub fn payload_hash(&self) -> Option<Hash> {
        let hex_part = self.payload_sha256.strip_prefix("sha256:")?;
        hex::decode(hex_part).ok()?.try_into().ok()
    }

    /// The leaf this event must have, rebuilt from what was sent (`None`: an unreadable
    /// time or hash in the receipt).
    pub fn leaf(&self) -> Option<Hash> {
        let at = crate::evidence::parse_micros(&self.received_at)?;
        Some(crate::evidence::event_leaf(
            &self.user_id,
            &self.source,
            &self.id,
            at,
            self.payload_hash()?,
        ))
    }

    /// `source/id` for messages.
    pub fn name(&self) -> String {
        format!("{}/{}", self.source, self.id)
    }
}

/// `source`, `id` and the payload's hash of one envelope line as sent (the payload's JSON text
/// exactly as the line holds it: what the server stores and hashes).
pub fn sent_item(line: &[u8]) -> Option<(String, String, String)> {
    #[derive(Deserialize)]
    struct Item<'a> {
        source: String,
        id: String,
        #[serde(borrow)]
        payload: &'a RawValue,
    }
    let item: Item<'_> = serde_json::from_slice(line).ok()?;
    let sha = super::state::sha(item.payload.get().as_bytes());
    Some((item.source, item.id, sha))
}

/// `~/.airlock/publish/receipts/`.
pub fn dir(airlock_dir: &Path) -> PathBuf {
    super::state::dir(airlock_dir).join("receipts")
}

/// Appends receipts to today's file (UTC).
pub fn append(airlock_dir: &Path, receipts: &[Receipt]) -> io::Result<()> {
    if receipts.is_empty() {
        return Ok(());
    }
    let d = dir(airlock_dir);
    private_dir(&d)?;
    let now = time::OffsetDateTime::now_utc();
    let name = format!("{:04}-{:02}-{:02}.jsonl", now.year(), u8::from(now.month()), now.day());
    let mut text = Vec::with_capacity(receipts.len() * 256);
    for r in receipts {
        serde_json::to_writer(&mut text, r).map_err(io::Error::other)?;
        text.push(b'\n');
    }
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(d.join(name))?;
    f.write_all(&text)
}

/// Below this many bytes of receipts, the sample is drawn from all of them read whole.
const READ_WHOLE: u64 = 4 << 20;

/// Up to `n` receipts drawn at random from the stored files (roughly uniformly: a random byte
/// of a random file, weighted by size, names the line it falls in). Unreadable lines are
/// skipped.
pub fn sample(airlock_dir: &Path, n: usize) -> io::Result<Vec<Receipt>> {
    let d = dir(airlock_dir);
    let mut files: Vec<(PathBuf, u64)> = match std::fs::read_dir(&d) {
        Ok(rd) => rd
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".jsonl"))
            .filter_map(|e| {
                let m = std::fs::symlink_metadata(e.path()).ok()?;
                m.is_file().then(|| (e.path(), m.len()))
            })
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    files.sort();
    let total: u64 = files.iter().map(|f| f.1).sum();
    if total == 0 || n == 0 {
        return Ok(Vec::new());
    }
    if total <= READ_WHOLE {
        let mut all = Vec::new();
        for (p, _) in &files {
            let f = std::fs::File::open(p)?;
            for line in BufReader::new(f).lines() {
                if let Ok(r) = serde_json::from_str::<Receipt>(&line?) {
                    all.push(r);
                }
            }
        }
        return Ok(pick(all, n));
    }
    let mut out: Vec<Receipt> = Vec::with_capacity(n);
    for _ in 0..n * 3 {
        if out.len() >= n {
            break;
        }
        let mut at = random_below(total);
        let Some((path, len)) = files.iter().find(|(_, len)| {
            if at < *len {
                true
            } else {
                at -= len;
                false
            }
        }) else {
            continue;
        };
        if let Some(r) = line_at(path, at, *len)?
            && !out.contains(&r)
        {
            out.push(r);
        }
    }
    Ok(out)
}

/// The receipt on the line containing byte `at` of `path`.
fn line_at(path: &Path, at: u64, len: u64) -> io::Result<Option<Receipt>> {
    let mut f = std::fs::File::open(path)?;
    // Back up to the start of the line (lines are short: 4 KiB covers one).
    let start = at.saturating_sub(4096);
    f.seek(SeekFrom::Start(start))?;
    let mut buf = vec![0u8; usize::try_from((at - start) + 8192).unwrap_or(8192)];
    let mut got = 0;
    let mut rd = f.take(len - start);
    loop {
        let k = rd.read(&mut buf[got..])?;
        if k == 0 {
            break;
        }
        got += k;
        if got == buf.len() {
            break;
        }
    }
    let buf = &buf[..got];
    let rel = usize::try_from(at - start).unwrap_or(0).min(buf.len());
    let line_start = buf[..rel].iter().rposition(|b| *b == b'\n').map_or(0, |p| p + 1);
    if line_start == 0 && start > 0 {
        return Ok(None);
    }
    let line_end = buf[line_start..].iter().position(|b| *b == b'\n').map(|p| line_start + p);
    let Some(line_end) = line_end else { return Ok(None) };
    Ok(serde_json::from_slice(&buf[line_start..line_end]).ok())
}

/// A uniform random number below `n` (`n > 0`).
pub fn random_below(n: u64) -> u64 {
    let mut b = [0u8; 8];
    let _ = getrandom::fill(&mut b);
    u64::from_le_bytes(b) % n.max(1)
}

/// Up to `n` of `items`, chosen at random (partial Fisher–Yates).
pub fn pick<T>(mut items: Vec<T>, n: usize) -> Vec<T> {
    let k = n.min(items.len());
    for i in 0..k {
        let j = i + random_below((items.len() - i) as u64) as usize;
        items.swap(i, j);
    }
    items.truncate(k);
    items
}

/// A bounded uniform sample of a stream (reservoir sampling): this run's receipts.
#[derive(Debug, Clone, Default)]
pub struct Reservoir {
    pub seen: u64,
    pub items: Vec<Receipt>,
}

impl Reservoir {
    pub fn offer(&mut self, r: Receipt, cap: usize) {
        self.seen += 1;
        if self.items.len() < cap {
            self.items.push(r);
            return;
        }
        let j = random_below(self.seen) as usize;
        if j < cap {
            self.items[j] = r;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn r(i: u64) -> Receipt {
        Receipt {
            user_id: "u".into(),
            source: "egress".into(),
            id: format!("e{i}"),
            received_at: "2026-07-24T18:03:11.482113Z".into(),
            payload_sha256: super::super::state::sha(b"{}"),
            leaf_index: Some(i),
            deadline: None,
        }
    }

    #[test]
    fn receipts_append_and_sample() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(sample(tmp.path(), 16).unwrap().is_empty());
        append(tmp.path(), &(0..10).map(r).collect::<Vec<_>>()).unwrap();
        let s = sample(tmp.path(), 16).unwrap();
        assert_eq!(s.len(), 10);
        let s = sample(tmp.path(), 4).unwrap();
        assert_eq!(s.len(), 4);
        assert!(s[0].leaf().is_some());
        use std::os::unix::fs::PermissionsExt;
        let f = std::fs::read_dir(dir(tmp.path())).unwrap().next().unwrap().unwrap();
        assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn large_receipt_files_are_sampled_by_seeking() {
        let tmp = tempfile::tempdir().unwrap();
        let batch: Vec<Receipt> = (0..30_000).map(r).collect();
        append(tmp.path(), &batch).unwrap();
        assert!(std::fs::read_dir(dir(tmp.path())).unwrap().count() == 1);
        let s = sample(tmp.path(), 16).unwrap();
        assert!(s.len() >= 12, "{}", s.len());
        assert!(s.iter().all(|x| x.source == "egress"));
    }

    #[test]
    fn sent_items_hash_the_payload_text_as_sent() {
        let (s, id, sha) =
            sent_item(br#"{"id":"a","source":"egress","payload":{"x": 1 },"ts":"t"}"#).unwrap();
        assert_eq!((s.as_str(), id.as_str()), ("egress", "a"));
        assert_eq!(sha, super::super::state::sha(b"{\"x\": 1 }"));
        let mut res = Reservoir::default();
        for i in 0..100 {
            res.offer(r(i), 8);
        }
        assert_eq!((res.seen, res.items.len()), (100, 8));
    }
}
