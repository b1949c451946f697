//! Making a line fit the review plane's item cap (1,000,000 bytes) without losing it: its
//! largest fields are replaced, largest first, by `{"sha256": "<hex>", "bytes": N}` until the
//! envelope fits, and each replacement is listed (JSON Pointer, RFC 6901) in the envelope's
//! `elided`. Strings are replaced first (`sha256`/`bytes` of the string's UTF-8); only when no
//! string worth replacing is left are whole arrays or objects (their compact JSON) replaced.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// One replaced field.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Elided {
    pub path: String,
    pub sha256: String,
    pub bytes: u64,
}

/// Strings shorter than this are never worth replacing (the stand-in is about 90 bytes).
const MIN_FIELD: usize = 128;

/// Replaces the largest fields of `payload` until `fits(serialized payload, elided)` says yes.
/// `None` when even that cannot make it fit.
pub fn elide(
    mut payload: Value,
    fits: &dyn Fn(&str, &[Elided]) -> bool,
) -> Option<(String, Vec<Elided>)> {
    let mut elided = Vec::new();
    loop {
        let text = serde_json::to_string(&payload).ok()?;
        if fits(&text, &elided) {
            return Some((text, elided));
        }
        let target = largest(&payload, true).or_else(|| largest(&payload, false))?;
        let slot = payload.pointer_mut(&target.0)?;
        let (sha, bytes) = match &*slot {
            Value::String(s) => (Sha256::digest(s.as_bytes()), s.len()),
            other => {
                let t = serde_json::to_string(other).ok()?;
                (Sha256::digest(t.as_bytes()), t.len())
            }
        };
        let sha = hex::encode(sha);
        let mut stub = Map::new();
        stub.insert("sha256".into(), Value::String(sha.clone()));
        stub.insert("bytes".into(), Value::from(bytes as u64));
        *slot = Value::Object(stub);
        elided.push(Elided { path: target.0, sha256: sha, bytes: bytes as u64 });
    }
}

/// The JSON Pointer and size of the largest string (`strings`) or of the largest array/object
/// below the root that is not already a stand-in (`!strings`).
fn largest(root: &Value, strings: bool) -> Option<(String, usize)> {
    let mut best: Option<(String, usize)> = None;
    let mut stack: Vec<(String, &Value)> = vec![(String::new(), root)];
    while let Some((ptr, v)) = stack.pop() {
        let size = match v {
            Value::String(s) if strings => s.len(),
            Value::Array(_) | Value::Object(_) if !strings && !ptr.is_empty() && !is_stub(v) => {
                serde_json::to_string(v).map(|t| t.len()).unwrap_or(0)
            }
            _ => 0,
        };
        if size >= MIN_FIELD && best.as_ref().is_none_or(|b| size > b.1) {
            best = Some((ptr.clone(), size));
        }
        match v {
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    stack.push((format!("{ptr}/{i}"), x));
                }
            }
            Value::Object(m) if !is_stub(v) => {
                for (k, x) in m {
                    stack.push((format!("{ptr}/{}", k.replace('~', "~0").replace('/', "~1")), x));
                }
            }
            _ => {}
        }
    }
    best
}

fn is_stub(v: &Value) -> bool {
    v.as_object().is_some_and(|m| {
        m.len() == 2 && m.get("sha256").is_some_and(Value::is_string) && m.contains_key("bytes")
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn largest_first_until_it_fits() {
        let big = "a".repeat(5000);
        let mid = "b".repeat(3000);
        let v = serde_json::json!({"message": {"content": [{"text": big}, {"text": mid}]}, "k/x": "c".repeat(200)});
        let (text, el) = elide(v, &|t, _| t.len() < 4000).unwrap();
        assert_eq!(el.len(), 1);
        assert_eq!(el[0].path, "/message/content/0/text");
        assert_eq!(el[0].bytes, 5000);
        assert_eq!(el[0].sha256, hex::encode(Sha256::digest(big.as_bytes())));
        assert!(text.contains(&mid));
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v.pointer("/message/content/0/text/bytes").unwrap(), 5000);
        // Escaped keys in pointers.
        let v = serde_json::json!({"k/x": "c".repeat(200)});
        let (_, el) = elide(v, &|t, _| t.len() < 150).unwrap();
        assert_eq!(el[0].path, "/k~1x");
    }

    #[test]
    fn falls_back_to_containers_and_gives_up_when_hopeless() {
        let v = serde_json::json!({"n": (0..200).collect::<Vec<u32>>()});
        let (text, el) = elide(v, &|t, _| t.len() < 300).unwrap();
        assert_eq!(el[0].path, "/n");
        assert!(text.len() < 300);
        let v = serde_json::json!({"a": 1});
        assert!(elide(v, &|_, _| false).is_none());
    }
}
