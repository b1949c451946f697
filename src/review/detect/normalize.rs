//! The extra passes detection runs over one field's text so that cosmetic rewrites do not
//! hide a match: Unicode folding (NFKC, UAX #15) with invisible characters removed
//! (zero-width, bidi controls, tag characters), the Read tool's line numbers stripped,
//! wrapped lines joined, and runs of base64, hex or URL-encoding decoded (two levels deep,
//! within a byte budget). Each pass is tagged so a hit can say which view matched.

use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfkc_quick};

/// Which rewrite of a field's text a hit was found in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    Raw,
    /// NFKC with zero-width, bidi and tag characters removed.
    Normalized,
    /// The Read tool's `N→` prefixes removed.
    Unnumbered,
    /// Line breaks (and the indentation around them, and `\` continuations) removed.
    Joined,
    Base64,
    Hex,
    Url,
    /// One simple command of a parsed shell line, with `cd` applied to its paths.
    Shell,
}

impl Pass {
    /// How a hit's detail names the pass (empty for the raw text).
    pub fn label(self) -> &'static str {
        match self {
            Pass::Raw => "",
            Pass::Normalized => " (after Unicode normalization)",
            Pass::Unnumbered => " (line numbers stripped)",
            Pass::Joined => " (wrapped lines joined)",
            Pass::Base64 => " (base64-decoded)",
            Pass::Hex => " (hex-decoded)",
            Pass::Url => " (URL-decoded)",
            Pass::Shell => " (parsed shell command)",
        }
    }
}

/// Encoded runs shorter than this are left alone (a 20-character key is 28 in base64).
pub const MIN_BASE64_RUN: usize = 24;
/// Hex runs shorter than this are left alone (12 bytes of text).
pub const MIN_HEX_RUN: usize = 24;
/// `%XX` escapes a string needs before it gets a URL-decoded pass (one `%3D` can hide the
/// `=` a key's word boundary needs).
pub const MIN_URL_ESCAPES: usize = 1;
/// Decoded bytes produced per field at most: past it, further runs are not decoded (the
/// raw text is still scanned), so a megabyte of base64 costs one bounded pass.
pub const DECODE_BUDGET: usize = 1 << 20;
/// Encoded digits judged before a whole run is decoded.
const PROBE: usize = 64;
/// Levels of decoding (base64 inside base64, URL-encoding of base64, …).
const DECODE_DEPTH: usize = 2;

/// Characters that render as nothing (or only reorder text) and are dropped before
/// matching: zero-width space/joiners, word joiner, BOM, soft hyphen, Mongolian vowel
/// separator, invisible operators, and the bidi marks, embeddings, overrides and isolates
/// (Unicode TR #9).
fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}' | '\u{061C}' | '\u{180E}' | '\u{200B}'..='\u{200F}' | '\u{202A}'..='\u{202E}'
        | '\u{2060}'..='\u{2064}' | '\u{2066}'..='\u{2069}' | '\u{FEFF}')
}

/// Unicode tag characters (U+E0020–U+E007E) mirror ASCII and render as nothing; they are
/// read as the ASCII they mirror ("ASCII smuggling").
fn untag(c: char) -> Option<char> {
    let u = c as u32;
    (0xE0020..=0xE007E).contains(&u).then(|| char::from_u32(u - 0xE0000)).flatten()
}

/// NFKC of `s` without invisible characters, or `None` when that is `s` itself.
pub fn fold(s: &str) -> Option<String> {
    if s.is_ascii() {
        return None;
    }
    let is_tag = |c: char| ('\u{E0000}'..='\u{E007F}').contains(&c);
    if !s.chars().any(|c| is_invisible(c) || is_tag(c))
        && is_nfkc_quick(s.chars()) == IsNormalized::Yes
    {
        return None;
    }
    // Tag characters outside the ASCII mirror (language tag, cancel tag) are dropped.
    let cleaned = s
        .chars()
        .filter(|c| !is_invisible(*c))
        .filter_map(|c| if is_tag(c) { untag(c) } else { Some(c) });
    let out: String = cleaned.nfkc().collect();
    (out != s).then_some(out)
}

/// `s` with its line breaks removed, together with the horizontal whitespace around them,
/// a `\` continuation before them, and JSON's escaped `\n`/`\r` (raw payloads are scanned
/// as serialized JSON). A key wrapped at 64 columns becomes one token again.
pub fn join_lines(s: &str) -> Option<String> {
    join_lines_at(s).map(|(j, _)| j)
}

