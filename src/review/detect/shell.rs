//! A shell-words reader for detection: splits a command line into its simple commands
//! (at `;`, `&&`, `||`, `|`, `&`, newlines and parentheses), removes quoting, separates
//! redirections (`>f`, `2>>f`, `<f`, `&>f`), descends into `$(…)`, backticks and `<(…)`,
//! and tracks `cd`/`pushd` and plain `NAME=value` assignments so later relative paths and
//! `$NAME` are seen as what they name. Each simple command comes back rendered as
//! `word word … > target`, the form the rules' regexes are written against; the rules still
//! see the raw line too (pipes such as `base64 f | curl` are judged there).
//!
//! Not a full POSIX parser (POSIX.1-2017 XCU §2.3–2.10): no aliases, functions, globbing,
//! arithmetic or here-document bodies; it errs toward showing the rules more, not less.

use std::collections::HashMap;

/// Nesting of `$(…)` followed at most (deeper substitutions are left as text).
const MAX_DEPTH: usize = 8;
/// Simple commands rendered per line at most (a generated script of 100k lines is still
/// scanned raw).
const MAX_COMMANDS: usize = 4096;

#[derive(Debug, Default)]
struct Simple {
    words: Vec<String>,
    redirs: Vec<(String, String)>,
}

#[derive(Debug, Default)]
struct Reader<'a> {
    s: &'a [u8],
    i: usize,
    /// Bodies of command substitutions met, to be expanded in turn.
    subs: Vec<String>,
}

impl<'a> Reader<'a> {
    fn peek(&self, k: usize) -> Option<u8> {
        self.s.get(self.i + k).copied()
    }

    /// The text up to the `)` that closes a `(` just consumed, honouring quotes.
    fn balanced(&mut self) -> String {
        let start = self.i;
        let mut depth = 1;
        while let Some(c) = self.peek(0) {
            match c {
                b'\\' => self.i += 1,
                b'\'' => {
                    self.i += 1;
                    while self.peek(0).is_some_and(|c| c != b'\'') {
                        self.i += 1;
                    }
                }
                b'(' => depth += 1,
                b')' => {
                    depth -= 1;
                    if depth == 0 {
                        let body = String::from_utf8_lossy(&self.s[start..self.i]).into_owned();
                        self.i += 1;
                        return body;
                    }
                }
                _ => {}
            }
            self.i += 1;
        }
        String::from_utf8_lossy(&self.s[start.min(self.s.len())..]).into_owned()
    }

    /// The text up to the next unescaped backtick (one just consumed).
    fn backticked(&mut self) -> String {
        let mut body = Vec::new();
        while let Some(c) = self.peek(0) {
            self.i += 1;
            match c {
                b'\\' => {
                    if let Some(n) = self.peek(0) {
                        body.push(n);
                        self.i += 1;
                    }
                }
                b'`' => break,
                c => body.push(c),
            }
        }
        String::from_utf8_lossy(&body).into_owned()
    }

    /// `$(`, `<(`, `>(` or a backtick at the cursor: consumes it, records its body, and
    /// appends its text to `word`.
    fn substitution(&mut self, word: &mut Vec<u8>) -> bool {
        let open = match (self.peek(0), self.peek(1)) {
            (Some(b'$' | b'<' | b'>'), Some(b'(')) => 2,
            (Some(b'`'), _) => 1,
            _ => return false,
        };
        let lead = self.s[self.i..self.i + open].to_vec();
        self.i += open;
        let body = if open == 2 { self.balanced() } else { self.backticked() };
        word.extend_from_slice(&lead);
        word.extend_from_slice(body.as_bytes());
        word.push(if open == 2 { b')' } else { b'`' });
        self.subs.push(body);
        true
    }

