//! Detection at ingest (DESIGN §8). Per-event rules come from TOML packs — the built-in
//! pack (`rules/builtin.toml`) plus an admin's config dir — and run as: one aho-corasick
//! prefilter over every rule's keywords, then the regex (or structured predicate) of only
//! the rules whose keywords occurred in the field. Aggregate checks are code: bursts of
//! denials, backdating (`ts` more than 5 minutes after `received_at`, or outside the span of
//! its session's records) and `seq` gaps per (session, boot), the last two run when a
//! session's end record arrives.
//!
//! Evasion is met before matching: every field string is also scanned in the rewrites of
//! [`normalize`] (Unicode folding, joined lines, decoded base64/hex/URL runs) and, for
//! commands, as the simple commands [`shell`] parses out of it (redirections, `&&`, `cd`,
//! `$(…)`). False positives are met by each rule's `allow` patterns (documentation example
//! keys, `.env.example`, …): a match overlapping an allowed span is not a hit.
//! [`score_corpus`] measures the rules against the labelled corpus in
//! `tests/fixtures/detect/cases.jsonl` (precision and recall per rule).

pub mod normalize;
pub mod session;
pub mod shell;

use super::correlate::Config as CorrelateConfig;
use super::transcript::{self, FIELDS, View};
use super::{Micros, NewEvent, NewFlag, Severity, Source, StoredEvent, format_micros};
use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use normalize::Pass;
use regex::Regex;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

/// The built-in rule pack, embedded.
pub const BUILTIN_RULES: &str = include_str!("rules/builtin.toml");

/// `ts` later than `received_at` by more than this is backdating (DESIGN §8).
pub const FUTURE_SKEW_US: Micros = 5 * 60 * 1_000_000;
/// Denials within this window of each other count as one burst.
pub const DENIAL_WINDOW_US: Micros = 60 * 1_000_000;
/// Denials in one window that make a burst.
pub const DENIAL_BURST: usize = 10;

/// A rule file that cannot be used; `location` is `file:line:col`.
#[derive(Debug, thiserror::Error)]
pub enum RuleError {
    #[error("{location}: {message}")]
    Invalid { location: String, message: String },
    #[error("cannot read rules from {path}: {source}")]
    Io { path: String, source: std::io::Error },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    #[serde(default)]
    rule: Vec<RuleSpec>,
    /// `[[correlate]]` tables are the correlate pack's ([`super::correlate::Config::apply`]).
    #[serde(default)]
    #[allow(dead_code)]
    correlate: Option<toml::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    id: String,
    title: String,
    severity: String,
    #[serde(default)]
    sources: Vec<String>,
    #[serde(default)]
    fields: Vec<String>,
    #[serde(default)]
    keywords: Vec<String>,
    regex: Option<String>,
    /// Known-benign spans: a regex match overlapping one is not a hit.
    #[serde(default)]
    allow: Vec<String>,
    predicate: Option<PredicateSpec>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct PredicateSpec {
    field: String,
    op: String,
    value: toml::Value,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Op {
    Gt,
    Ge,
    Lt,
    Le,
    Eq,
    Ne,
}

#[derive(Debug, Clone)]
struct Predicate {
    path: Vec<String>,
    op: Op,
    value: Value,
}

impl Predicate {
    fn eval(&self, payload: &Value) -> Option<String> {
        let mut cur = payload;
        for k in &self.path {
            cur = cur.get(k)?;
        }
        let hit = match (cur.as_f64(), self.value.as_f64()) {
            (Some(a), Some(b)) => match self.op {
                Op::Gt => a > b,
                Op::Ge => a >= b,
                Op::Lt => a < b,
                Op::Le => a <= b,
                Op::Eq => a == b,
                Op::Ne => a != b,
            },
            _ => match self.op {
                Op::Eq => cur == &self.value,
                Op::Ne => cur != &self.value,
                _ => false,
            },
        };
        hit.then(|| format!("{} = {}", self.path.join("."), cur))
    }
}

/// One compiled rule.
#[derive(Debug, Clone)]
pub struct Rule {
    pub id: String,
    pub title: String,
    pub severity: Severity,
    sources: Vec<Source>,
    fields: Vec<String>,
    has_keywords: bool,
    regex: Option<Regex>,
    allow: Option<Regex>,
    predicate: Option<Predicate>,
}

impl Rule {
    fn applies_to(&self, s: Source) -> bool {
        self.sources.is_empty() || self.sources.contains(&s)
    }
}

/// The compiled rule set.
#[derive(Debug, Clone)]
pub struct Engine {
    rules: Vec<Rule>,
    ac: Option<AhoCorasick>,
    /// Keyword pattern index → rules using it.
    pattern_rules: Vec<Vec<usize>>,
    /// Per entry of [`FIELDS`]: the prefilter over only the keywords of rules scanning that
    /// field (`None` when no rule does), which [`Engine::scan`] uses.
    fields: Vec<Option<FieldScan>>,
    /// The correlate pack's parameters (`[[correlate]]` tables of the same files).
    correlate: CorrelateConfig,
}

/// One field's keyword prefilter. Only the keywords of the rules that scan the field are in
/// it, so a `text` scan never stops on command keywords (`rm `, `.env`, `curl`) that prose
/// is full of, and aho-corasick's start-byte prefilter can skip further.
#[derive(Debug, Clone)]
struct FieldScan {
    ac: AhoCorasick,
    /// Pattern index → rules using it (all of them scan this field).
    pattern_rules: Vec<Vec<usize>>,
    /// The rules with keywords that scan this field.
    rules: Vec<usize>,
    /// Bit `a * 256 + b` is set when bytes `a`, `b` (ASCII-lowercased) are adjacent in one
    /// of the keywords: a keyword can straddle a join in the joined pass only there.
    pairs: Vec<u64>,
    /// A keyword holds a line break, so it could straddle a stripped line-number prefix.
    newline_keyword: bool,
}

/// Keywords deduplicated case-insensitively, each with the rules (by index) that list it:
/// pattern `i` of the automaton built from `patterns` belongs to `pattern_rules[i]`.
#[derive(Default)]
struct KeywordIndex {
    patterns: Vec<String>,
    pattern_rules: Vec<Vec<usize>>,
    index: BTreeMap<String, usize>,
}

impl KeywordIndex {
    /// Adds `keyword` (lowercased as `key`) for rule `rule`.
    fn add(&mut self, key: String, keyword: &str, rule: usize) {
        let pi = *self.index.entry(key).or_insert_with(|| {
            self.patterns.push(keyword.to_string());
            self.pattern_rules.push(Vec::new());
            self.patterns.len() - 1
        });
        if !self.pattern_rules[pi].contains(&rule) {
            self.pattern_rules[pi].push(rule);
        }
    }
}

impl FieldScan {
    fn build(
        keywords: &[Vec<String>],
        rules: &[Rule],
        field: &str,
    ) -> Result<Option<Self>, RuleError> {
        let mut keyword_index = KeywordIndex::default();
        let mut field_rules = Vec::new();
        let mut pairs = vec![0u64; 65536 / 64];
        let mut newline_keyword = false;
        for (ri, kws) in keywords.iter().enumerate() {
            let r = &rules[ri];
            if kws.is_empty() || !r.fields.iter().any(|f| f == field) {
                continue;
            }
            field_rules.push(ri);
            for k in kws {
                let key = k.to_ascii_lowercase();
                for w in key.as_bytes().windows(2) {
                    let bit = usize::from(w[0]) * 256 + usize::from(w[1]);
                    pairs[bit / 64] |= 1 << (bit % 64);
                }
                newline_keyword |= key.contains('\n');
                keyword_index.add(key, k, ri);
            }
        }
        let KeywordIndex { patterns, pattern_rules, .. } = keyword_index;
        if patterns.is_empty() {
            return Ok(None);
        }
        let ac = keyword_automaton(&patterns)?;
        Ok(Some(Self { ac, pattern_rules, rules: field_rules, pairs, newline_keyword }))
    }

    /// Whether a keyword can straddle offset `at` of `text` (the bytes either side of it are
    /// adjacent in some keyword).
    fn may_straddle(&self, text: &[u8], at: usize) -> bool {
        if at == 0 || at >= text.len() {
            return false;
        }
        let bit = usize::from(text[at - 1].to_ascii_lowercase()) * 256
            + usize::from(text[at].to_ascii_lowercase());
        self.pairs[bit / 64] & (1 << (bit % 64)) != 0
    }
}

/// The keyword automaton: ASCII case-insensitive, every (overlapping) occurrence reported.
fn keyword_automaton(patterns: &[String]) -> Result<AhoCorasick, RuleError> {
    AhoCorasick::builder()
        .ascii_case_insensitive(true)
        .match_kind(MatchKind::Standard)
        .kind(Some(AhoCorasickKind::DFA))
        .build(patterns)
        .map_err(|e| RuleError::Invalid {
            location: "rules".into(),
            message: format!("keyword set: {e}"),
        })
}

/// A rule that matched one event.
#[derive(Debug, Clone, PartialEq)]
pub struct Hit {
    pub rule: usize,
    pub detail: String,
}

fn toml_to_json(v: &toml::Value) -> Value {
    match v {
        toml::Value::String(s) => Value::String(s.clone()),
        toml::Value::Integer(i) => Value::from(*i),
        toml::Value::Float(f) => Value::from(*f),
        toml::Value::Boolean(b) => Value::Bool(*b),
        other => Value::String(other.to_string()),
    }
}

fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, col)
}