/// [`join_lines`], with the offsets in the joined text where a break was removed.
fn join_lines_at(s: &str) -> Option<(String, Vec<usize>)> {
    if !s.contains('\n') && !s.contains("\\n") {
        return None;
    }
    let b = s.as_bytes();
    let mut joins = Vec::new();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut last = 0;
    while i < b.len() {
        let brk = match b[i] {
            b'\n' => Some(1),
            b'\\' if matches!(b.get(i + 1), Some(b'n') | Some(b'r')) => Some(2),
            _ => None,
        };
        let Some(len) = brk else {
            i += 1;
            continue;
        };
        // Trim the whitespace (and a continuation backslash) before the break.
        let mut end = i;
        while end > last && matches!(b[end - 1], b' ' | b'\t' | b'\r' | b'\\') {
            end -= 1;
        }
        out.push_str(&s[last..end]);
        joins.push(out.len());
        i += len;
        loop {
            match b.get(i) {
                Some(b' ' | b'\t' | b'\r' | b'\n') => i += 1,
                Some(b'\\') if matches!(b.get(i + 1), Some(b'n') | Some(b'r')) => i += 2,
                _ => break,
            }
        }
        last = i;
    }
    out.push_str(&s[last..]);
    Some((out, joins))
}

/// Base64 digit values by byte, both the standard and the URL-safe alphabet (RFC 4648 §4,
/// §5); [`NOT_B64`] elsewhere. A table: the run scan reads every byte of every field.
const B64: [u8; 256] = {
    let mut t = [NOT_B64; 256];
    let mut i = 0;
    while i < 26 {
        t[b'A' as usize + i] = i as u8;
        t[b'a' as usize + i] = 26 + i as u8;
        i += 1;
    }
    let mut d = 0;
    while d < 10 {
        t[b'0' as usize + d] = 52 + d as u8;
        d += 1;
    }
    t[b'+' as usize] = 62;
    t[b'-' as usize] = 62;
    t[b'/' as usize] = 63;
    t[b'_' as usize] = 63;
    t
};
const NOT_B64: u8 = 0xFF;

fn b64_value(c: u8) -> Option<u8> {
    let v = B64[c as usize];
    (v != NOT_B64).then_some(v)
}

fn is_b64(c: u8) -> bool {
    B64[c as usize] != NOT_B64
}

