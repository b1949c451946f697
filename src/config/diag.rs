//! Diagnostics for configuration files: a byte span turned into `file:line:col`, and the
//! "did you mean" suggestion for unknown keys.

use std::fmt;
use std::ops::Range;

/// One problem (or warning) found in a configuration file, located by line and column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file as the user sees it (`~/.airlock/config.toml`, `/repo/.airlock.toml`).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column, counted in characters.
    pub col: usize,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl Diagnostic {
    /// Locates `span` (byte offsets into `text`) in `file`.
    pub fn at(file: &str, text: &str, span: &Range<usize>, message: impl Into<String>) -> Self {
        let (line, col) = line_col(text, span.start);
        Self { file: file.to_owned(), line, col, message: message.into() }
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.col, self.message)
    }
}

/// A list of diagnostics, one per line (the `Display` of `ConfigError::Invalid`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostics(pub Vec<Diagnostic>);

impl fmt::Display for Diagnostics {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{d}")?;
        }
        Ok(())
    }
}

/// 1-based line and character column of byte `offset` in `text` (clamped to the text, and to
/// the start of a character if it points inside one).
pub fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.bytes().filter(|&b| b == b'\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = before[line_start..].chars().count() + 1;
    (line, col)
}

/// The known key closest to `unknown`, if any is close enough to be a likely typo.
pub fn nearest<'k>(unknown: &str, known: &[&'k str]) -> Option<&'k str> {
    known
        .iter()
        .map(|k| (*k, strsim::jaro_winkler(&unknown.to_ascii_lowercase(), k)))
        .filter(|(_, score)| *score >= 0.8)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(k, _)| k)
}

/// "did you mean `allow`?" or the list of known keys.
pub fn suggestion(unknown: &str, known: &[&str]) -> String {
    match nearest(unknown, known) {
        Some(k) => format!("did you mean `{k}`?"),
        None if known.is_empty() => "remove it".to_owned(),
        None => format!("known keys: {}", known.join(", ")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn line_col_counts_lines_and_characters() {
        let text = "a = 1\n[network]\nallow = [\"é\", \"x\"]\n";
        assert_eq!(line_col(text, 0), (1, 1));
        assert_eq!(line_col(text, 6), (2, 1));
        let x = text.find("\"x\"").unwrap();
        // `allow = ["é", ` is 14 characters but 15 bytes.
        assert_eq!(line_col(text, x), (3, 15));
        assert_eq!(line_col(text, 10_000), (4, 1));
        // Inside the two-byte `é`: snapped back to its start.
        let e = text.find('é').unwrap();
        assert_eq!(line_col(text, e + 1), line_col(text, e));
    }

    #[test]
    fn suggestions_pick_the_nearest_key() {
        let known = ["mode", "allow", "block", "allow_private"];
        assert_eq!(nearest("alow", &known), Some("allow"));
        assert_eq!(nearest("allowprivate", &known), Some("allow_private"));
        assert_eq!(nearest("Block", &known), Some("block"));
        assert_eq!(nearest("zzz", &known), None);
        assert_eq!(suggestion("zzz", &known), "known keys: mode, allow, block, allow_private");
    }
}