/// Parses one rule file; `name` is used in error locations.
fn parse_rules(name: &str, text: &str) -> Result<Vec<(Vec<String>, Rule)>, RuleError> {
    let file: RuleFile = toml::from_str(text).map_err(|e| {
        let (l, c) = e.span().map_or((1, 1), |s| line_col(text, s.start));
        RuleError::Invalid { location: format!("{name}:{l}:{c}"), message: e.message().to_string() }
    })?;
    let mut out = Vec::new();
    for spec in file.rule {
        // Locate the rule's `id = "…"` line for messages about its values.
        let at = text.find(&format!("\"{}\"", spec.id)).unwrap_or(0);
        let (l, c) = line_col(text, at);
        let bad = |m: String| RuleError::Invalid {
            location: format!("{name}:{l}:{c}"),
            message: format!("rule {:?}: {m}", spec.id),
        };
        let severity = spec.severity.parse().map_err(bad)?;
        let mut sources = Vec::new();
        for s in &spec.sources {
            sources.push(s.parse::<Source>().map_err(bad)?);
        }
        for f in &spec.fields {
            if !FIELDS.contains(&f.as_str()) {
                return Err(bad(format!(
                    "unknown field {f:?}; expected one of {}",
                    FIELDS.join(", ")
                )));
            }
        }
        let regex = spec
            .regex
            .as_deref()
            .map(|r| Regex::new(r).map_err(|e| bad(format!("bad regex: {e}"))))
            .transpose()?;
        let allow = if spec.allow.is_empty() {
            None
        } else {
            if regex.is_none() {
                return Err(bad("`allow` needs a `regex` to qualify".into()));
            }
            let alternation =
                spec.allow.iter().map(|a| format!("(?:{a})")).collect::<Vec<_>>().join("|");
            Some(Regex::new(&alternation).map_err(|e| bad(format!("bad allow pattern: {e}")))?)
        };
        let predicate = spec
            .predicate
            .as_ref()
            .map(|p| {
                let op = match p.op.as_str() {
                    "gt" => Op::Gt,
                    "ge" => Op::Ge,
                    "lt" => Op::Lt,
                    "le" => Op::Le,
                    "eq" => Op::Eq,
                    "ne" => Op::Ne,
                    other => {
                        return Err(bad(format!(
                            "unknown predicate op {other:?}; expected gt, ge, lt, le, eq or ne"
                        )));
                    }
                };
                Ok(Predicate {
                    path: p.field.split('.').map(str::to_string).collect(),
                    op,
                    value: toml_to_json(&p.value),
                })
            })
            .transpose()?;
        if regex.is_none() && predicate.is_none() && spec.keywords.is_empty() {
            return Err(bad("needs keywords, a regex or a predicate".into()));
        }
        if regex.is_some() && spec.fields.is_empty() {
            return Err(bad("a regex rule needs `fields` to scan".into()));
        }
        if regex.is_some() && spec.keywords.is_empty() {
            return Err(bad("a regex rule needs `keywords` for the prefilter".into()));
        }
        out.push((
            spec.keywords,
            Rule {
                id: spec.id,
                title: spec.title,
                severity,
                sources,
                fields: spec.fields,
                has_keywords: false,
                regex,
                allow,
                predicate,
            },
        ));
    }
    Ok(out
        .into_iter()
        .map(|(k, mut r)| {
            r.has_keywords = !k.is_empty();
            (k, r)
        })
        .collect())
}

