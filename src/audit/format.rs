//! Turning an [`AuditLine`] into bytes that are always one valid JSON line of bounded size,
//! whatever a hostile client put in the host, URL or method, and into the `ALLOW`/`DENY`
//! console lines of the standalone proxy.
//!
//! Each free-text field has a cap measured in *escaped* JSON bytes (serde_json writes `"` and
//! `\` as two bytes, the short control escapes as two, other control characters as six), so the
//! sum of the caps plus the fixed fields bounds every line by [`MAX_LINE`] by construction.

use std::borrow::Cow;
use std::fmt::Write as _;

use super::{AuditError, AuditLine};

/// No audit line is longer than this (bytes, including the newline).
pub const MAX_LINE: usize = 8192;

// Caps in escaped bytes. Their sum (7 346) plus field names, numbers and enums (< 600)
// stays under MAX_LINE; `caps_fit_max_line` checks it.
const CAP_TS: usize = 40;
const CAP_USER_ID: usize = 256;
const CAP_REPO: usize = 256;
const CAP_HOST: usize = 512;
const CAP_METHOD: usize = 32;
const CAP_ID: usize = 128;
const CAP_SESSION: usize = 128;
const CAP_BOOT: usize = 128;
const CAP_ADDR: usize = 64;
const CAP_REPO_PATH: usize = 1024;
/// A sanitized name (at most 255 bytes, a file name) plus `-` and 8 hex digits.
const CAP_REPO_KEY: usize = 272;
const CAP_URL: usize = 2048;
const CAP_POLICY: usize = 1024;
const CAP_QTYPE: usize = 16;
const CAP_ANSWER: usize = 64;
/// An entry as written: a 253-byte name with `*.` and `:65535` fits.
const CAP_RULE: usize = 320;
/// The agent chose it: capped like `host`.
const CAP_SNI: usize = 512;
/// One refused answer in `refused_addrs` (the longest IPv6 text form is 45 bytes).
const CAP_REFUSED_ADDR: usize = 46;
/// `refused_addrs` as a whole: [`super::MAX_REFUSED_ADDRS`] answers, quotes and commas.
#[cfg(test)]
const CAP_REFUSED_ADDRS: usize = super::MAX_REFUSED_ADDRS * (CAP_REFUSED_ADDR + 3) + 2;
const CAP_PEER: usize = 64;
const CAP_LISTEN: usize = 64;
// The `gate` object. A line with one never carries `refused_addrs`, `peer`, `listen`, `qtype`
// or `answer`, nor a step line `sni` (they are cleared if a hand-made line has them), whose
// caps (1 114) exceed these (1 072); an attempt's final line that keeps its `sni` carries the
// gate without `by`, `note`, `method`, `deadline`, `decided_at` and `server` (216 of the 650
// freed), so the bound above holds for every line with a gate.
const CAP_GATE_ID: usize = 64;
/// A review server's gate id (`gt_` and 32 hex digits).
const CAP_GATE_SERVER: usize = 48;
const CAP_GATE_DIGEST: usize = 80;
const CAP_GATE_BY: usize = 256;
const CAP_GATE_NOTE: usize = 512;
const CAP_GATE_TS: usize = 40;
#[cfg(test)]
const CAPS_TOTAL: usize = CAP_TS
    + CAP_USER_ID
    + CAP_REPO
    + CAP_HOST
    + CAP_METHOD
    + CAP_ID
    + CAP_SESSION
    + CAP_BOOT
    + CAP_ADDR
    + CAP_REPO_PATH
    + CAP_REPO_KEY
    + CAP_URL
    + CAP_POLICY
    + CAP_QTYPE
    + CAP_ANSWER
    + CAP_RULE
    + CAP_SNI
    + CAP_REFUSED_ADDRS
    + CAP_PEER
    + CAP_LISTEN;