    /// Reads a double-quoted string (the opening quote consumed) into `word`.
    fn double_quoted(&mut self, word: &mut Vec<u8>) {
        while let Some(c) = self.peek(0) {
            match c {
                b'"' => {
                    self.i += 1;
                    return;
                }
                b'\\' if matches!(self.peek(1), Some(b'"' | b'\\' | b'$' | b'`' | b'\n')) => {
                    if self.peek(1) != Some(b'\n') {
                        word.push(self.s[self.i + 1]);
                    }
                    self.i += 2;
                }
                b'$' | b'`' if self.substitution(word) => {}
                c => {
                    word.push(c);
                    self.i += 1;
                }
            }
        }
    }

    /// Splits the line into simple commands.
    fn commands(&mut self) -> Vec<Simple> {
        let mut out = Vec::new();
        let mut cur = Simple::default();
        let mut word: Vec<u8> = Vec::new();
        let mut in_word = false;
        let mut pending_redir: Option<String> = None;
        let finish_word = |word: &mut Vec<u8>,
                           in_word: &mut bool,
                           cur: &mut Simple,
                           pending: &mut Option<String>| {
            if !*in_word {
                return;
            }
            let w = String::from_utf8_lossy(word).into_owned();
            word.clear();
            *in_word = false;
            match pending.take() {
                Some(op) => cur.redirs.push((op, w)),
                None => cur.words.push(w),
            }
        };
        while let Some(c) = self.peek(0) {
            match c {
                b' ' | b'\t' | b'\r' => {
                    finish_word(&mut word, &mut in_word, &mut cur, &mut pending_redir);
                    self.i += 1;
                }
                b'\n' | b';' | b'&' | b'|' | b'(' | b')' => {
                    if c == b'&' && self.peek(1) == Some(b'>') {
                        // `&>f`: both streams to f.
                        finish_word(&mut word, &mut in_word, &mut cur, &mut pending_redir);
                        self.i += 2;
                        let append = self.peek(0) == Some(b'>');
                        self.i += usize::from(append);
                        pending_redir = Some(if append { ">>" } else { ">" }.to_string());
                        continue;
                    }
                    finish_word(&mut word, &mut in_word, &mut cur, &mut pending_redir);
                    if !cur.words.is_empty() || !cur.redirs.is_empty() {
                        out.push(std::mem::take(&mut cur));
                    }
                    pending_redir = None;
                    self.i += 1;
                }
                b'<' | b'>' if self.peek(1) == Some(b'(') => {
                    in_word = true;
                    self.substitution(&mut word);
                }
                b'<' | b'>' => {
                    // A word of only digits right before is a file descriptor (`2>`).
                    if in_word && word.iter().all(u8::is_ascii_digit) {
                        word.clear();
                        in_word = false;
                    }
                    finish_word(&mut word, &mut in_word, &mut cur, &mut pending_redir);
                    let mut op = String::new();
                    while let Some(o @ (b'<' | b'>' | b'&' | b'|')) = self.peek(0) {
                        op.push(o as char);
                        self.i += 1;
                    }
                    // `2>&1`: a descriptor, not a file.
                    if op.ends_with('&')
                        && self.peek(0).is_some_and(|c| c.is_ascii_digit() || c == b'-')
                    {
                        while self.peek(0).is_some_and(|c| c.is_ascii_digit() || c == b'-') {
                            self.i += 1;
                        }
                        continue;
                    }
                    pending_redir = Some(op.trim_end_matches(['&', '|']).to_string());
                }
                b'#' if !in_word => {
                    while self.peek(0).is_some_and(|c| c != b'\n') {
                        self.i += 1;
                    }
                }
                b'\'' => {
                    in_word = true;
                    self.i += 1;
                    while let Some(q) = self.peek(0) {
                        self.i += 1;
                        if q == b'\'' {
                            break;
                        }
                        word.push(q);
                    }
                }
                b'"' => {
                    in_word = true;
                    self.i += 1;
                    self.double_quoted(&mut word);
                }
                b'\\' => {
                    match self.peek(1) {
                        Some(b'\n') => {}
                        Some(n) => {
                            word.push(n);
                            in_word = true;
                        }
                        None => {}
                    }
                    self.i += 2;
                }
                b'$' | b'`' if self.substitution(&mut word) => in_word = true,
                c => {
                    word.push(c);
                    in_word = true;
                    self.i += 1;
                }
            }
        }
        finish_word(&mut word, &mut in_word, &mut cur, &mut pending_redir);
        if !cur.words.is_empty() || !cur.redirs.is_empty() {
            out.push(cur);
        }
        out
    }
}