impl Engine {
    /// The built-in pack only.
    pub fn builtin() -> Result<Self, RuleError> {
        Self::from_sources(&[("builtin.toml".into(), BUILTIN_RULES.to_string())])
    }

    /// The built-in pack plus every `*.toml` in `dir` (sorted by name).
    pub fn with_dir(dir: Option<&Path>) -> Result<Self, RuleError> {
        let mut files = vec![("builtin.toml".to_string(), BUILTIN_RULES.to_string())];
        if let Some(dir) = dir {
            let io = |e| RuleError::Io { path: dir.display().to_string(), source: e };
            let mut paths: Vec<_> = std::fs::read_dir(dir)
                .map_err(io)?
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "toml"))
                .collect();
            paths.sort();
            for p in paths {
                let text = std::fs::read_to_string(&p)
                    .map_err(|e| RuleError::Io { path: p.display().to_string(), source: e })?;
                files.push((p.display().to_string(), text));
            }
        }
        Self::from_sources(&files)
    }

    /// Compiles rule files given as (name, text).
    pub fn from_sources(files: &[(String, String)]) -> Result<Self, RuleError> {
        let mut rules = Vec::new();
        let mut keywords: Vec<Vec<String>> = Vec::new();
        let mut seen = HashSet::new();
        let mut correlate = CorrelateConfig::builtin();
        for (name, text) in files {
            correlate.apply(name, text)?;
            for (k, r) in parse_rules(name, text)? {
                if !seen.insert(r.id.clone()) {
                    return Err(RuleError::Invalid {
                        location: name.clone(),
                        message: format!("duplicate rule id {:?}", r.id),
                    });
                }
                rules.push(r);
                keywords.push(k);
            }
        }
        let mut keyword_index = KeywordIndex::default();
        for (ri, kws) in keywords.iter().enumerate() {
            for k in kws {
                let key = k.to_ascii_lowercase();
                keyword_index.add(key, k, ri);
            }
        }
        let KeywordIndex { patterns, pattern_rules, .. } = keyword_index;
        let ac = if patterns.is_empty() { None } else { Some(keyword_automaton(&patterns)?) };
        let fields = FIELDS
            .iter()
            .map(|f| FieldScan::build(&keywords, &rules, f))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { rules, ac, pattern_rules, fields, correlate })
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// The correlate pack's parameters.
    pub fn correlate(&self) -> &CorrelateConfig {
        &self.correlate
    }

    /// This engine with the correlate pack's parameters replaced (the ingest bench's on/off).
    pub fn with_correlate(mut self, config: CorrelateConfig) -> Self {
        self.correlate = config;
        self
    }

    /// Runs every per-event rule over one event's view and payload: each field string as
    /// written and in every rewrite of it ([`normalize::passes`], and for commands
    /// [`shell::simple_commands`]); a rule hits at most once per event.
    ///
    /// Gives exactly the hits of [`Engine::scan_every_pass`] (a property test holds it to
    /// that), faster: each field is searched only for its own rules' keywords, and the
    /// line-number-stripped and wrapped-lines-joined rewrites — which only delete bytes — are
    /// not searched when no keyword can occur in them: every keyword they can hold is one
    /// the text they came from holds, unless it straddles a deletion (for the joined text,
    /// a join whose two neighbouring bytes are adjacent in some keyword; for the stripped
    /// text, only a keyword with a line break), and every rule such keywords name is done.
    pub fn scan(&self, source: Source, view: &View, payload: &Value) -> Vec<Hit> {
        let mut hits: Vec<Hit> = Vec::new();
        let mut done = vec![false; self.rules.len()];
        for (fi, field) in FIELDS.iter().enumerate() {
            let Some(fs) = self.fields.get(fi).and_then(Option::as_ref) else { continue };
            for s in view.field(field) {
                if !fs.rules.iter().any(|&ri| !done[ri] && self.rules[ri].applies_to(source)) {
                    break;
                }
                let mut st = ScanState { source, field, payload, done: &mut done, hits: &mut hits };
                self.scan_string(fs, &mut st, s);
            }
        }
        self.predicates_only(source, payload, &done, &mut hits);
        hits
    }

    /// One field string and its rewrites, in [`Engine::scan_every_pass`]'s order.
    fn scan_string(&self, fs: &FieldScan, st: &mut ScanState<'_>, s: &str) {
        let found = self.keyword_rules(fs, st.source, s);
        self.confirm(st, Pass::Raw, s, &found);
        let (mut extra, joins) = normalize::passes_with_joins(s);
        if st.field == "command" {
            let base =
                extra.iter().find(|(p, _)| *p == Pass::Normalized).map_or(s, |(_, t)| t.as_str());
            extra.extend(shell::simple_commands(base).into_iter().map(|c| (Pass::Shell, c)));
        }
        // Rules named by a keyword of the text the next deleting rewrite is made from (a
        // superset when that text was itself skipped).
        let mut base_found = found;
        for (pass, text) in &extra {
            let all_done = |f: &[usize]| f.iter().all(|&ri| st.done[ri]);
            let skip = match pass {
                Pass::Unnumbered => !fs.newline_keyword && all_done(&base_found),
                Pass::Joined => {
                    all_done(&base_found)
                        && !joins.iter().any(|&at| fs.may_straddle(text.as_bytes(), at))
                }
                _ => false,
            };
            if skip {
                continue;
            }
            let found = self.keyword_rules(fs, st.source, text);
            self.confirm(st, *pass, text, &found);
            if matches!(pass, Pass::Normalized | Pass::Unnumbered) {
                base_found = found;
            }
        }
    }

    /// The rules (for this source) with a keyword in `text`, in order of first occurrence.
    fn keyword_rules(&self, fs: &FieldScan, source: Source, text: &str) -> Vec<usize> {
        let mut found: Vec<usize> = Vec::new();
        for m in fs.ac.find_overlapping_iter(text) {
            for &ri in &fs.pattern_rules[m.pattern().as_usize()] {
                if !found.contains(&ri) && self.rules[ri].applies_to(source) {
                    found.push(ri);
                }
            }
        }
        found
    }

    /// Runs the regex (and predicate) of each not-yet-done rule in `found` over `text`.
    fn confirm(&self, st: &mut ScanState<'_>, pass: Pass, text: &str, found: &[usize]) {
        for &ri in found {
            if st.done[ri] {
                continue;
            }
            let r = &self.rules[ri];
            let field = st.field;
            let hit = match &r.regex {
                None => Some(format!("keyword in `{field}`{}", pass.label())),
                Some(re) => find(re, r.allow.as_ref(), text)
                    .map(|m| format!("match in `{field}`{}: {m}", pass.label())),
            };
            let pred_ok = r.predicate.as_ref().is_none_or(|p| p.eval(st.payload).is_some());
            if let Some(d) = hit.filter(|_| pred_ok) {
                st.done[ri] = true;
                st.hits.push(Hit { rule: ri, detail: d });
            }
        }
    }

    /// Rules without keywords: their predicate alone decides.
    fn predicates_only(&self, source: Source, payload: &Value, done: &[bool], hits: &mut Vec<Hit>) {
        for (ri, r) in self.rules.iter().enumerate() {
            if done[ri] || r.has_keywords || !r.applies_to(source) {
                continue;
            }
            if let Some(d) = r.predicate.as_ref().and_then(|p| p.eval(payload)) {
                hits.push(Hit { rule: ri, detail: d });
            }
        }
    }

    /// The reference scan [`Engine::scan`] must equal: one prefilter over every rule's
    /// keywords, run over the raw text and every rewrite, no selection. Kept for the
    /// property test and the bench (what the selection buys, same run).
    pub fn scan_every_pass(&self, source: Source, view: &View, payload: &Value) -> Vec<Hit> {
        let mut hits: Vec<Hit> = Vec::new();
        let mut done = vec![false; self.rules.len()];
        if let Some(ac) = &self.ac {
            let mut cand: Vec<usize> = Vec::new();
            for field in FIELDS {
                let wanted = |ri: usize| {
                    let r = &self.rules[ri];
                    r.has_keywords && r.applies_to(source) && r.fields.iter().any(|f| f == field)
                };
                if !(0..self.rules.len()).any(|ri| !done[ri] && wanted(ri)) {
                    continue;
                }
                for s in view.field(field) {
                    let mut extra = normalize::passes(s);
                    if *field == "command" {
                        let base = extra
                            .iter()
                            .find(|(p, _)| *p == Pass::Normalized)
                            .map_or(s.as_str(), |(_, t)| t.as_str());
                        let cmds = shell::simple_commands(base);
                        extra.extend(cmds.into_iter().map(|c| (Pass::Shell, c)));
                    }
                    let texts = std::iter::once((Pass::Raw, s.as_str()))
                        .chain(extra.iter().map(|(p, t)| (*p, t.as_str())));
                    for (pass, text) in texts {
                        cand.clear();
                        for m in ac.find_overlapping_iter(text) {
                            for &ri in &self.pattern_rules[m.pattern().as_usize()] {
                                if !done[ri] && !cand.contains(&ri) && wanted(ri) {
                                    cand.push(ri);
                                }
                            }
                        }
                        for &ri in &cand {
                            let r = &self.rules[ri];
                            let found = match &r.regex {
                                None => Some(format!("keyword in `{field}`{}", pass.label())),
                                Some(re) => find(re, r.allow.as_ref(), text)
                                    .map(|m| format!("match in `{field}`{}: {m}", pass.label())),
                            };
                            let pred_ok =
                                r.predicate.as_ref().is_none_or(|p| p.eval(payload).is_some());
                            if let Some(d) = found.filter(|_| pred_ok) {
                                done[ri] = true;
                                hits.push(Hit { rule: ri, detail: d });
                            }
                        }
                    }
                }
            }
        }
        self.predicates_only(source, payload, &done, &mut hits);
        hits
    }
}