/// Raw bytes from the wire (a CONNECT authority, a request target) as text for an audit line:
/// invalid UTF-8 becomes U+FFFD, so nothing is dropped silently and the line stays valid JSON.
pub fn text_from_bytes(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// How many bytes serde_json writes for `c` inside a string.
fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// Cuts `s` (at a char boundary) so its escaped length is at most `cap`; true if it cut.
fn cap_str(s: &mut String, cap: usize) -> bool {
    // Fast path: even if every byte needed a six-byte escape it would fit.
    if s.len().saturating_mul(6) <= cap {
        return false;
    }
    let mut used = 0;
    for (i, c) in s.char_indices() {
        used += escaped_len(c);
        if used > cap {
            s.truncate(i);
            return true;
        }
    }
    false
}

fn cap_opt(s: &mut Option<String>, cap: usize) -> bool {
    s.as_mut().is_some_and(|s| cap_str(s, cap))
}

/// The line with every free-text field cut to its cap and `truncated: true` if anything was
/// cut. Borrowed when nothing needed cutting (the common case costs no allocation).
pub fn fit_line(line: &AuditLine) -> Cow<'_, AuditLine> {
    let fits = |s: &str, cap: usize| {
        // Escaping never shrinks a string; most fields are short plain ASCII.
        s.len().saturating_mul(6) <= cap
            || (s.len() <= cap && s.chars().map(escaped_len).sum::<usize>() <= cap)
    };
    let fits_opt = |s: &Option<String>, cap: usize| s.as_deref().is_none_or(|s| fits(s, cap));
    if fits(&line.ts, CAP_TS)
        && fits_opt(&line.user_id, CAP_USER_ID)
        && fits(&line.repo, CAP_REPO)
        && fits(&line.host, CAP_HOST)
        && fits(&line.method, CAP_METHOD)
        && fits(&line.id, CAP_ID)
        && fits(&line.session, CAP_SESSION)
        && fits(&line.boot, CAP_BOOT)
        && fits_opt(&line.addr, CAP_ADDR)
        && fits_opt(&line.repo_path, CAP_REPO_PATH)
        && fits_opt(&line.repo_key, CAP_REPO_KEY)
        && fits_opt(&line.url, CAP_URL)
        && fits_opt(&line.policy, CAP_POLICY)
        && fits_opt(&line.qtype, CAP_QTYPE)
        && fits_opt(&line.answer, CAP_ANSWER)
        && fits_opt(&line.rule, CAP_RULE)
        && fits_opt(&line.sni, CAP_SNI)
        && refused_addrs_fit(line.refused_addrs.as_deref())
        && fits_opt(&line.peer, CAP_PEER)
        && fits_opt(&line.listen, CAP_LISTEN)
        && line.gate.as_ref().is_none_or(|g| {
            fits(&g.id, CAP_GATE_ID)
                && fits(&g.digest, CAP_GATE_DIGEST)
                && fits_opt(&g.by, CAP_GATE_BY)
                && fits_opt(&g.note, CAP_GATE_NOTE)
                && fits_opt(&g.method, CAP_METHOD)
                && fits_opt(&g.deadline, CAP_GATE_TS)
                && fits_opt(&g.decided_at, CAP_GATE_TS)
                && fits_opt(&g.server, CAP_GATE_SERVER)
                && (line.sni.is_none() || (!is_step(line) && g.on_final_line() == *g))
                && line.refused_addrs.is_none()
                && line.peer.is_none()
                && line.listen.is_none()
                && line.qtype.is_none()
                && line.answer.is_none()
        })
    {
        return Cow::Borrowed(line);
    }
    let mut l = line.clone();
    let mut cut = false;
    cut |= cap_str(&mut l.ts, CAP_TS);
    cut |= cap_opt(&mut l.user_id, CAP_USER_ID);
    cut |= cap_str(&mut l.repo, CAP_REPO);
    cut |= cap_str(&mut l.host, CAP_HOST);
    cut |= cap_str(&mut l.method, CAP_METHOD);
    cut |= cap_str(&mut l.id, CAP_ID);
    cut |= cap_str(&mut l.session, CAP_SESSION);
    cut |= cap_str(&mut l.boot, CAP_BOOT);
    cut |= cap_opt(&mut l.addr, CAP_ADDR);
    cut |= cap_opt(&mut l.repo_path, CAP_REPO_PATH);
    cut |= cap_opt(&mut l.repo_key, CAP_REPO_KEY);
    cut |= cap_opt(&mut l.url, CAP_URL);
    cut |= cap_opt(&mut l.policy, CAP_POLICY);
    cut |= cap_opt(&mut l.qtype, CAP_QTYPE);
    cut |= cap_opt(&mut l.answer, CAP_ANSWER);
    cut |= cap_opt(&mut l.rule, CAP_RULE);
    cut |= cap_opt(&mut l.sni, CAP_SNI);
    if let Some(addrs) = l.refused_addrs.as_mut() {
        if addrs.len() > super::MAX_REFUSED_ADDRS {
            addrs.truncate(super::MAX_REFUSED_ADDRS);
            cut = true;
        }
        for a in addrs.iter_mut() {
            cut |= cap_str(a, CAP_REFUSED_ADDR);
        }
    }
    cut |= cap_opt(&mut l.peer, CAP_PEER);
    cut |= cap_opt(&mut l.listen, CAP_LISTEN);
    let step = is_step(&l);
    if let Some(g) = l.gate.as_mut() {
        cut |= cap_str(&mut g.id, CAP_GATE_ID);
        cut |= cap_str(&mut g.digest, CAP_GATE_DIGEST);
        cut |= cap_opt(&mut g.by, CAP_GATE_BY);
        cut |= cap_opt(&mut g.note, CAP_GATE_NOTE);
        cut |= cap_opt(&mut g.method, CAP_METHOD);
        cut |= cap_opt(&mut g.deadline, CAP_GATE_TS);
        cut |= cap_opt(&mut g.decided_at, CAP_GATE_TS);
        cut |= cap_opt(&mut g.server, CAP_GATE_SERVER);
        if step {
            cut |= l.sni.take().is_some();
        } else if l.sni.is_some() && g.on_final_line() != *g {
            // An attempt's final line keeps its `sni` evidence; who decided is on the step.
            *g = g.on_final_line();
            cut = true;
        }
        for field in [&mut l.peer, &mut l.listen, &mut l.qtype, &mut l.answer] {
            cut |= field.take().is_some();
        }
        cut |= l.refused_addrs.take().is_some();
    }
    if cut {
        l.truncated = Some(true);
    }
    Cow::Owned(l)
}