/// Decodes base64 digits (no padding) starting `skip` digits in; trailing partial bits
/// are dropped.
fn b64_decode(run: &[u8], skip: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(run.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in &run[skip.min(run.len())..] {
        let Some(v) = b64_value(c) else { break };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

/// Decoded bytes worth scanning as text: valid-looking UTF-8, at most 1 in 20 characters a
/// control or replacement character. Binary (a compressed image, a random nonce) is not.
fn as_text(bytes: &[u8]) -> Option<String> {
    is_text(bytes).then(|| String::from_utf8_lossy(bytes).into_owned())
}

/// [`as_text`]'s judgement without building the string (probes are judged and dropped): an
/// invalid sequence counts as the one U+FFFD `from_utf8_lossy` would put there.
fn is_text(bytes: &[u8]) -> bool {
    if bytes.len() < 12 {
        return false;
    }
    let (mut n, mut bad) = (0usize, 0usize);
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            n += 1;
            if c == '\u{FFFD}' || (c.is_control() && !matches!(c, '\n' | '\r' | '\t')) {
                bad += 1;
            }
        }
        if !chunk.invalid().is_empty() {
            n += 1;
            bad += 1;
        }
    }
    bad * 20 <= n
}

/// Appends the decoded text of every long base64 or hex run in `s`, and the URL-decoding of
/// `s` when it has enough `%XX` escapes, spending at most `budget` bytes.
fn decode_runs(s: &str, depth: usize, budget: &mut usize, out: &mut Vec<(Pass, String)>) {
    if depth == 0 || *budget == 0 {
        return;
    }
    let start = out.len();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() && *budget > 0 {
        if !is_b64(b[i]) {
            i += 1;
            continue;
        }
        let j = i + b[i..].iter().take_while(|c| is_b64(**c)).count();
        decode_run(&b[i..j], budget, out);
        i = j;
    }
    decode_url(s, budget, out);
    decode_deeper(start, depth, budget, out);
}

/// As [`decode_runs`] over joined text, for only the runs that a removed line break (at the
/// offsets `joins`) split: every other run of the joined text is a run of the unjoined text
/// too, which the caller decodes. Finds them around each join instead of scanning the text.
fn decode_joined_runs(
    s: &str,
    joins: &[usize],
    depth: usize,
    budget: &mut usize,
    out: &mut Vec<(Pass, String)>,
) {
    if depth == 0 || *budget == 0 {
        return;
    }
    let start = out.len();
    let b = s.as_bytes();
    let mut done_to = 0;
    for &at in joins {
        // A run split at `at` has digits on both sides of it.
        if at < done_to || at == 0 || at >= b.len() || !is_b64(b[at - 1]) || !is_b64(b[at]) {
            continue;
        }
        if *budget == 0 {
            break;
        }
        let from = at - b[..at].iter().rev().take_while(|c| is_b64(**c)).count();
        let to = at + b[at..].iter().take_while(|c| is_b64(**c)).count();
        decode_run(&b[from..to], budget, out);
        done_to = to;
    }
    decode_url(s, budget, out);
    decode_deeper(start, depth, budget, out);
}

/// Decodes one run of base64-alphabet bytes as hex or base64 when it is long enough and
/// decodes to text.
fn decode_run(run: &[u8], budget: &mut usize, out: &mut Vec<(Pass, String)>) {
    if run.len() >= MIN_HEX_RUN && run.iter().all(u8::is_ascii_hexdigit) {
        let even = &run[..run.len() & !1];
        let probe = &even[..even.len().min(PROBE)];
        if hex::decode(probe).is_ok_and(|b| is_text(&b))
            && let Ok(bytes) = hex::decode(even)
            && let Some(t) = as_text(&bytes)
        {
            *budget = budget.saturating_sub(t.len());
            out.push((Pass::Hex, t));
            return;
        }
    }
    if run.len() < MIN_BASE64_RUN {
        return;
    }
    // A run glued to a word ("tokenQUtJQ…") is misaligned: try each of the 4 offsets,
    // judging a short prefix first so a megabyte of binary is rejected after 64 digits.
    let probe = &run[..run.len().min(PROBE)];
    let decoded = (0..4)
        .find(|skip| is_text(&b64_decode(probe, *skip)))
        .and_then(|skip| as_text(&b64_decode(run, skip)));
    if let Some(t) = decoded {
        *budget = budget.saturating_sub(t.len());
        out.push((Pass::Base64, t));
    }
}

/// The URL-decoding of `s` when it has enough `%XX` escapes and fits the budget.
fn decode_url(s: &str, budget: &mut usize, out: &mut Vec<(Pass, String)>) {
    let b = s.as_bytes();
    if s.len() <= *budget && url_escapes(s) >= MIN_URL_ESCAPES {
        let t = percent_decode(b);
        *budget = budget.saturating_sub(t.len());
        out.push((Pass::Url, t));
    }
}

/// Decodes what the decodings from `out[start..]` hold, one level deeper.
fn decode_deeper(start: usize, depth: usize, budget: &mut usize, out: &mut Vec<(Pass, String)>) {
    let end = out.len();
    for k in start..end {
        let inner = out[k].1.clone();
        decode_runs(&inner, depth - 1, budget, out);
    }
}

/// `%XX` escapes in `b`, counted up to [`MIN_URL_ESCAPES`] (all that is asked); the search
/// jumps from `%` to `%` (memchr) instead of judging every 3-byte window. Takes `&str` so
/// no UTF-8 validation pass is repeated per field (no `%` at all costs one memchr).
fn url_escapes(s: &str) -> usize {
    let b = s.as_bytes();
    s.match_indices('%')
        .filter(|(i, _)| {
            b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
        })
        .take(MIN_URL_ESCAPES)
        .count()
}

/// RFC 3986 §2.1 percent-decoding (and `+` as space, as forms send it), lossy UTF-8.
fn percent_decode(b: &[u8]) -> String {
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => match (hex_digit(b[i + 1]), hex_digit(b[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex_digit(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

/// Every rewrite of `s` worth scanning besides `s` itself.
pub fn passes(s: &str) -> Vec<(Pass, String)> {
    passes_with_joins(s).0
}

/// [`passes`], and the offsets in the [`Pass::Joined`] text where a line break was removed
/// (empty when there is no joined pass). Every stretch of the joined text between two such
/// offsets is a substring of the text it was joined from (the folded/unnumbered base), so
/// a caller can tell which keywords the joined text can hold without scanning it.
pub fn passes_with_joins(s: &str) -> (Vec<(Pass, String)>, Vec<usize>) {
    let mut out = Vec::new();
    let folded = fold(s);
    let base = folded.as_deref().unwrap_or(s);
    let unnumbered = crate::review::transcript::strip_line_numbers(base);
    let base2 = unnumbered.as_deref().unwrap_or(base);
    let joined = join_lines_at(base2);
    let mut budget = DECODE_BUDGET;
    let mut decoded = Vec::new();
    match &joined {
        // Runs a line break split are decoded from the joined text; every other run (and
        // those that end at a break) from the unjoined one.
        Some((j, joins)) => {
            decode_joined_runs(j, joins, DECODE_DEPTH, &mut budget, &mut decoded);
            decode_runs(base2, DECODE_DEPTH, &mut budget, &mut decoded);
        }
        None => decode_runs(base2, DECODE_DEPTH, &mut budget, &mut decoded),
    }
    let (joined, join_at) = joined.map_or((None, Vec::new()), |(j, at)| (Some(j), at));
    if let Some(f) = folded {
        out.push((Pass::Normalized, f));
    }
    if let Some(u) = unnumbered {
        out.push((Pass::Unnumbered, u));
    }
    if let Some(j) = joined {
        out.push((Pass::Joined, j));
    }
    for d in decoded {
        if !out.iter().any(|(_, t)| *t == d.1) {
            out.push(d);
        }
    }
    (out, join_at)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// The in-place judgement equals judging the lossy string, as before.
        #[test]
        fn is_text_judges_like_the_lossy_string(
            b in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
            t in "[a-z\u{e9}\u{fffd}\n\u{1}]{0,30}",
        ) {
            let lossy = |b: &[u8]| {
                let s = String::from_utf8_lossy(b);
                let n = s.chars().count();
                let bad = s.chars().filter(|c| *c == '\u{FFFD}'
                    || (c.is_control() && !matches!(c, '\n' | '\r' | '\t'))).count();
                b.len() >= 12 && bad * 20 <= n
            };
            let mut mixed = t.into_bytes();
            mixed.extend_from_slice(&b[..b.len().min(3)]);
            for x in [&b[..], &mixed[..]] {
                proptest::prop_assert_eq!(is_text(x), lossy(x), "{:?}", x);
            }
        }
    }

    #[test]
    fn folding_removes_invisibles_and_applies_nfkc() {
        assert_eq!(fold("AK\u{200B}IA\u{202E}X").unwrap(), "AKIAX");
        assert_eq!(fold("\u{FF21}\u{FF2B}IA").unwrap(), "AKIA");
        assert_eq!(fold("\u{E0041}\u{E004B}").unwrap(), "AK");
        assert_eq!(fold("plain ascii"), None);
        assert_eq!(fold("caf\u{E9} \u{2192}"), None);
    }

    #[test]
    fn joining_removes_breaks_indentation_and_escaped_newlines() {
        assert_eq!(join_lines("AKIAABCD\n    EFGH").unwrap(), "AKIAABCDEFGH");
        assert_eq!(join_lines("ab \\\ncd").unwrap(), "abcd");
        assert_eq!(join_lines("ab\\ncd\\r\\nef").unwrap(), "abcdef");
        assert_eq!(join_lines("one line"), None);
    }

    #[test]
    fn decoding_finds_base64_hex_and_url_runs_but_not_binary() {
        let p = passes("blob: QUtJQVo3UTNGQUtFNFRFU1Q5WFkgaXMgdGhlIGtleQ== end");
        assert!(
            p.iter().any(|(k, t)| *k == Pass::Base64 && t.contains("AKIAZ7Q3FAKE4TEST9XY")),
            "{p:?}"
        );
        let p = passes("x 414b49415a37513346414b453454455354395859 y");
        assert!(p.iter().any(|(k, t)| *k == Pass::Hex && t.starts_with("AKIAZ7Q3")), "{p:?}");
        let p = passes("a=%41%4B%49%41Z7Q3");
        assert!(p.iter().any(|(k, t)| *k == Pass::Url && t == "a=AKIAZ7Q3"), "{p:?}");
        // A git object id is hex but decodes to binary: no pass.
        assert!(passes("commit 9fceb02d0ae598e95dc970b74767f19372d61af8").is_empty());
        assert!(passes("a_really_long_snake_case_identifier_name").is_empty());
    }
}