/// What one [`Engine::scan`] carries from string to string.
struct ScanState<'a> {
    source: Source,
    field: &'a str,
    payload: &'a Value,
    done: &'a mut Vec<bool>,
    hits: &'a mut Vec<Hit>,
}

/// Matches tried per string before giving up on finding one outside the allowed spans.
const MAX_ALLOWED_MATCHES: usize = 64;

/// A redacted description of the first match of `re` in `s` that overlaps no match of
/// `allow`: never the secret itself.
fn find(re: &Regex, allow: Option<&Regex>, s: &str) -> Option<String> {
    let mut allowed: Option<Vec<std::ops::Range<usize>>> = None;
    let mut at = 0;
    for _ in 0..MAX_ALLOWED_MATCHES {
        let m = re.find_at(s, at)?;
        let benign = match allow {
            None => false,
            Some(a) => allowed
                .get_or_insert_with(|| a.find_iter(s).map(|x| x.range()).collect())
                .iter()
                .any(|r| r.start < m.end() && m.start() < r.end),
        };
        if !benign {
            let t = m.as_str();
            let head: String = t.chars().take(6).collect();
            return Some(format!("{head}… ({} chars)", t.chars().count()));
        }
        // Retry one character later: the allowed match may have swallowed the delimiter
        // a real match right after it needs (the regex crate has no look-around).
        at = m.start() + s[m.start()..].chars().next().map_or(1, char::len_utf8);
    }
    None
}

/// One rule's results over the labelled corpus.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuleScore {
    pub rule: String,
    /// Positives found.
    pub true_pos: usize,
    /// Negatives flagged.
    pub false_pos: usize,
    /// Positives missed.
    pub false_neg: usize,
    /// Negatives left alone.
    pub true_neg: usize,
}

impl RuleScore {
    /// Of what the rule flagged, the share that was meant (1 when it flagged nothing).
    pub fn precision(&self) -> f64 {
        let flagged = self.true_pos + self.false_pos;
        if flagged == 0 { 1.0 } else { self.true_pos as f64 / flagged as f64 }
    }

    /// Of what the rule should flag, the share it did (1 when there was nothing to find).
    pub fn recall(&self) -> f64 {
        let meant = self.true_pos + self.false_neg;
        if meant == 0 { 1.0 } else { self.true_pos as f64 / meant as f64 }
    }
}