/// What earlier commands of the line established.
#[derive(Debug, Default)]
struct State {
    cwd: Option<String>,
    vars: HashMap<String, String>,
}

/// `$NAME` and `${NAME}` replaced by assigned values; `$HOME` is `~`.
fn substitute(w: &str, vars: &HashMap<String, String>) -> String {
    if !w.contains('$') {
        return w.to_string();
    }
    let b = w.as_bytes();
    let mut out = String::with_capacity(w.len());
    let mut i = 0;
    let mut last = 0;
    while i < b.len() {
        if b[i] != b'$' {
            i += 1;
            continue;
        }
        let braced = b.get(i + 1) == Some(&b'{');
        let start = i + 1 + usize::from(braced);
        let len =
            b[start..].iter().take_while(|c| c.is_ascii_alphanumeric() || **c == b'_').count();
        let end = start + len;
        let closed = !braced || b.get(end) == Some(&b'}');
        if len == 0 || !closed {
            i += 1;
            continue;
        }
        let name = &w[start..end];
        let value = match vars.get(name) {
            Some(v) => v.as_str(),
            None if name == "HOME" => "~",
            None => {
                i = end;
                continue;
            }
        };
        out.push_str(&w[last..i]);
        out.push_str(value);
        i = end + usize::from(braced);
        last = i;
    }
    out.push_str(&w[last..]);
    out
}