/// A gate's step line (`method: "GATE"`), as opposed to the attempt's own line.
fn is_step(line: &AuditLine) -> bool {
    line.method == crate::proxy::gatehold::STEP_METHOD
}

/// Whether `refused_addrs` is within its count and per-answer caps (answers are addresses
/// the proxy formatted, so this only fails on a hand-made line).
fn refused_addrs_fit(addrs: Option<&[String]>) -> bool {
    addrs.is_none_or(|a| {
        a.len() <= super::MAX_REFUSED_ADDRS
            && a.iter()
                .all(|s| s.len() <= CAP_REFUSED_ADDR && s.chars().all(|c| escaped_len(c) == 1))
    })
}

/// The bytes of one audit line: the capped line as JSON plus `\n`, at most [`MAX_LINE`].
pub fn encode_line(line: &AuditLine) -> Result<Vec<u8>, AuditError> {
    let fitted = fit_line(line);
    encode_json(&*fitted, MAX_LINE, &fitted.id)
}

/// Serializes `value` plus `\n`, refusing anything longer than `max`.
pub(crate) fn encode_json<T: serde::Serialize + ?Sized>(
    value: &T,
    max: usize,
    id: &str,
) -> Result<Vec<u8>, AuditError> {
    let mut buf = Vec::with_capacity(512);
    // Serializing plain structs of strings, numbers and enums into a Vec cannot fail; map
    // the impossible error to TooLarge rather than panic.
    serde_json::to_writer(&mut buf, value)
        .map_err(|_| AuditError::TooLarge { id: id.to_owned(), len: 0 })?;
    buf.push(b'\n');
    if buf.len() > max {
        return Err(AuditError::TooLarge { id: id.to_owned(), len: buf.len() });
    }
    Ok(buf)
}