/// The corpus scored: per rule (in rule order), and one line per case judged wrongly.
#[derive(Debug, Clone, Default)]
pub struct CorpusScore {
    pub rules: Vec<RuleScore>,
    pub wrong: Vec<String>,
    pub cases: usize,
}

/// A corpus that cannot be read; `line` is 1-based.
#[derive(Debug, thiserror::Error)]
#[error(
    "detection corpus line {line}: {message} (each line is {{\"rule\", \"expect\", \"source\", \"why\", \"payload\"}})"
)]
pub struct CorpusError {
    pub line: usize,
    pub message: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CorpusCase {
    rule: String,
    expect: bool,
    source: String,
    why: String,
    payload: Value,
}

/// Scores `engine` on a labelled corpus (JSON lines: `rule` the case is about, `expect`
/// whether that rule should hit, `source`, a one-line `why`, and the `payload`). A case
/// counts only for its own rule; every case whose rule is not among the engine's, or whose
/// `why` is empty, is an error.
pub fn score_corpus(engine: &Engine, jsonl: &str) -> Result<CorpusScore, CorpusError> {
    let mut score = CorpusScore {
        rules: engine
            .rules()
            .iter()
            .map(|r| RuleScore { rule: r.id.clone(), ..RuleScore::default() })
            .collect(),
        ..CorpusScore::default()
    };
    for (n, line) in jsonl.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |message: String| CorpusError { line: n + 1, message };
        let case: CorpusCase = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
        if case.why.trim().is_empty() {
            return Err(bad("`why` is empty; say in one line what the case shows".into()));
        }
        let source: Source = case.source.parse().map_err(bad)?;
        let Some(ri) = engine.rules().iter().position(|r| r.id == case.rule) else {
            return Err(bad(format!("unknown rule {:?}", case.rule)));
        };
        let view = transcript::view(source, &case.payload);
        let hit = engine.scan(source, &view, &case.payload).iter().any(|h| h.rule == ri);
        let r = &mut score.rules[ri];
        match (case.expect, hit) {
            (true, true) => r.true_pos += 1,
            (false, false) => r.true_neg += 1,
            (true, false) => r.false_neg += 1,
            (false, true) => r.false_pos += 1,
        }
        if case.expect != hit {
            let missed = if hit { "flagged a negative" } else { "missed a positive" };
            score.wrong.push(format!("line {}: {} {missed}: {}", n + 1, case.rule, case.why));
        }
        score.cases += 1;
    }
    Ok(score)
}

/// Deterministic flag id so re-running detection never duplicates a flag.
pub fn flag_id(parts: &[&str]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update([0]);
    }
    hex::encode(&h.finalize()[..16])
}

/// One created event handed to detection.
#[derive(Debug, Clone, Copy)]
pub struct Created<'a> {
    pub pk: i64,
    pub event: &'a NewEvent,
    pub payload: &'a Value,
    pub received_at: Micros,
}

impl Engine {
    /// Per-event rules, future-dated `ts` and denial bursts over one ingested batch.
    pub fn detect_batch(&self, user_id: &str, created: &[Created<'_>]) -> Vec<NewFlag> {
        let mut flags = Vec::new();
        for c in created {
            // A transcript line's own `session` is the agent's; its flag names the Airlock
            // session whose end record covered it when there is one, so the flag links to
            // the session's drill-down (records, egress and transcript together).
            let flag_session = c.event.airlock_session.clone().or_else(|| c.event.session.clone());
            let view = transcript::view(c.event.source, c.payload);
            for hit in self.scan(c.event.source, &view, c.payload) {
                let r = &self.rules[hit.rule];
                flags.push(NewFlag {
                    id: flag_id(&[&r.id, user_id, c.event.source.as_str(), &c.event.id]),
                    rule_id: r.id.clone(),
                    title: r.title.clone(),
                    severity: r.severity,
                    user_id: user_id.to_string(),
                    session: flag_session.clone(),
                    detail: hit.detail,
                    event_pks: vec![c.pk],
                });
            }
            if c.event.ts > c.received_at + FUTURE_SKEW_US {
                flags.push(NewFlag {
                    id: flag_id(&[
                        "timing.backdated",
                        user_id,
                        c.event.source.as_str(),
                        &c.event.id,
                    ]),
                    rule_id: "timing.backdated".into(),
                    title: "Event timestamp later than the server's receipt".into(),
                    severity: Severity::Medium,
                    user_id: user_id.to_string(),
                    session: flag_session.clone(),
                    detail: format!(
                        "ts {} is more than 5 minutes after received_at {}",
                        format_micros(c.event.ts),
                        format_micros(c.received_at)
                    ),
                    event_pks: vec![c.pk],
                });
            }
        }
        flags.extend(denial_bursts(user_id, created));
        flags
    }
}

/// Egress `type`s whose lines record no connection attempt (docs/audit-format.md, "Line kinds").
const NOT_ATTEMPTS: &[&str] = &["gate", "phase", "stop"];

/// Denied egress attempts per session within [`DENIAL_WINDOW_US`]: a `suppressed` line counts
/// as the exact number of attempts its `seqs` name (docs/audit-format.md), every other
/// denial as one.
fn denial_bursts(user_id: &str, created: &[Created<'_>]) -> Vec<NewFlag> {
    // (ts, pk, attempts)
    let mut by_session: BTreeMap<&str, Vec<(Micros, i64, u64)>> = BTreeMap::new();
    for c in created {
        // Only attempts count: a gate's step lines (type `gate`; the attempt's own line counts),
        // a phase switch and a session stop are `allowed: false` but refuse nothing.
        if c.event.source == Source::Egress
            && !NOT_ATTEMPTS.contains(&c.event.kind.as_str())
            && c.payload.get("allowed").and_then(Value::as_bool) == Some(false)
        {
            let attempts = session::suppressed_seqs(c.payload)
                .map_or(1, |r| session::suppressed_count(&r).max(1));
            by_session
                .entry(c.event.session.as_deref().unwrap_or(""))
                .or_default()
                .push((c.event.ts, c.pk, attempts));
        }
    }
    let mut flags = Vec::new();
    for (session, mut ds) in by_session {
        let total: u64 = ds.iter().map(|d| d.2).sum();
        if total < DENIAL_BURST as u64 {
            continue;
        }
        ds.sort_unstable();
        let mut start = 0;
        let mut in_window = 0u64;
        // (start, end, attempts) of the window with the most attempts.
        let mut best: Option<(usize, usize, u64)> = None;
        for end in 0..ds.len() {
            in_window += ds[end].2;
            while ds[end].0 - ds[start].0 > DENIAL_WINDOW_US {
                in_window -= ds[start].2;
                start += 1;
            }
            if in_window >= DENIAL_BURST as u64 && best.is_none_or(|(_, _, n)| in_window > n) {
                best = Some((start, end, in_window));
            }
        }
        if let Some((s, e, attempts)) = best {
            let pks: Vec<i64> = ds[s..=e].iter().map(|d| d.1).collect();
            let first = pks[0].to_string();
            flags.push(NewFlag {
                id: flag_id(&["egress.denial-burst", user_id, session, &first]),
                rule_id: "egress.denial-burst".into(),
                title: "Burst of denied connection attempts".into(),
                severity: Severity::Medium,
                user_id: user_id.to_string(),
                session: (!session.is_empty()).then(|| session.to_string()),
                detail: format!("{attempts} denials within 60 s"),
                event_pks: pks,
            });
        }
    }
    flags
}

/// Span and gap checks for one finished session held in memory (the stores stream a
/// session through [`session::SessionScan`] instead; this is the same checks over a slice).
pub fn session_checks(user_id: &str, session: &str, events: &[StoredEvent]) -> Vec<NewFlag> {
    session::check_all(user_id, session, events)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const CASES: &str = include_str!("../../tests/fixtures/detect/cases.jsonl");

    fn hits(engine: &Engine, source: Source, payload: &Value) -> Vec<String> {
        let view = transcript::view(source, payload);
        engine
            .scan(source, &view, payload)
            .into_iter()
            .map(|h| engine.rules()[h.rule].id.clone())
            .collect()
    }

    /// The labelled corpus: at least 200 cases, every built-in rule with positives and
    /// negatives, and not one case judged wrongly (a regression in any rule fails here).
    #[test]
    fn the_labelled_corpus_is_judged_without_a_miss() {
        let engine = Engine::builtin().unwrap();
        let score = score_corpus(&engine, CASES).unwrap();
        assert!(score.cases >= 200, "corpus has only {} cases", score.cases);
        assert!(score.wrong.is_empty(), "{} wrong:\n{}", score.wrong.len(), score.wrong.join("\n"));
        for r in &score.rules {
            assert!(r.true_pos > 0, "rule {} has no true-positive case", r.rule);
            assert!(r.true_neg > 0, "rule {} has no true-negative case", r.rule);
        }
    }

    #[test]
    fn a_corpus_case_needs_a_why_and_a_known_rule() {
        let engine = Engine::builtin().unwrap();
        let no_why = r#"{"rule":"secret.stripe-key","expect":false,"source":"external","why":" ","payload":{}}"#;
        let e = score_corpus(&engine, no_why).unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("why"), "{e}");
        let unknown =
            format!("\n{}", no_why.replace("secret.stripe-key", "nope").replace("\" \"", "\"x\""));
        let e = score_corpus(&engine, &unknown).unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("unknown rule"), "{e}");
    }