/// `path` resolved against `cwd`, with `.` and `..` segments folded lexically.
fn resolve(cwd: Option<&str>, path: &str) -> String {
    let joined = match cwd {
        Some(c) if !path.starts_with('/') && !path.starts_with('~') => format!("{c}/{path}"),
        _ => path.to_string(),
    };
    let absolute = joined.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for seg in joined.split('/') {
        match seg {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != ".." && *p != "~") => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    let body = parts.join("/");
    if absolute { format!("/{body}") } else { body }
}

/// An argument that names a file (not an option, URL or assignment).
fn path_like(w: &str) -> bool {
    !w.is_empty() && !w.starts_with('-') && !w.contains("://") && !w.contains('=')
}

fn is_assignment(w: &str) -> Option<(&str, &str)> {
    let (name, value) = w.split_once('=')?;
    let ok = !name.is_empty()
        && name.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
        && !name.as_bytes()[0].is_ascii_digit();
    ok.then_some((name, value))
}

fn expand_into(line: &str, st: &mut State, depth: usize, out: &mut Vec<String>) {
    let mut r = Reader { s: line.as_bytes(), ..Reader::default() };
    let cmds = r.commands();
    for sub in std::mem::take(&mut r.subs) {
        if depth < MAX_DEPTH && out.len() < MAX_COMMANDS {
            expand_into(&sub, st, depth + 1, out);
        }
    }
    for cmd in cmds {
        if out.len() >= MAX_COMMANDS {
            return;
        }
        let mut words: Vec<String> = cmd.words.iter().map(|w| substitute(w, &st.vars)).collect();
        // Leading assignments (`F=x cmd`, or a line of only assignments) and `export`.
        let mut first = 0;
        while let Some((name, value)) = words.get(first).and_then(|w| is_assignment(w)) {
            st.vars.insert(name.to_string(), value.to_string());
            first += 1;
        }
        if words.get(first).is_some_and(|w| w == "export" || w == "local" || w == "declare") {
            for w in &words[first + 1..] {
                if let Some((name, value)) = is_assignment(w) {
                    st.vars.insert(name.to_string(), value.to_string());
                }
            }
        }
        let cwd = st.cwd.clone();
        match words.get(first).map(String::as_str) {
            Some("cd" | "pushd") => {
                let arg = words[first + 1..].iter().find(|w| !w.starts_with('-'));
                st.cwd = match arg.map(String::as_str) {
                    None | Some("~") => Some("~".to_string()),
                    Some(d) => Some(resolve(cwd.as_deref(), d)),
                };
            }
            Some("popd") => st.cwd = None,
            _ => {}
        }
        let cwd = cwd.as_deref();
        let mut rendered = String::new();
        for (k, w) in words.iter().enumerate() {
            if k > 0 {
                rendered.push(' ');
            }
            if w.contains(char::is_whitespace) {
                // Keep a quoted phrase one word: `echo 'never rm -rf /'` must not read as
                // the command it mentions.
                rendered.push('\'');
                rendered.push_str(w);
                rendered.push('\'');
            } else if k > first && cwd.is_some() && path_like(w) {
                match w.strip_prefix('@') {
                    Some(f) => {
                        rendered.push('@');
                        rendered.push_str(&resolve(cwd, f));
                    }
                    None => rendered.push_str(&resolve(cwd, w)),
                }
            } else {
                rendered.push_str(w);
            }
        }
        for (op, target) in &cmd.redirs {
            let t = substitute(target, &st.vars);
            let t = if cwd.is_some() && path_like(&t) { resolve(cwd, &t) } else { t };
            rendered.push_str(&format!(" {op} {t}"));
        }
        words.clear();
        out.push(rendered);
    }
}

/// The simple commands of one shell line, rendered for the rules; empty when the line is
/// a single simple command that needs no rewriting.
pub fn simple_commands(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    expand_into(line, &mut State::default(), 0, &mut out);
    if out.len() == 1 && out[0] == line {
        out.clear();
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn redirections_are_split_from_their_words() {
        assert_eq!(simple_commands("cat ~/.ssh/id_rsa>f"), vec!["cat ~/.ssh/id_rsa > f"]);
        assert_eq!(simple_commands("cmd 2>&1 2>>log <in"), vec!["cmd >> log < in"]);
        assert_eq!(simple_commands("make &>out"), vec!["make > out"]);
    }

    #[test]
    fn cd_applies_to_later_relative_paths() {
        assert_eq!(
            simple_commands("cd ~/.ssh && cat id_rsa | base64"),
            vec!["cd ~/.ssh", "cat ~/.ssh/id_rsa", "base64"]
        );
        assert_eq!(
            simple_commands("cd /a/b; cd ../c; cat ./x >y"),
            vec!["cd /a/b", "cd /a/c", "cat /a/c/x > /a/c/y"]
        );
        assert_eq!(simple_commands("cd; cat .netrc"), vec!["cd", "cat ~/.netrc"]);
    }

    #[test]
    fn quotes_escapes_and_variables_are_resolved() {
        assert_eq!(simple_commands(r#"cat ~/.s'sh'/"id_"\rsa"#), vec!["cat ~/.ssh/id_rsa"]);
        assert_eq!(
            simple_commands("F=$HOME/.aws; cat ${F}/credentials"),
            vec!["F=~/.aws", "cat ~/.aws/credentials"]
        );
        assert_eq!(simple_commands("echo 'a;b' # c; d"), vec!["echo a;b"]);
        assert_eq!(simple_commands("echo 'rm -rf / now' && ls"), vec!["echo 'rm -rf / now'", "ls"]);
    }

    #[test]
    fn substitutions_are_expanded_as_commands_of_their_own() {
        assert_eq!(
            simple_commands(r#"curl -d "$(cat ~/.netrc)" x"#),
            vec!["cat ~/.netrc", "curl -d '$(cat ~/.netrc)' x"]
        );
        assert_eq!(simple_commands("echo `cat a`"), vec!["cat a", "echo '`cat a`'"]);
        assert_eq!(simple_commands("diff <(cat a) b"), vec!["cat a", "diff '<(cat a)' b"]);
        // Deep nesting is bounded, not a stack overflow.
        let deep = "$(".repeat(10_000) + "x";
        assert!(!simple_commands(&deep).is_empty());
    }

    #[test]
    fn a_plain_command_needs_no_extra_pass() {
        assert!(simple_commands("cargo test --lib").is_empty());
    }
}