/// Text safe to print on a terminal: control characters (ESC, CR, BEL, C1 …) and bidi
/// overrides are shown as `\u{..}` escapes, so a hostile hostname cannot rewrite the screen.
pub fn escape_for_terminal(s: &str) -> Cow<'_, str> {
    let bad =
        |c: char| c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}');
    if !s.chars().any(bad) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if bad(c) {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The standalone proxy's stdout line for one attempt, e.g.
/// `2026-07-24T18:03:11.482Z ALLOW api.anthropic.com:443 CONNECT sent=18204 recv=91544 2311ms`
/// or `… DENY pastebin.com:443 CONNECT reason=not_allowed layer=none`.
pub fn console_line(line: &AuditLine) -> String {
    let mut out = String::with_capacity(128);
    let verdict = match (line.allowed, line.interrupted == Some(true)) {
        (_, true) => "INTERRUPTED",
        (true, false) => "ALLOW",
        (false, false) => "DENY",
    };
    let _ = write!(out, "{} {verdict} {}", escape_for_terminal(&line.ts), format_host_port(line));
    let _ = write!(out, " {}", escape_for_terminal(&line.method));
    if let Some(url) = &line.url {
        let _ = write!(out, " {}", escape_for_terminal(url));
    }
    if let Some(status) = line.status {
        let _ = write!(out, " status={status}");
    }
    if let Some(qtype) = &line.qtype {
        let _ = write!(out, " {}", escape_for_terminal(qtype));
    }
    if let Some(answer) = &line.answer {
        let _ = write!(out, " answer={}", escape_for_terminal(answer));
    }
    if line.allowed {
        if let Some(sent) = line.bytes_sent {
            let _ = write!(out, " sent={sent}");
        }
        if let Some(recv) = line.bytes_recv {
            let _ = write!(out, " recv={recv}");
        }
        if let Some(addr) = &line.addr {
            let _ = write!(out, " addr={}", escape_for_terminal(addr));
        }
    }
    if let Some(ms) = line.duration_ms {
        let _ = write!(out, " {ms}ms");
    }
    if !line.allowed || line.interrupted == Some(true) {
        if let Some(reason) = line.reason {
            let _ = write!(out, " reason={reason}");
        }
        if let Some(layer) = line.layer {
            let _ = write!(out, " layer={layer}");
        }
    }
    if line.truncated == Some(true) {
        out.push_str(" (truncated)");
    }
    out
}

/// `host:port` (IPv6 literals bracketed), terminal-safe.
pub fn format_host_port(line: &AuditLine) -> String {
    let host = escape_for_terminal(&line.host);
    match line.port {
        Some(port) if host.contains(':') && !host.starts_with('[') => format!("[{host}]:{port}"),
        Some(port) => format!("{host}:{port}"),
        None => host.into_owned(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
pub(crate) mod tests {
    use super::*;
    use crate::policy::{LayerKind, Reason};
    use proptest::prelude::*;

    pub(crate) fn sample() -> AuditLine {
        AuditLine {
            ts: "2026-07-24T18:03:11.482Z".into(),
            user_id: Some("41f0c2".into()),
            repo: "some-repo".into(),
            host: "api.anthropic.com".into(),
            method: "CONNECT".into(),
            allowed: true,
            bytes_sent: Some(18204),
            bytes_recv: Some(91544),
            duration_ms: Some(2311),
            id: "abc-1".into(),
            session: "s1".into(),
            boot: "b1".into(),
            seq: 1,
            port: Some(443),
            addr: Some("127.0.0.2:443".into()),
            repo_path: Some("/home/u/some-repo".into()),
            repo_key: Some("some-repo-0a1b2c3d".into()),
            url: None,
            status: None,
            reason: Some(Reason::Allowed),
            layer: Some(LayerKind::Repo),
            policy: Some(".airlock.toml".into()),
            interrupted: None,
            truncated: None,
            seqs: None,
            count: None,
            capture: None,
            qtype: None,
            answer: None,
            rule: Some("api.anthropic.com".into()),
            refused_addrs: None,
            sni: None,
            peer: None,
            listen: None,
            gate: None,
            phase: None,
            previous: None,
            by: None,
        }
    }

    /// A line with every optional field present and every free-text field at its worst.
    pub(crate) fn worst(s: &str) -> AuditLine {
        AuditLine {
            ts: s.into(),
            user_id: Some(s.into()),
            repo: s.into(),
            host: s.into(),
            method: s.into(),
            allowed: false,
            bytes_sent: Some(u64::MAX),
            bytes_recv: Some(u64::MAX),
            duration_ms: Some(u64::MAX),
            id: s.into(),
            session: s.into(),
            boot: s.into(),
            seq: u64::MAX,
            port: Some(u16::MAX),
            addr: Some(s.into()),
            repo_path: Some(s.into()),
            repo_key: Some(s.into()),
            url: Some(s.into()),
            status: Some(u16::MAX),
            reason: Some(Reason::ManagedNotAllowed),
            layer: Some(LayerKind::Operator),
            policy: Some(s.into()),
            interrupted: Some(true),
            truncated: Some(true),
            // A `suppressed` line's worst case is `audit::volume`'s test (it has no url).
            seqs: None,
            count: None,
            capture: Some(crate::audit::Capture::Transparent),
            qtype: Some(s.into()),
            answer: Some(s.into()),
            rule: Some(s.into()),
            refused_addrs: Some(vec![s.into(); 20]),
            sni: Some(s.into()),
            peer: Some(s.into()),
            listen: Some(s.into()),
            gate: None,
            phase: None,
            previous: None,
            by: None,
        }
    }

    #[test]
    fn caps_fit_max_line() {
        // Every field maximal with the worst escape: still one line under MAX_LINE.
        for s in ["\u{1}".repeat(10_000), "\"".repeat(10_000), "é".repeat(10_000)] {
            let bytes = encode_line(&worst(&s)).unwrap();
            assert!(bytes.len() <= MAX_LINE, "{} > {MAX_LINE}", bytes.len());
            // A gate line with every field maximal too.
            let mut line = worst(&s);
            line.gate = Some(crate::audit::GateRecord {
                id: s.clone(),
                step: crate::audit::GateStep::Abandoned,
                digest: s.clone(),
                severity: crate::gate::Severity::High,
                method: Some(s.clone()),
                deadline: Some(s.clone()),
                by: Some(s.clone()),
                decided_at: Some(s.clone()),
                note: Some(s.clone()),
                self_decided: Some(true),
                server: Some(s.clone()),
            });
            let bytes = encode_line(&line).unwrap();
            assert!(bytes.len() <= MAX_LINE, "gate line: {} > {MAX_LINE}", bytes.len());
            let back: AuditLine = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(back.truncated, Some(true));
            // Not a step line: the attempt's final line keeps `sni` and sheds who decided.
            assert!(back.sni.is_some() && back.refused_addrs.is_none(), "{back:?}");
            assert!(back.gate.as_ref().is_some_and(|g| g.by.is_none() && g.note.is_none()));
            line.method = "GATE".into();
            let bytes = encode_line(&line).unwrap();
            assert!(bytes.len() <= MAX_LINE, "gate step line: {} > {MAX_LINE}", bytes.len());
            let back: AuditLine = serde_json::from_slice(&bytes).unwrap();
            assert!(back.sni.is_none() && back.gate.as_ref().is_some_and(|g| g.note.is_some()));
        }
        const { assert!(CAPS_TOTAL + 700 <= MAX_LINE) };
    }

    #[test]
    fn ordinary_lines_are_untouched() {
        let line = sample();
        assert!(matches!(fit_line(&line), Cow::Borrowed(_)));
        let bytes = encode_line(&line).unwrap();
        assert_eq!(*bytes.last().unwrap(), b'\n');
        let back: AuditLine = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back, line);
        let text = String::from_utf8(bytes).unwrap();
        assert!(text.starts_with(r#"{"ts":"2026-07-24T18:03:11.482Z","user_id":"41f0c2","repo":"some-repo","host":"api.anthropic.com","method":"CONNECT","allowed":true,"bytes_sent":18204"#));
        assert!(!text.contains("truncated"));
    }

    #[test]
    fn long_host_is_cut_at_a_char_boundary_and_flagged() {
        let mut line = sample();
        line.host = format!("{}.example", "ü".repeat(600));
        line.url = Some("x".repeat(5000));
        let bytes = encode_line(&line).unwrap();
        let back: AuditLine = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(back.truncated, Some(true));
        assert!(back.host.len() <= CAP_HOST && back.host.len() >= CAP_HOST - 1);
        assert!(back.host.chars().all(|c| c == 'ü'));
        assert_eq!(back.url.as_deref().map(str::len), Some(CAP_URL));
        // Untouched fields survive.
        assert_eq!(back.id, line.id);
        assert_eq!(back.bytes_recv, line.bytes_recv);
    }

    #[test]
    fn console_lines_name_verdict_host_and_reason() {
        let line = sample();
        assert_eq!(
            console_line(&line),
            "2026-07-24T18:03:11.482Z ALLOW api.anthropic.com:443 CONNECT sent=18204 \
             recv=91544 addr=127.0.0.2:443 2311ms"
        );
        let mut deny = sample();
        deny.allowed = false;
        deny.host = "pastebin.com".into();
        deny.bytes_sent = None;
        deny.bytes_recv = None;
        deny.duration_ms = Some(0);
        deny.addr = None;
        deny.reason = Some(Reason::NotAllowed);
        deny.layer = Some(LayerKind::None);
        assert_eq!(
            console_line(&deny),
            "2026-07-24T18:03:11.482Z DENY pastebin.com:443 CONNECT 0ms reason=not_allowed \
             layer=none"
        );
        let mut v6 = deny.clone();
        v6.host = "::1".into();
        assert!(console_line(&v6).contains(" [::1]:443 "));
        let mut evil = deny;
        evil.host = "a\u{1b}[2Jb\r".into();
        let out = console_line(&evil);
        assert!(!out.contains('\u{1b}') && !out.contains('\r'), "{out:?}");
        assert!(out.contains(r"a\u{1b}[2Jb\u{d}"));
    }

    proptest! {
        #[test]
        fn any_bytes_give_one_valid_bounded_line(
            host in proptest::collection::vec(any::<u8>(), 0..3000),
            url in proptest::collection::vec(any::<u8>(), 0..6000),
            method in proptest::collection::vec(any::<u8>(), 0..100),
        ) {
            let mut line = sample();
            line.host = text_from_bytes(&host);
            line.url = Some(text_from_bytes(&url));
            line.method = text_from_bytes(&method);
            let bytes = encode_line(&line).unwrap();
            prop_assert!(bytes.len() <= MAX_LINE);
            prop_assert_eq!(bytes.iter().filter(|&&b| b == b'\n').count(), 1);
            prop_assert_eq!(bytes.last(), Some(&b'\n'));
            let back: AuditLine = serde_json::from_slice(&bytes).unwrap();
            prop_assert!(line.host.starts_with(&back.host));
            prop_assert!(line.url.as_deref().unwrap().starts_with(back.url.as_deref().unwrap()));
            let cut = back.host != line.host || back.url != line.url || back.method != line.method;
            prop_assert_eq!(back.truncated == Some(true), cut);
        }
    }
}