    #[test]
    fn details_never_contain_the_secret() {
        let engine = Engine::builtin().unwrap();
        let secret = "sk_live_abcdefghijklmnop0000";
        let p = serde_json::json!({"type":"user","message":{"content": format!("key {secret}")}});
        let view = transcript::view(Source::Claude, &p);
        let h = engine.scan(Source::Claude, &view, &p);
        assert_eq!(h.len(), 1);
        assert!(!h[0].detail.contains(secret), "{}", h[0].detail);
    }

    #[test]
    fn a_hit_names_the_rewrite_it_was_found_in_and_not_the_secret() {
        let engine = Engine::builtin().unwrap();
        // base64 of "key sk_live_abcdefghijklmnop0000".
        let p = serde_json::json!({"note": "a2V5IHNrX2xpdmVfYWJjZGVmZ2hpamtsbW5vcDAwMDA="});
        let view = transcript::view(Source::External, &p);
        let h = engine.scan(Source::External, &view, &p);
        assert_eq!(h.len(), 1, "{h:?}");
        assert!(h[0].detail.contains("(base64-decoded)"), "{}", h[0].detail);
        assert!(!h[0].detail.contains("abcdefghijklmnop"), "{}", h[0].detail);
        let p = serde_json::json!({"type":"assistant","message":{"content":[{"type":"tool_use",
            "name":"Bash","input":{"command":"cd ~/.ssh && cat id_rsa"}}]}});
        let view = transcript::view(Source::Claude, &p);
        let h = engine.scan(Source::Claude, &view, &p);
        assert!(h.iter().any(|h| h.detail.contains("(parsed shell command)")), "{h:?}");
    }

    #[test]
    fn an_allowed_span_does_not_hide_a_real_match_right_after_it() {
        let engine = Engine::builtin().unwrap();
        let p = serde_json::json!({"type":"assistant","message":{"content":[{"type":"tool_use",
            "name":"Bash","input":{"command":"cat .env.example .env"}}]}});
        assert_eq!(hits(&engine, Source::Claude, &p), vec!["access.credential-file".to_string()]);
        let p = serde_json::json!({"type":"assistant","message":{"content":[{"type":"tool_use",
            "name":"Bash","input":{"command":"cat .env.example"}}]}});
        assert!(hits(&engine, Source::Claude, &p).is_empty());
    }

    /// Pieces the random field strings are made of: keywords and their halves (so a line
    /// break or a stripped `N→` prefix can fall inside one), secrets, encodings of them,
    /// line breaks of every kind the join removes, invisible and fullwidth characters, shell
    /// syntax, and filler.
    const PIECES: &[&str] = &[
        "sk_li",
        "ve_",
        "sk_live_",
        "abcdefghijklmnop0000",
        "AK",
        "IA",
        "AKIA",
        "Z7Q3FAKE4TEST9XY",
        "IOSFODNN7EXAMPLE",
        "gh",
        "p_",
        "0123456789abcdefghijklmnopqrstuvwxyz",
        "xoxb-",
        "1234567890-abc",
        "PRIVATE",
        " KEY-----",
        "-----BEGIN RSA",
        "\n",
        "\n  ",
        " \\\n",
        "\\n",
        "\\r\\n",
        "\r\n",
        "    ",
        "\t",
        "     3\u{2192}",
        "12\u{2192}",
        "\u{2192}",
        "\u{200B}",
        "\u{202E}",
        "\u{FF21}\u{FF2B}",
        "\u{E0041}",
        "caf\u{E9}",
        "%41%4B",
        "%3D",
        "%",
        "+",
        "=",
        "a2V5IHNrX2xpdmVfYWJjZGVmZ2hpamtsbW5vcDAwMDA=",
        "QUtJQVo3UTNGQUtFNFRFU1Q5WFk=",
        "414b49415a37513346414b453454455354395859",
        "cd ~/.ssh && cat id_rsa",
        "cat ",
        ".en",
        "v",
        ".env",
        ".env.example",
        " | ",
        "; ",
        "$(cat f)",
        "`",
        "curl -d @",
        "rm -rf /",
        "git push --force",
        "ab",
        "cd",
        " ",
        "x",
        "aws_secret_access_key = ",
        "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzzzzzzzzzz",
        // A line break and a Read line-number prefix inside a keyword or a secret.
        "ab\n",
        "  7\u{2192}cd",
        "sk_live_abc\n",
        "2\u{2192}defghijklmnop0000",
    ];

    fn engine_with_odd_keywords() -> Engine {
        // An admin rule whose keyword holds a line break, and one with a non-ASCII keyword:
        // the cases where a stripped prefix or a join can split a keyword differently.
        let odd = "[[rule]]\nid = \"t.nl\"\ntitle = \"t\"\nseverity = \"low\"\nfields = [\"text\", \"command\"]\nkeywords = [\"ab\\ncd\", \"x\u{2192}\"]\n";
        Engine::from_sources(&[
            ("builtin.toml".into(), BUILTIN_RULES.into()),
            ("odd.toml".into(), odd.into()),
        ])
        .unwrap()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1000))]
        /// The selection in `scan` (per-field keywords, skipped rewrites) is safe: on random
        /// field strings it gives exactly the hits, details included, of the full scan.
        #[test]
        fn the_fast_scan_equals_the_full_scan(
            text in proptest::collection::vec(proptest::collection::vec(0..PIECES.len(), 0..12), 0..3),
            command in proptest::collection::vec(proptest::collection::vec(0..PIECES.len(), 0..10), 0..3),
            file_read in proptest::collection::vec(proptest::collection::vec(0..PIECES.len(), 0..4), 0..2),
            src in 0..3usize,
        ) {
            let join = |v: &Vec<Vec<usize>>| -> Vec<String> {
                v.iter().map(|ps| ps.iter().map(|&i| PIECES[i]).collect()).collect()
            };
            let view = View {
                kind: "assistant".into(),
                text: join(&text),
                command: join(&command),
                file_read: join(&file_read),
                ..View::default()
            };
            let source = [Source::Claude, Source::External, Source::Codex][src];
            let payload = serde_json::json!({});
            static ENGINES: std::sync::OnceLock<[Engine; 2]> = std::sync::OnceLock::new();
            let engines =
                ENGINES.get_or_init(|| [Engine::builtin().unwrap(), engine_with_odd_keywords()]);
            for engine in engines {
                let fast = engine.scan(source, &view, &payload);
                let full = engine.scan_every_pass(source, &view, &payload);
                proptest::prop_assert_eq!(fast, full, "view {:?}", view);
            }
        }
    }

    #[test]
    fn rule_errors_name_file_line_and_column() {
        let bad =
            "[[rule]]\nid = \"x\"\ntitle = \"t\"\nseverity = \"extreme\"\nkeywords = [\"a\"]\n";
        let e = Engine::from_sources(&[("admin.toml".into(), bad.into())]).unwrap_err().to_string();
        assert!(e.starts_with("admin.toml:2:"), "{e}");
        assert!(e.contains("extreme"), "{e}");
        let syntax = "[[rule]]\nid = \n";
        let e = Engine::from_sources(&[("s.toml".into(), syntax.into())]).unwrap_err().to_string();
        assert!(e.starts_with("s.toml:2:"), "{e}");
        let re = "[[rule]]\nid = \"r\"\ntitle = \"t\"\nseverity = \"low\"\nfields = [\"text\"]\nkeywords = [\"a\"]\nregex = \"(\"\n";
        let e = Engine::from_sources(&[("r.toml".into(), re.into())]).unwrap_err().to_string();
        assert!(e.contains("bad regex"), "{e}");
        let dup = BUILTIN_RULES.to_string();
        assert!(Engine::from_sources(&[("a".into(), dup.clone()), ("b".into(), dup)]).is_err());
    }

    #[test]
    fn admin_rules_from_a_dir_are_added() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("team.toml"),
            "[[rule]]\nid = \"team.codename\"\ntitle = \"Project codename\"\nseverity = \"low\"\nfields = [\"text\"]\nkeywords = [\"bluefalcon\"]\n",
        )
        .unwrap();
        let engine = Engine::with_dir(Some(dir.path())).unwrap();
        let p = serde_json::json!({"type":"user","message":{"content":"about BlueFalcon"}});
        assert_eq!(hits(&engine, Source::Claude, &p), vec!["team.codename".to_string()]);
        let p = serde_json::json!({"type":"user","message":{"content":"about red hawk"}});
        assert!(hits(&engine, Source::Claude, &p).is_empty());
    }

    fn ev(source: Source, id: &str, ts: Micros, payload: &str) -> NewEvent {
        NewEvent {
            source,
            id: id.into(),
            kind: "t".into(),
            ts,
            session: Some("s1".into()),
            seq: None,
            boot: None,
            payload: payload.into(),
            airlock_session: None,
            file: None,
            offset: None,
        }
    }

    #[test]
    fn backdating_future_ts_tp_and_tn() {
        let engine = Engine::builtin().unwrap();
        let now = 1_800_000_000_000_000;
        let p = serde_json::json!({});
        let future = ev(Source::External, "f", now + FUTURE_SKEW_US + 1, "{}");
        let old = ev(Source::External, "o", now - 86_400_000_000, "{}");
        let created = [
            Created { pk: 1, event: &future, payload: &p, received_at: now },
            Created { pk: 2, event: &old, payload: &p, received_at: now },
        ];
        let flags = engine.detect_batch("u", &created);
        let back: Vec<_> = flags.iter().filter(|f| f.rule_id == "timing.backdated").collect();
        assert_eq!(back.len(), 1, "old is not backdating; only the future one is");
        assert_eq!(back[0].event_pks, vec![1]);
    }

    #[test]
    fn denial_burst_tp_and_tn() {
        let engine = Engine::builtin().unwrap();
        let denied = serde_json::json!({"host":"x.example.test","allowed":false});
        let mk = |n: usize, step: Micros| -> Vec<NewEvent> {
            (0..n)
                .map(|i| {
                    ev(Source::Egress, &format!("d{i}"), 1_000_000_000 + i as Micros * step, "{}")
                })
                .collect()
        };
        let burst = mk(DENIAL_BURST, 1_000_000);
        let created: Vec<Created<'_>> = burst
            .iter()
            .enumerate()
            .map(|(i, e)| Created { pk: i as i64, event: e, payload: &denied, received_at: e.ts })
            .collect();
        assert!(
            engine.detect_batch("u", &created).iter().any(|f| f.rule_id == "egress.denial-burst")
        );
        let spread = mk(DENIAL_BURST, 30_000_000);
        let created: Vec<Created<'_>> = spread
            .iter()
            .enumerate()
            .map(|(i, e)| Created { pk: i as i64, event: e, payload: &denied, received_at: e.ts })
            .collect();
        assert!(
            !engine.detect_batch("u", &created).iter().any(|f| f.rule_id == "egress.denial-burst")
        );
    }

    /// Regression: phase switches (and session stops) are written `allowed: false`, and ten of
    /// them in a minute were counted as a denial burst.
    #[test]
    fn phase_and_stop_lines_are_not_denials() {
        let engine = Engine::builtin().unwrap();
        let line = serde_json::json!({"host":"","allowed":false,"method":"PHASE"});
        for kind in ["phase", "stop"] {
            let events: Vec<NewEvent> = (0..DENIAL_BURST * 2)
                .map(|i| NewEvent {
                    kind: kind.into(),
                    ..ev(Source::Egress, &format!("p{i}"), 1_000_000_000 + i as Micros, "{}")
                })
                .collect();
            let created: Vec<Created<'_>> = events
                .iter()
                .enumerate()
                .map(|(i, e)| Created { pk: i as i64, event: e, payload: &line, received_at: e.ts })
                .collect();
            assert!(
                !engine
                    .detect_batch("u", &created)
                    .iter()
                    .any(|f| f.rule_id == "egress.denial-burst"),
                "{kind} lines made a burst"
            );
        }
    }

    /// A `suppressed` line counts as the attempts its `seqs` name, exactly.
    #[test]
    fn denial_burst_counts_suppressed_attempts_exactly() {
        let engine = Engine::builtin().unwrap();
        let one = serde_json::json!({"host":"x.test","allowed":false,"reason":"not_allowed"});
        let nine = serde_json::json!({"host":"x.test","allowed":false,"seq":2,
            "seqs":[[2,8],[10,11]],"count":9});
        let big = serde_json::json!({"host":"x.test","allowed":false,"seq":2,
            "seqs":[[2,9874]],"count":9873});
        let evs: Vec<NewEvent> =
            (0..2).map(|i| ev(Source::Egress, &format!("d{i}"), 1_000_000_000 + i, "{}")).collect();
        let batch = |second: &Value| -> Vec<NewFlag> {
            let created = [
                Created { pk: 1, event: &evs[0], payload: &one, received_at: evs[0].ts },
                Created { pk: 2, event: &evs[1], payload: second, received_at: evs[1].ts },
            ];
            engine
                .detect_batch("u", &created)
                .into_iter()
                .filter(|f| f.rule_id == "egress.denial-burst")
                .collect()
        };
        let flags = batch(&nine);
        assert_eq!(flags.len(), 1, "1 + 9 attempts is a burst");
        assert_eq!(flags[0].detail, "10 denials within 60 s");
        assert_eq!(flags[0].event_pks, vec![1, 2]);
        assert_eq!(batch(&big)[0].detail, "9874 denials within 60 s");
        // Without valid seqs the line is one denial: 2 < 10.
        let bogus = serde_json::json!({"host":"x.test","allowed":false,"seqs":[[9,2]]});
        assert!(batch(&bogus).is_empty());
    }

    fn stored(
        pk: i64,
        source: Source,
        id: &str,
        ts: Micros,
        seq: Option<i64>,
        boot: &str,
    ) -> StoredEvent {
        StoredEvent {
            pk,
            user_id: "u".into(),
            source,
            id: id.into(),
            kind: "t".into(),
            ts,
            session: Some("s1".into()),
            seq,
            boot: Some(boot.into()),
            received_at: ts,
            payload: "{}".into(),
            conflict_of: None,
            airlock_session: None,
            file: None,
            offset: None,
        }
    }

    #[test]
    fn session_span_and_seq_gap_tp_and_tn() {
        let start = stored(1, Source::Session, "s1:start", 100, None, "");
        let end = stored(9, Source::Session, "s1:end", 1000, None, "");
        let good = vec![
            start.clone(),
            stored(2, Source::Egress, "e1", 200, Some(1), "b1"),
            stored(3, Source::Egress, "e2", 300, Some(2), "b1"),
            stored(4, Source::Egress, "e3", 300, Some(1), "b2"),
            end.clone(),
        ];
        assert!(session_checks("u", "s1", &good).is_empty());
        let bad = vec![
            start,
            stored(2, Source::Egress, "e1", 50, Some(1), "b1"),
            stored(3, Source::Egress, "e4", 300, Some(4), "b1"),
            stored(4, Source::Egress, "e5", 300, Some(1), "b2"),
            end,
        ];
        let flags = session_checks("u", "s1", &bad);
        let span = flags.iter().find(|f| f.rule_id == "timing.outside-session").unwrap();
        assert_eq!(span.event_pks, vec![2]);
        let gap = flags.iter().find(|f| f.rule_id == "session.seq-gap").unwrap();
        assert!(gap.detail.contains("missing seq 2-3"), "{}", gap.detail);
        assert_eq!(flags.len(), 2, "boot b2 has no gap: {flags:?}");
    }
}
