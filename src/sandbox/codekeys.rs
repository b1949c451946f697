//! Code-running keys in the repo's host-read configuration files: deciding which keys of such a
//! file can make the host run code, and splitting an agent's edit of the file into the part that
//! is kept in place and the part that is held back for review (`airlock quarantine`).
//!
//! The agent may edit files that the *host* later reads as configuration, and several of those
//! formats let a single key run a program: a host `cargo --version` alone runs the toolchain that
//! `rust-toolchain.toml`'s `path` names; the next `cargo build` runs `.cargo/config.toml`'s
//! `rustc-wrapper` or `linker`, `cargo run` its `runner`, and an `[alias]` makes `cargo b` mean
//! anything; entering the directory with mise active runs its `env._.source` and `hooks`; `git
//! status` in a new embedded repo runs its `core.fsmonitor`. This module is the pure engine that
//! the supervisor calls at session end: bytes in, bytes out, no filesystem access.
//!
//! # The rule
//!
//! **An allowlist of keys known to be inert; everything else that changed is held.** A key is
//! kept with the agent's value only if it is on the allowlist of its format (some entries also
//! check the value's shape, e.g. a channel name may not be a path). Every other key that the
//! agent added or changed is held: it is reverted to its value at session start, or removed if
//! it had none. Keys the agent removed stay removed (a removal cannot make the host run
//! anything). An allowlist rather than a denylist because every new release of these tools may
//! add a code-running key (Cargo's `credential-provider` and mise's `hooks` are recent ones): a
//! denylist silently widens with each release, an allowlist can only hold too much, and a held
//! key costs the developer one `airlock quarantine restore`. When unsure, a key is not inert.
//!
//! A file that does not parse, or is over [`MAX_BYTES`], is held whole: nothing of the agent's
//! version is kept ([`Reviewed::whole_file_held`]). A file identical to its session-start version
//! is kept byte for byte (it is the developer's). An earlier version that does not parse counts
//! as unknown: every non-inert key of the agent's version is then new.
//!
//! # Formats and their inert keys
//!
//! Keys are written as dotted paths the way the format spells them (`target."cfg(unix)".runner`,
//! `remote.origin.url`). For TOML, a key is a leaf: a value that is not a table, or a whole array
//! of tables.
//!
//! | Kind | Format reference | Inert keys (kept with the agent's value) |
//! |---|---|---|
//! | [`ConfigKind::RustToolchain`], [`ConfigKind::RustToolchainLegacy`] | rustup book, "Overrides" → "The toolchain file" | `toolchain.channel` (a name: `[A-Za-z0-9][A-Za-z0-9._-]*`, so never a path), `toolchain.components`, `toolchain.targets` (arrays of such names), `toolchain.profile` (a name). Not inert: `toolchain.path`, which runs a local toolchain, and anything else. The legacy `rust-toolchain` file is, as rustup reads it, one line naming a channel (inert if it is such a name, else held whole) or, if longer, TOML as above. |
//! | [`ConfigKind::CargoConfig`] | Cargo book, "Configuration" reference | `build.jobs`, `build.target` (triples; a `.json` target spec or a path is held: a spec can name a linker), `build.target-dir` (a relative path without `..` that does not enter `.git`; elsewhere it would have the host's builds write outside the repo), `build.incremental`, `term.*`, `net.retry`, `net.offline`, `http.timeout`, `http.low-speed-limit`, `http.multiplexing`, `cargo-new.vcs`, `future-incompat-report.frequency`, `profile.<name>.{opt-level, debug, debug-assertions, overflow-checks, lto, panic, incremental, codegen-units, strip, split-debuginfo}`. Not inert: `alias`, `target.*` (`runner`, `linker`, `rustflags`), `build.rustc*`/`rustdoc`/`rustflags`, `env`, `source`, `registries`, `registry`, `credential-provider`, `paths`, `patch`, `doc.browser`, `unstable`, … |
//! | [`ConfigKind::Mise`] | mise docs: "Configuration", "Environments", "Hooks" | `min_version` (also its `hard`/`soft` form), `tools.<name>` where the name has no backend prefix (`ubi:`, `http:`, `cargo:`, `npm:`, … fetch and run arbitrary code) and the value is a version string or an array of them. A version is held if it is not a plain version (`path:` uses a local directory as the tool, `ref:` builds one from source). Not inert: `env` (incl. `_.source`, `_.file`, `_.path`), `hooks`, `tasks`, `plugins`, `settings`, `redactions`, tool option tables, … |
//! | [`ConfigKind::ToolVersions`] | asdf docs, "Configuration" → `.tool-versions` | A line `tool version…` whose tool has no backend prefix (mise reads this file too and honours `ubi:` names there) and whose versions are all plain. A line with a `path:` or `ref:` version is held: asdf uses or builds local code. Lines are compared by tool name; a held line is reverted to the line at session start, or dropped. |
//! | [`ConfigKind::GitConfig`] | git-config(1), "CONFIGURATION FILE" → "Syntax" | `core.{repositoryformatversion, filemode, bare, logallrefupdates, ignorecase, precomposeunicode, symlinks}`, `extensions.{objectformat, refstorage}`, `remote.<name>.url` (unless it names a transport helper, `<helper>::<address>`, or starts with `-`), `remote.<name>.fetch`, `branch.<name>.remote` (same check as a url: it may be one), `branch.<name>.merge`, `user.name`, `user.email`. Everything else (`core.fsmonitor`, `core.hookspath`, `core.sshcommand`, `include.path`, `remote.<name>.uploadpack`, `alias.*`, `extensions.worktreeconfig`, …) is not inert. |
//!
//! # Kept output
//!
//! TOML files are edited with `toml_edit`, so the agent's comments and layout survive in the kept
//! parts; a reverted key keeps its place. Comments directly above a removed key go with it
//! (`toml_edit` attaches them to the key, and they usually describe it). The kept parts are the
//! agent's bytes, so this relies on `toml_edit` reading them as the tool does; Cargo, rustup and
//! mise all read TOML with the same parser family (`toml`/`toml_edit`), and the kept text is
//! parsed once more and checked to hold nothing before it is returned.
//!
//! Git config is different: git's parser is C code with its own quirks, so a file is parsed by
//! the small parser here and the kept file is **re-generated** from the entries kept, never copied
//! through. Anything this parser does not understand is simply not carried over (a file it
//! rejects is held whole), so a parser differential with git cannot smuggle a key through: git
//! reads exactly the canonical text this module wrote. (The parser also agrees with git 2.47 on
//! every file both accept, which the ignored test `git_parser_agrees_with_real_git` checks by
//! hand; that is for faithful output, not for safety.)

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path};

use toml_edit::{DocumentMut, InlineTable, Item, Key, Table, Value};

/// Files larger than this are held whole: no real configuration file comes near it, and the
/// parsers then never see adversarially large input.
pub const MAX_BYTES: usize = 1 << 20;

/// The formats this module knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum ConfigKind {
    /// `rust-toolchain.toml`.
    RustToolchain,
    /// `rust-toolchain`: one line naming a channel, or TOML.
    RustToolchainLegacy,
    /// `.cargo/config.toml`, `.cargo/config`.
    CargoConfig,
    /// `mise.toml` and its siblings.
    Mise,
    /// `.tool-versions` (asdf, also read by mise).
    ToolVersions,
    /// A git config file (chosen by the caller, never by name).
    GitConfig,
}

impl ConfigKind {
    /// The file as error messages name it.
    pub fn file(self) -> &'static str {
        match self {
            ConfigKind::RustToolchain => "rust-toolchain.toml",
            ConfigKind::RustToolchainLegacy => "rust-toolchain file",
            ConfigKind::CargoConfig => "Cargo config",
            ConfigKind::Mise => "mise config",
            ConfigKind::ToolVersions => ".tool-versions",
            ConfigKind::GitConfig => "git config",
        }
    }
}

/// The kind of a file by its path relative to the repo (at any depth): `rust-toolchain.toml`,
/// `rust-toolchain`, `.cargo/config.toml`, `.cargo/config`, `.tool-versions`, and mise's files
/// (`mise.toml`, `.mise.toml`, `mise.local.toml`, `.mise.local.toml`, `.config/mise.toml`,
/// `.config/mise/config.toml`, `.mise/config.toml`). For mise it also recognises the other files
/// mise's "Configuration" docs list: `mise.<env>.toml` (`MISE_ENV`), `mise/config.toml`,
/// `config.<x>.toml` beside those, and `.config/mise/conf.d/*.toml`. [`ConfigKind::GitConfig`] is
/// never returned: which files are git config is the caller's knowledge.
pub fn kind_of(rel: &Path) -> Option<ConfigKind> {
    let mut names = rel.components().rev().map(|c| match c {
        Component::Normal(n) => n.to_str(),
        _ => None,
    });
    let name = names.next().flatten()?;
    let parent = names.next().flatten();
    let grandparent = names.next().flatten();
    match name {
        "rust-toolchain.toml" => Some(ConfigKind::RustToolchain),
        "rust-toolchain" => Some(ConfigKind::RustToolchainLegacy),
        ".tool-versions" => Some(ConfigKind::ToolVersions),
        "config.toml" | "config" if parent == Some(".cargo") => Some(ConfigKind::CargoConfig),
        _ if is_mise_file(name, parent, grandparent) => Some(ConfigKind::Mise),
        _ => None,
    }
}

fn is_mise_file(name: &str, parent: Option<&str>, grandparent: Option<&str>) -> bool {
    // `mise.toml`, `mise.local.toml`, `mise.<env>.toml`, dotted or not.
    let stem = name.strip_prefix('.').unwrap_or(name);
    if stem == "mise.toml" || (stem.starts_with("mise.") && stem.ends_with(".toml")) {
        return true;
    }
    // `mise/config.toml`, `.mise/config.toml`, `.config/mise/config.toml`, `config.local.toml`.
    let in_mise_dir = matches!(parent, Some("mise" | ".mise"));
    if in_mise_dir
        && (name == "config.toml" || (name.starts_with("config.") && name.ends_with(".toml")))
    {
        return true;
    }
    parent == Some("conf.d") && grandparent == Some("mise") && name.ends_with(".toml")
}

/// One key held back from the agent's version of a file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeldKey {
    /// The dotted path as the format spells it: `target.x86_64-unknown-linux-gnu.runner`,
    /// `toolchain.path`, `alias.b`, `core.fsmonitor`, `remote.origin.uploadpack`; for
    /// `.tool-versions`, the tool name (`nodejs`).
    pub key: String,
    /// The agent's value in the file's own syntax: a TOML value (an array of tables becomes an
    /// array of inline tables), a git value as it would follow `=` (quoted where needed; empty
    /// for a bare `name`, which git reads as true), or a `.tool-versions` line's versions.
    pub value: String,
}

/// The outcome of [`review`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reviewed {
    /// The file to leave in place; `None` = remove it.
    pub kept: Option<Vec<u8>>,
    /// The keys held back, in the order they appear in the agent's version. Empty when the whole
    /// file is held: the caller then keeps the agent's whole file.
    pub held: Vec<HeldKey>,
    /// The agent's version was unparsable or over [`MAX_BYTES`]: nothing of it is kept, and
    /// `kept` is the file at session start (or `None` if there was none).
    pub whole_file_held: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CodeKeysError {
    #[error(
        "the current {file} is not UTF-8 text, so the held settings cannot be put back into it; \
         fix or remove the file by hand, then run the restore again"
    )]
    NotText { file: &'static str },
    #[error(
        "the current {file} does not parse ({detail}), so the held settings cannot be put back \
         into it; fix its syntax by hand, then run the restore again"
    )]
    Unparsable { file: &'static str, detail: String },
    #[error(
        "held key `{key}` is not a valid {file} key ({detail}); the quarantine record looks \
         damaged, so put that setting back by hand"
    )]
    BadKey { file: &'static str, key: String, detail: String },
    #[error(
        "held value for `{key}` is not a valid {file} value ({detail}); the quarantine record \
         looks damaged, so put that setting back by hand"
    )]
    BadValue { file: &'static str, key: String, detail: String },
    #[error(
        "cannot put `{key}` back into the current {file}: `{at}` there is a value, not a table; \
         move or remove it by hand, then run the restore again"
    )]
    Conflict { file: &'static str, key: String, at: String },
}

/// Splits the agent's version of a file into what is kept and what is held.
///
/// `before`: the file's content at session start if known (`None` = it did not exist, or a nested
/// file whose earlier content is unknown: every non-inert key is then new). `after`: its content
/// now.
pub fn review(kind: ConfigKind, before: Option<&[u8]>, after: &[u8]) -> Reviewed {
    if before == Some(after) {
        // Nothing changed: the host's own file stays exactly as it was.
        return keep_all(after);
    }
    if after.len() > MAX_BYTES {
        return whole_file(before);
    }
    // An oversized or non-text earlier version is treated as unknown: every key is then new.
    let before_text =
        before.filter(|b| b.len() <= MAX_BYTES).and_then(|b| std::str::from_utf8(b).ok());
    let Ok(after_text) = std::str::from_utf8(after) else {
        return whole_file(before);
    };
    let split = match kind {
        ConfigKind::RustToolchain => toml_review(toolchain_inert, before_text, after_text),
        ConfigKind::RustToolchainLegacy => legacy_review(before_text, after_text),
        ConfigKind::CargoConfig => toml_review(cargo_inert, before_text, after_text),
        ConfigKind::Mise => toml_review(mise_inert, before_text, after_text),
        ConfigKind::ToolVersions => Some(tool_versions_review(before_text, after_text)),
        ConfigKind::GitConfig => git_review(before_text, after_text),
    };
    // Even with nothing held, `kept` is the split's text: for git config that is the regenerated
    // file, never the agent's bytes.
    match split {
        Some(Split { kept, held }) => {
            Reviewed { kept: Some(kept.into_bytes()), held, whole_file_held: false }
        }
        None => whole_file(before),
    }
}

/// Puts held keys back into `current` (for `airlock quarantine restore`). TOML keys are set at
/// their dotted path, creating tables as needed; a `.tool-versions` line replaces the tool's line
/// or is appended; a git entry is added under the last section of its name, or in a new section
/// at the end.
pub fn restore(
    kind: ConfigKind,
    current: &[u8],
    held: &[HeldKey],
) -> Result<Vec<u8>, CodeKeysError> {
    let file = kind.file();
    let text = std::str::from_utf8(current).map_err(|_| CodeKeysError::NotText { file })?;
    let out = match kind {
        ConfigKind::RustToolchain | ConfigKind::CargoConfig | ConfigKind::Mise => {
            toml_restore(file, text, held)?
        }
        ConfigKind::RustToolchainLegacy => {
            let trimmed = text.trim();
            if trimmed.lines().count() <= 1 {
                // rustup reads a one-line file as a channel name; to carry more keys it has to
                // become TOML, with that name as the channel.
                let mut doc = DocumentMut::new();
                if !trimmed.is_empty() {
                    let mut table = Table::new();
                    table.insert("channel", toml_edit::value(trimmed));
                    doc.insert("toolchain", Item::Table(table));
                }
                toml_restore(file, &doc.to_string(), held)?
            } else {
                toml_restore(file, text, held)?
            }
        }
        ConfigKind::ToolVersions => tool_versions_restore(text, held)?,
        ConfigKind::GitConfig => git_restore(text, held)?,
    };
    Ok(out.into_bytes())
}

/// A review's result before it becomes a [`Reviewed`].
struct Split {
    kept: String,
    held: Vec<HeldKey>,
}

fn keep_all(after: &[u8]) -> Reviewed {
    Reviewed { kept: Some(after.to_vec()), held: Vec::new(), whole_file_held: false }
}

fn whole_file(before: Option<&[u8]>) -> Reviewed {
    Reviewed { kept: before.map(<[u8]>::to_vec), held: Vec::new(), whole_file_held: true }
}

// ---------------------------------------------------------------------------------------------
// Value shapes shared by the allowlists.

/// A toolchain, component, target or profile name: never a path, never an option.
fn plain_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// A target triple as `build.target` takes it: a `.json` name is a custom target spec file,
/// which can name its own linker.
fn target_triple(s: &str) -> bool {
    plain_name(s) && !s.ends_with(".json")
}

/// A tool version for asdf/mise: a plain version, optionally `prefix:`-matched. Everything else
/// with a colon (`path:`, `ref:`, `sub-1:` …) is held; `path:`/`ref:` use or build local code.
fn plain_version(s: &str) -> bool {
    let v = s.strip_prefix("prefix:").unwrap_or(s);
    let mut chars = v.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+'))
}

/// A tool name without a backend prefix (`ubi:`, `npm:`, `cargo:`, `http:` … install and run
/// whatever they are pointed at).
fn plain_tool(s: &str) -> bool {
    plain_name(s)
}

/// `build.target-dir`: relative (to the directory holding `.cargo`), no `..`, not into `.git`.
fn repo_relative_dir(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with('~')
        && Path::new(s).components().all(|c| match c {
            Component::Normal(n) => n != ".git",
            Component::CurDir => true,
            _ => false,
        })
}

// ---------------------------------------------------------------------------------------------
// TOML kinds.

/// Whether a leaf (its dotted path and value) is inert for one TOML format.
type InertFn = fn(&[&str], &Item) -> bool;

fn is_str(item: &Item, ok: fn(&str) -> bool) -> bool {
    item.as_str().is_some_and(ok)
}

fn is_str_array(item: &Item, ok: fn(&str) -> bool) -> bool {
    item.as_array().is_some_and(|a| a.iter().all(|v| v.as_str().is_some_and(ok)))
}

/// A value that is neither an array nor a table; for keys whose only meaning is a setting.
fn is_scalar(item: &Item) -> bool {
    matches!(item, Item::Value(v) if !v.is_array() && !v.is_inline_table())
}

fn toolchain_inert(path: &[&str], item: &Item) -> bool {
    match path {
        ["toolchain", "channel" | "profile"] => is_str(item, plain_name),
        ["toolchain", "components" | "targets"] => is_str_array(item, plain_name),
        _ => false,
    }
}

const PROFILE_KEYS: &[&str] = &[
    "opt-level",
    "debug",
    "debug-assertions",
    "overflow-checks",
    "lto",
    "panic",
    "incremental",
    "codegen-units",
    "strip",
    "split-debuginfo",
];

fn cargo_inert(path: &[&str], item: &Item) -> bool {
    match path {
        ["build", "jobs"] => item.is_integer() || is_str(item, plain_name),
        ["build", "target"] => is_str(item, target_triple) || is_str_array(item, target_triple),
        ["build", "target-dir"] => is_str(item, repo_relative_dir),
        ["build", "incremental"] => item.is_bool(),
        ["term", _, ..] => true,
        ["net", "retry" | "offline"]
        | ["http", "timeout" | "low-speed-limit" | "multiplexing"]
        | ["cargo-new", "vcs"]
        | ["future-incompat-report", "frequency"] => is_scalar(item),
        ["profile", _, key] => PROFILE_KEYS.contains(key) && is_scalar(item),
        _ => false,
    }
}

fn mise_inert(path: &[&str], item: &Item) -> bool {
    match path {
        ["min_version"] | ["min_version", "hard" | "soft"] => is_scalar(item),
        ["tools", name] => {
            plain_tool(name) && (is_str(item, plain_version) || is_str_array(item, plain_version))
        }
        _ => false,
    }
}

/// Every leaf of a table: a value that is not a table, or a whole array of tables.
fn leaves(table: &dyn toml_edit::TableLike) -> Vec<(Vec<String>, &Item)> {
    fn walk<'a>(
        table: &'a dyn toml_edit::TableLike,
        prefix: &mut Vec<String>,
        out: &mut Vec<(Vec<String>, &'a Item)>,
    ) {
        for (key, item) in table.iter() {
            prefix.push(key.to_owned());
            match item {
                Item::None => {}
                Item::Table(t) => walk(t, prefix, out),
                Item::Value(Value::InlineTable(t)) => walk(t, prefix, out),
                _ => out.push((prefix.clone(), item)),
            }
            prefix.pop();
        }
    }
    let mut out = Vec::new();
    walk(table, &mut Vec::new(), &mut out);
    out
}

fn as_strs(path: &[String]) -> Vec<&str> {
    path.iter().map(String::as_str).collect()
}

/// Same value, ignoring formatting (quotes, spacing, comments, inline vs standard tables).
fn same_item(a: &Item, b: &Item) -> bool {
    match (a, b) {
        (Item::Value(x), Item::Value(y)) if !x.is_inline_table() || !y.is_inline_table() => {
            same_value(x, y)
        }
        (Item::ArrayOfTables(x), Item::ArrayOfTables(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(s, t)| same_table(s, t))
        }
        _ => match (a.as_table_like(), b.as_table_like()) {
            (Some(x), Some(y)) => same_table(x, y),
            _ => false,
        },
    }
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::String(x), Value::String(y)) => x.value() == y.value(),
        (Value::Integer(x), Value::Integer(y)) => x.value() == y.value(),
        (Value::Float(x), Value::Float(y)) => x.value().to_bits() == y.value().to_bits(),
        (Value::Boolean(x), Value::Boolean(y)) => x.value() == y.value(),
        (Value::Datetime(x), Value::Datetime(y)) => x.value() == y.value(),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y.iter()).all(|(v, w)| same_value(v, w))
        }
        (Value::InlineTable(x), Value::InlineTable(y)) => same_table(x, y),
        _ => false,
    }
}

fn same_table(a: &dyn toml_edit::TableLike, b: &dyn toml_edit::TableLike) -> bool {
    a.len() == b.len()
        && a.iter().all(|(k, v)| v.is_none() || b.get(k).is_some_and(|w| same_item(v, w)))
}

fn get_path<'a>(table: &'a Table, path: &[String]) -> Option<&'a Item> {
    let (last, parents) = path.split_last()?;
    let mut cur: &dyn toml_edit::TableLike = table;
    for seg in parents {
        cur = cur.get(seg)?.as_table_like()?;
    }
    cur.get(last)
}

/// The dotted path, each part bare where TOML allows it and quoted otherwise.
fn render_path(path: &[String]) -> String {
    path.iter()
        .map(|s| Key::new(s.as_str()).display_repr().into_owned())
        .collect::<Vec<_>>()
        .join(".")
}

/// The value without its surrounding whitespace and comments.
fn render_item(item: &Item) -> String {
    match item.clone().into_value() {
        Ok(mut v) => {
            v.decor_mut().clear();
            v.to_string()
        }
        Err(_) => String::new(),
    }
}

/// A table reached along a path; inline tables only hold values, so the two are kept apart.
enum Parent<'a> {
    Table(&'a mut Table),
    Inline(&'a mut InlineTable),
}

impl<'a> Parent<'a> {
    fn like(&mut self) -> &mut dyn toml_edit::TableLike {
        match self {
            Parent::Table(t) => &mut **t,
            Parent::Inline(t) => &mut **t,
        }
    }

    fn child(self, seg: &str) -> Option<Parent<'a>> {
        let item = match self {
            Parent::Table(t) => t.get_mut(seg)?,
            Parent::Inline(t) => toml_edit::TableLike::get_mut(t, seg)?,
        };
        match item {
            Item::Table(t) => Some(Parent::Table(t)),
            Item::Value(Value::InlineTable(t)) => Some(Parent::Inline(t)),
            _ => None,
        }
    }

    /// Sets `key`, converting a table item to its inline form where only values may go.
    fn set(&mut self, key: &str, item: Item) -> Option<()> {
        match self {
            Parent::Table(t) => {
                t.insert(key, item);
            }
            Parent::Inline(t) => {
                t.insert(key, item.into_value().ok()?);
            }
        }
        Some(())
    }
}

fn parent_mut<'a>(root: &'a mut Table, parents: &[String]) -> Option<Parent<'a>> {
    let mut cur = Parent::Table(root);
    for seg in parents {
        cur = cur.child(seg)?;
    }
    Some(cur)
}

/// Puts the held leaf back to its earlier value, keeping its place and surrounding formatting.
fn revert_leaf(root: &mut Table, path: &[String], mut earlier: Item) -> Option<()> {
    let (last, parents) = path.split_last()?;
    let mut parent = parent_mut(root, parents)?;
    if let (Some(Item::Value(old)), Item::Value(new)) = (parent.like().get(last), &mut earlier) {
        *new.decor_mut() = old.decor().clone();
    }
    parent.set(last, earlier)
}

/// Removes the held leaf, then every table on its path that this left empty (unless that table
/// existed at session start: the developer's own empty section stays).
fn remove_leaf(root: &mut Table, path: &[String], before: Option<&Table>) -> Option<()> {
    let (last, parents) = path.split_last()?;
    parent_mut(root, parents)?.like().remove(last)?;
    for depth in (1..path.len()).rev() {
        let table_path = &path[..depth];
        if before.and_then(|b| get_path(b, table_path)).is_some_and(Item::is_table_like) {
            break;
        }
        let (seg, above) = table_path.split_last()?;
        let mut above = parent_mut(root, above)?;
        let empty =
            above.like().get(seg).and_then(Item::as_table_like).is_some_and(|t| t.is_empty());
        if !empty {
            break;
        }
        above.like().remove(seg);
    }
    Some(())
}

/// The held leaves of `after` (non-inert, and added or changed against `before`).
fn held_leaves(
    inert: InertFn,
    before: Option<&Table>,
    after: &Table,
) -> Vec<(Vec<String>, HeldKey, Option<Item>)> {
    let mut out = Vec::new();
    for (path, item) in leaves(after) {
        if inert(&as_strs(&path), item) {
            continue;
        }
        let earlier = before.and_then(|b| get_path(b, &path)).filter(|e| !e.is_table_like());
        if earlier.is_some_and(|e| same_item(e, item)) {
            continue;
        }
        let held = HeldKey { key: render_path(&path), value: render_item(item) };
        out.push((path, held, earlier.cloned()));
    }
    out
}

fn toml_review(inert: InertFn, before: Option<&str>, after: &str) -> Option<Split> {
    let before_doc = before.and_then(|b| b.parse::<DocumentMut>().ok());
    toml_review_docs(inert, before_doc.as_ref(), after)
}

fn toml_review_docs(inert: InertFn, before: Option<&DocumentMut>, after: &str) -> Option<Split> {
    let before = before.map(DocumentMut::as_table);
    let mut kept = after.parse::<DocumentMut>().ok()?;
    let held = held_leaves(inert, before, kept.as_table());
    if held.is_empty() {
        return Some(Split { kept: after.to_owned(), held: Vec::new() });
    }
    let mut keys = Vec::with_capacity(held.len());
    for (path, key, earlier) in held {
        match earlier {
            Some(item) => revert_leaf(kept.as_table_mut(), &path, item)?,
            None => remove_leaf(kept.as_table_mut(), &path, before)?,
        }
        keys.push(key);
    }
    let text = kept.to_string();
    // Belt and braces: what is left in place must itself hold nothing.
    let again = text.parse::<DocumentMut>().ok()?;
    if !held_leaves(inert, before, again.as_table()).is_empty() {
        return None;
    }
    Some(Split { kept: text, held: keys })
}

fn legacy_review(before: Option<&str>, after: &str) -> Option<Split> {
    // rustup reads a file of one (trimmed) line as the channel name, and anything longer as TOML.
    let trimmed = after.trim();
    if trimmed.lines().count() <= 1 {
        return plain_name(trimmed).then(|| Split { kept: after.to_owned(), held: Vec::new() });
    }
    // A one-line earlier file named only a channel: nothing to revert to.
    let before_doc =
        before.filter(|b| b.trim().lines().count() > 1).and_then(|b| b.parse::<DocumentMut>().ok());
    let split = toml_review_docs(toolchain_inert, before_doc.as_ref(), after)?;
    // Removing keys must not turn the TOML into a one-line file rustup would read as a name.
    (split.kept.trim().lines().count() > 1).then_some(split)
}

fn toml_restore(
    file: &'static str,
    current: &str,
    held: &[HeldKey],
) -> Result<String, CodeKeysError> {
    let mut doc = current
        .parse::<DocumentMut>()
        .map_err(|e| CodeKeysError::Unparsable { file, detail: e.message().to_owned() })?;
    for h in held {
        let bad_key = |detail: String| CodeKeysError::BadKey { file, key: h.key.clone(), detail };
        let path: Vec<String> = Key::parse(&h.key)
            .map_err(|e| bad_key(e.message().to_owned()))?
            .iter()
            .map(|k| k.get().to_owned())
            .collect();
        let Some((last, parents)) = path.split_last() else {
            return Err(bad_key("it is empty".to_owned()));
        };
        let value = parse_toml_value(&h.value).map_err(|detail| CodeKeysError::BadValue {
            file,
            key: h.key.clone(),
            detail,
        })?;
        let mut cur = Parent::Table(doc.as_table_mut());
        for (depth, seg) in parents.iter().enumerate() {
            let conflict = || CodeKeysError::Conflict {
                file,
                key: h.key.clone(),
                at: render_path(&path[..=depth]),
            };
            let like = cur.like();
            if like.get(seg).is_none() {
                // Implicit: a table that only holds other tables gets no header of its own.
                let mut fresh = Table::new();
                fresh.set_implicit(true);
                if matches!(cur, Parent::Table(_)) {
                    cur.set(seg, Item::Table(fresh)).ok_or_else(conflict)?;
                } else {
                    cur.set(seg, Item::Value(Value::InlineTable(InlineTable::new())))
                        .ok_or_else(conflict)?;
                }
            }
            cur = cur.child(seg).ok_or_else(conflict)?;
        }
        cur.set(last, Item::Value(value)).ok_or_else(|| CodeKeysError::BadValue {
            file,
            key: h.key.clone(),
            detail: "it cannot be set there".to_owned(),
        })?;
    }
    Ok(doc.to_string())
}

/// Parses one TOML value as [`HeldKey::value`] spells it.
fn parse_toml_value(text: &str) -> Result<Value, String> {
    let doc = format!("v = {text}\n").parse::<DocumentMut>().map_err(|e| e.message().to_owned())?;
    if doc.as_table().len() != 1 {
        return Err("it is more than one value".to_owned());
    }
    match doc.as_table().get("v") {
        Some(Item::Value(v)) => {
            let mut v = v.clone();
            v.decor_mut().clear();
            Ok(v)
        }
        _ => Err("it is not a value".to_owned()),
    }
}

// ---------------------------------------------------------------------------------------------
// `.tool-versions`.

/// One line of a `.tool-versions` file: its text (with its line ending) and, unless it is blank
/// or a comment, the tool and its versions.
struct ToolLine<'a> {
    raw: &'a str,
    entry: Option<(&'a str, Vec<&'a str>)>,
}

fn tool_lines(text: &str) -> Vec<ToolLine<'_>> {
    text.split_inclusive('\n')
        .map(|raw| {
            // asdf and mise both cut a line at the first `#`.
            let content = raw.split('#').next().unwrap_or("");
            let mut words = content.split_whitespace();
            let entry = words.next().map(|tool| (tool, words.collect()));
            ToolLine { raw, entry }
        })
        .collect()
}

fn tool_line_inert(tool: &str, versions: &[&str]) -> bool {
    plain_tool(tool) && versions.iter().all(|v| plain_version(v))
}

fn tool_versions_review(before: Option<&str>, after: &str) -> Split {
    let before_lines = before.map(tool_lines).unwrap_or_default();
    let mut earlier: HashMap<&str, (&str, &[&str])> = HashMap::new();
    for line in &before_lines {
        if let Some((tool, versions)) = &line.entry {
            earlier.entry(tool).or_insert((line.raw, versions.as_slice()));
        }
    }
    let mut kept: Vec<&str> = Vec::new();
    let mut held = Vec::new();
    let mut reverted: HashSet<&str> = HashSet::new();
    for line in tool_lines(after) {
        let Some((tool, versions)) = &line.entry else {
            kept.push(line.raw);
            continue;
        };
        let unchanged = earlier.get(tool).is_some_and(|(_, v)| *v == versions.as_slice());
        if tool_line_inert(tool, versions) || unchanged {
            kept.push(line.raw);
            continue;
        }
        held.push(HeldKey { key: (*tool).to_owned(), value: versions.join(" ") });
        if let Some((raw, _)) = earlier.get(tool)
            && reverted.insert(tool)
        {
            kept.push(raw);
        }
    }
    Split { kept: join_lines(&kept), held }
}

/// Joins lines, giving every line but the last a line ending (a line taken from the earlier file
/// may have been its unterminated last line).
fn join_lines(lines: &[&str]) -> String {
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        out.push_str(line);
        if i + 1 < lines.len() && !line.ends_with('\n') {
            out.push('\n');
        }
    }
    out
}

fn tool_versions_restore(current: &str, held: &[HeldKey]) -> Result<String, CodeKeysError> {
    let file = ConfigKind::ToolVersions.file();
    let mut lines: Vec<String> = current.split_inclusive('\n').map(str::to_owned).collect();
    for h in held {
        let tool = h.key.as_str();
        if tool.is_empty() || tool.contains(|c: char| c.is_whitespace() || c == '#') {
            return Err(CodeKeysError::BadKey {
                file,
                key: h.key.clone(),
                detail: "a tool name is one word without `#`".to_owned(),
            });
        }
        let versions = h.value.split_whitespace().collect::<Vec<_>>();
        if versions.is_empty() || h.value.contains(['#', '\n', '\r']) {
            return Err(CodeKeysError::BadValue {
                file,
                key: h.key.clone(),
                detail: "versions are words on one line, without `#`".to_owned(),
            });
        }
        let line = format!("{tool} {}\n", versions.join(" "));
        let at = lines.iter().position(|l| {
            tool_lines(l).first().and_then(|t| t.entry.as_ref()).is_some_and(|(t, _)| *t == tool)
        });
        match at {
            Some(i) => lines[i] = line,
            None => {
                if let Some(last) = lines.last_mut()
                    && !last.ends_with('\n')
                {
                    last.push('\n');
                }
                lines.push(line);
            }
        }
    }
    Ok(lines.concat())
}

// ---------------------------------------------------------------------------------------------
// Git config: parser, review, regenerator.

/// One `name = value` of a git config file. `section` and `name` are lower-cased (git compares
/// them case-insensitively); `sub` is the subsection, case-sensitive, `None` for `[section]`.
/// `value` is `None` for a bare `name`, which git reads as true.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GitEntry {
    section: String,
    sub: Option<String>,
    name: String,
    value: Option<String>,
}

impl GitEntry {
    fn key(&self) -> (&str, Option<&str>, &str) {
        (&self.section, self.sub.as_deref(), &self.name)
    }

    fn dotted(&self) -> String {
        match &self.sub {
            Some(sub) => format!("{}.{sub}.{}", self.section, self.name),
            None => format!("{}.{}", self.section, self.name),
        }
    }
}

/// A parsed git config file: its entries, and where each section header and entry line ends
/// (so that `restore` can insert a line under a section without rewriting the file).
struct GitDoc {
    entries: Vec<GitEntry>,
    /// `(section, subsection, byte offset just past the line)` for every header and entry.
    line_ends: Vec<(String, Option<String>, usize)>,
    /// For each entry, the bytes it occupies: from the start of its line (or from its name, when
    /// a section header shares the line) to just past its last line (continuations included).
    spans: Vec<std::ops::Range<usize>>,
}

#[derive(Debug)]
struct GitSyntax {
    line: usize,
    what: &'static str,
}

impl std::fmt::Display for GitSyntax {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "line {}: {}", self.line, self.what)
    }
}

/// Reads bytes the way git's `get_next_char` does: CRLF is a newline, and the end of the input
/// reads as a newline with `eof` set. Control characters other than tab are refused: git would
/// accept some, but nothing legitimate needs them and refusing keeps the regenerator simple.
struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    line: usize,
    eof: bool,
}

impl Cursor<'_> {
    fn err(&self, what: &'static str) -> GitSyntax {
        GitSyntax { line: self.line, what }
    }

    fn next(&mut self) -> Result<u8, GitSyntax> {
        let Some(&c) = self.bytes.get(self.pos) else {
            self.eof = true;
            return Ok(b'\n');
        };
        self.pos += 1;
        if c == b'\r' {
            if self.bytes.get(self.pos) != Some(&b'\n') {
                return Err(self.err("a carriage return that does not end a line"));
            }
            self.pos += 1;
        }
        if c == b'\n' || c == b'\r' {
            self.line += 1;
            return Ok(b'\n');
        }
        if (c < 0x20 && c != b'\t') || c == 0x7f {
            return Err(self.err("a control character"));
        }
        Ok(c)
    }

    /// Offset just past the current line (the newline was the last byte read, or the input ended).
    fn line_end(&self) -> usize {
        self.pos
    }
}

fn is_blank(c: u8) -> bool {
    c == b' ' || c == b'\t'
}

fn is_key_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'-'
}

/// The values of `section.name` (no subsection; names compared as git does, case-insensitively)
/// in a git config file; none if it does not parse. For reading the developer's own config.
pub fn git_config_values(bytes: &[u8], section: &str, name: &str) -> Vec<String> {
    let Ok(text) = std::str::from_utf8(bytes) else { return Vec::new() };
    let Ok(doc) = parse_git(text) else { return Vec::new() };
    doc.entries
        .into_iter()
        .filter(|e| {
            e.sub.is_none()
                && e.section.eq_ignore_ascii_case(section)
                && e.name.eq_ignore_ascii_case(name)
        })
        .map(|e| e.value.unwrap_or_default())
        .collect()
}

/// The values of `section.<any subsection>.name` and `section.name` (e.g. every `include.path`
/// and `includeIf.<cond>.path`); none if the file does not parse.
pub fn git_config_values_any_sub(bytes: &[u8], section: &str, name: &str) -> Vec<String> {
    let Ok(text) = std::str::from_utf8(bytes) else { return Vec::new() };
    let Ok(doc) = parse_git(text) else { return Vec::new() };
    doc.entries
        .into_iter()
        .filter(|e| e.section.eq_ignore_ascii_case(section) && e.name.eq_ignore_ascii_case(name))
        .map(|e| e.value.unwrap_or_default())
        .collect()
}

/// A git config key as git compares it: section and name lower-cased, the subsection as written
/// (`[section.sub]`'s legacy subsection is lower-cased, as git reads it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GitKey {
    pub section: String,
    pub sub: Option<String>,
    pub name: String,
}

impl GitKey {
    /// `section.name` or `section.sub.name`.
    pub fn dotted(&self) -> String {
        match &self.sub {
            Some(sub) => format!("{}.{sub}.{}", self.section, self.name),
            None => format!("{}.{}", self.section, self.name),
        }
    }

    fn of(e: &GitEntry) -> Self {
        Self { section: e.section.clone(), sub: e.sub.clone(), name: e.name.clone() }
    }
}

/// The entries of a git config file in file order: key and value (`None` for a bare key, which
/// git reads as true). Errors name the line and what git would not read the same way.
pub fn git_config_entries(bytes: &[u8]) -> Result<Vec<(GitKey, Option<String>)>, String> {
    if bytes.len() > MAX_BYTES {
        return Err(format!("over {MAX_BYTES} bytes"));
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8 text".to_owned())?;
    let doc = parse_git(text).map_err(|e| e.to_string())?;
    Ok(doc.entries.iter().map(|e| (GitKey::of(e), e.value.clone())).collect())
}

/// A git value as [`HeldKey::value`] spells it (as it would follow `=`).
pub fn git_held_value(value: Option<&str>) -> String {
    render_git_value(value)
}

/// Whether a url-like value (a remote's `url`/`pushurl`, a branch's `remote`) is one git only
/// fetches from: not `<helper>::<address>` (`ext::` runs a shell command, `fd::` talks over
/// inherited fds), no leading `-` (read as an option), and when it has a `scheme://`, one git
/// implements itself; any other scheme runs `git-remote-<scheme>` (gitremote-helpers(7)).
pub fn git_url_is_fetch_only(value: Option<&str>) -> bool {
    let Some(v) = value else { return false };
    if !plain_url(Some(v)) || v.contains(['\n', '\0']) {
        return false;
    }
    match v.split_once("://") {
        None => true,
        Some((scheme, _)) => matches!(
            scheme.to_ascii_lowercase().as_str(),
            "http" | "https" | "ssh" | "git" | "file" | "git+ssh" | "ssh+git"
        ),
    }
}

/// Sets every value of `key` in the git config text `current` to `values` (none: the key is
/// removed), keeping every other byte: the first of its lines gets the new values, its other
/// lines go; a key not yet present goes under the last header of its section, or into a new
/// section at the end. The result is parsed again and must read as `current` with exactly this
/// change, or this is an error (nothing is written half-way).
pub fn git_set(
    current: &str,
    key: &GitKey,
    values: &[Option<String>],
) -> Result<String, CodeKeysError> {
    let file = ConfigKind::GitConfig.file();
    let unparsable = |e: GitSyntax| CodeKeysError::Unparsable { file, detail: e.to_string() };
    let doc = parse_git(current).map_err(unparsable)?;
    let lines: String = values.iter().map(|v| render_entry(&key.name, v.as_deref())).collect();
    let mine: Vec<usize> =
        (0..doc.entries.len()).filter(|&i| GitKey::of(&doc.entries[i]) == *key).collect();
    let candidates: Vec<String> = if let Some(&first) = mine.first() {
        let mut text = String::with_capacity(current.len() + lines.len());
        let mut at = 0;
        for &i in &mine {
            let span = &doc.spans[i];
            text.push_str(&current[at..span.start]);
            if i == first {
                // A name sharing its line with a header starts mid-line.
                if span.start > 0 && !current[..span.start].ends_with('\n') && !lines.is_empty() {
                    text.push('\n');
                }
                text.push_str(&lines);
            }
            at = span.end;
        }
        text.push_str(&current[at..]);
        vec![text]
    } else if values.is_empty() {
        return Ok(current.to_owned());
    } else {
        let mut out = Vec::new();
        if let Some(at) = doc
            .line_ends
            .iter()
            .rev()
            .find(|(s, sub, _)| *s == key.section && *sub == key.sub)
            .map(|(_, _, end)| *end)
        {
            let sep = if at > 0 && !current[..at].ends_with('\n') { "\n" } else { "" };
            out.push(format!("{}{sep}{lines}{}", &current[..at], &current[at..]));
        }
        let sep = if current.is_empty() || current.ends_with('\n') { "" } else { "\n" };
        let header = render_header(&key.section, key.sub.as_deref());
        out.push(format!("{current}{sep}{header}{lines}"));
        out
    };
    let expected = |entries: &[GitEntry]| -> bool {
        let others = |es: &[GitEntry]| -> Vec<GitEntry> {
            es.iter().filter(|e| GitKey::of(e) != *key).cloned().collect()
        };
        let now: Vec<Option<String>> =
            entries.iter().filter(|e| GitKey::of(e) == *key).map(|e| e.value.clone()).collect();
        others(entries) == others(&doc.entries) && now == values
    };
    candidates.into_iter().find(|c| parse_git(c).is_ok_and(|d| expected(&d.entries))).ok_or_else(
        || CodeKeysError::Unparsable {
            file,
            detail: format!("setting `{}` would not read back as intended", key.dotted()),
        },
    )
}

/// Like [`restore`] for a git config, but each held key's values *replace* the key's current
/// ones (a remote's changed url, held until confirmed, must not become a second url).
pub fn restore_git_replacing(current: &[u8], held: &[HeldKey]) -> Result<Vec<u8>, CodeKeysError> {
    let file = ConfigKind::GitConfig.file();
    let mut text =
        std::str::from_utf8(current).map_err(|_| CodeKeysError::NotText { file })?.to_owned();
    let mut keys: Vec<(GitKey, Vec<Option<String>>)> = Vec::new();
    for h in held {
        let GitEntry { section, sub, name, value } = held_git_entry(h)?;
        let key = GitKey { section, sub, name };
        match keys.iter_mut().find(|(k, _)| *k == key) {
            Some((_, values)) => values.push(value),
            None => keys.push((key, vec![value])),
        }
    }
    for (key, values) in &keys {
        text = git_set(&text, key, values)?;
    }
    Ok(text.into_bytes())
}

/// Parses git-config(1) syntax: `[section]`, `[section "sub"]` (`\"` and `\\` escape, any other
/// backslash is dropped), legacy `[section.sub]` (lower-cased, as git does), `name = value`, a bare
/// `name`, values with `"` quoting, `\n \t \b \\ \"` escapes and backslash-newline continuation,
/// `#`/`;` comments outside quotes. It is stricter than git where git's reading is odd (a key
/// before any section, `[a.b "c"]`, control characters): such a file does not parse, and is held
/// whole.
fn parse_git(text: &str) -> Result<GitDoc, GitSyntax> {
    let bytes = text.as_bytes();
    let start = if bytes.starts_with(b"\xef\xbb\xbf") { 3 } else { 0 };
    let mut cur = Cursor { bytes, pos: start, line: 1, eof: false };
    let mut doc = GitDoc { entries: Vec::new(), line_ends: Vec::new(), spans: Vec::new() };
    let mut section: Option<(String, Option<String>)> = None;
    let mut comment = false;
    loop {
        let c = cur.next()?;
        if c == b'\n' {
            if cur.eof {
                return Ok(doc);
            }
            comment = false;
            continue;
        }
        if comment || is_blank(c) {
            continue;
        }
        if c == b'#' || c == b';' {
            comment = true;
            continue;
        }
        if c == b'[' {
            let (name, sub) = parse_header(&mut cur)?;
            let end = rest_of_line_end(bytes, cur.pos);
            doc.line_ends.push((name.clone(), sub.clone(), end));
            section = Some((name, sub));
            continue;
        }
        if !c.is_ascii_alphabetic() {
            return Err(cur.err("a line that is neither a section, a key nor a comment"));
        }
        let Some((sec, sub)) = &section else {
            return Err(cur.err("a key before any [section]"));
        };
        let key_start = cur.pos - 1;
        let line_start = bytes[..key_start].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let start = if bytes[line_start..key_start].iter().all(|&b| is_blank(b)) {
            line_start
        } else {
            key_start
        };
        let (name, value) = parse_entry(&mut cur, c)?;
        doc.spans.push(start..cur.line_end());
        doc.line_ends.push((sec.clone(), sub.clone(), cur.line_end()));
        doc.entries.push(GitEntry { section: sec.clone(), sub: sub.clone(), name, value });
    }
}

/// Offset just past the newline that ends the line containing `pos` (or the end of the input).
fn rest_of_line_end(bytes: &[u8], pos: usize) -> usize {
    bytes[pos.min(bytes.len())..]
        .iter()
        .position(|&b| b == b'\n')
        .map_or(bytes.len(), |i| pos + i + 1)
}

/// After `[`: the section name (lower-cased) and subsection.
fn parse_header(cur: &mut Cursor<'_>) -> Result<(String, Option<String>), GitSyntax> {
    let mut name = String::new();
    let mut sub = None;
    loop {
        let c = cur.next()?;
        match c {
            b']' => break,
            b'\n' => return Err(cur.err("a section header without `]`")),
            c if is_blank(c) => {
                sub = Some(parse_subsection(cur)?);
                break;
            }
            c if is_key_char(c) || c == b'.' => name.push(char::from(c.to_ascii_lowercase())),
            _ => return Err(cur.err("a character git does not allow in a section name")),
        }
    }
    if sub.is_none()
        && let Some((section, legacy)) = name.split_once('.')
    {
        // `[section.sub]`: git reads it as `[section "sub"]` with the name lower-cased.
        let (section, legacy) = (section.to_owned(), legacy.to_owned());
        name = section;
        sub = Some(legacy);
    }
    if name.is_empty() || name.contains('.') {
        return Err(cur.err("a section name that is empty or mixes `.` with a quoted subsection"));
    }
    Ok((name, sub))
}

/// After the blank following a section name: `"sub"]`.
fn parse_subsection(cur: &mut Cursor<'_>) -> Result<String, GitSyntax> {
    let mut c = cur.next()?;
    while is_blank(c) {
        c = cur.next()?;
    }
    if c != b'"' {
        return Err(cur.err("a section header whose subsection is not quoted"));
    }
    let mut sub = Vec::new();
    loop {
        let mut c = cur.next()?;
        if c == b'\n' {
            return Err(cur.err("a subsection name that runs past the end of the line"));
        }
        if c == b'"' {
            break;
        }
        if c == b'\\' {
            c = cur.next()?;
            if c == b'\n' {
                return Err(cur.err("a subsection name that runs past the end of the line"));
            }
        }
        sub.push(c);
    }
    if cur.next()? != b']' {
        return Err(cur.err("a section header with text between the subsection and `]`"));
    }
    String::from_utf8(sub).map_err(|_| cur.err("a subsection name that is not UTF-8"))
}

/// From a key's first letter: its name (lower-cased) and value, through the end of its line.
fn parse_entry(cur: &mut Cursor<'_>, first: u8) -> Result<(String, Option<String>), GitSyntax> {
    let mut name = String::from(char::from(first.to_ascii_lowercase()));
    let mut c;
    loop {
        c = cur.next()?;
        if cur.eof || !is_key_char(c) {
            break;
        }
        name.push(char::from(c.to_ascii_lowercase()));
    }
    while is_blank(c) {
        c = cur.next()?;
    }
    if c == b'\n' {
        return Ok((name, None));
    }
    if c != b'=' {
        return Err(cur.err("a key followed by something other than `=`"));
    }
    Ok((name, Some(parse_value(cur)?)))
}

/// After `=`: the value, as git's `parse_value` reads it (leading and trailing unquoted blanks
/// dropped, inner ones kept).
fn parse_value(cur: &mut Cursor<'_>) -> Result<String, GitSyntax> {
    let mut value = Vec::new();
    let mut quote = false;
    let mut comment = false;
    // Length before the unquoted blanks at the end, if the value currently ends in some.
    let mut trim: Option<usize> = None;
    loop {
        let c = cur.next()?;
        if c == b'\n' {
            if quote {
                return Err(cur.err("a quoted value that runs past the end of the line"));
            }
            if let Some(len) = trim {
                value.truncate(len);
            }
            break;
        }
        if comment {
            continue;
        }
        if is_blank(c) && !quote {
            if !value.is_empty() {
                trim.get_or_insert(value.len());
                value.push(c);
            }
            continue;
        }
        if !quote && (c == b'#' || c == b';') {
            comment = true;
            continue;
        }
        trim = None;
        match c {
            b'\\' => match cur.next()? {
                b'\n' => {}
                b't' => value.push(b'\t'),
                b'b' => value.push(0x08),
                b'n' => value.push(b'\n'),
                e @ (b'\\' | b'"') => value.push(e),
                _ => {
                    return Err(cur.err("an escape git does not know (only \\n \\t \\b \\\\ \\\")"));
                }
            },
            b'"' => quote = !quote,
            _ => value.push(c),
        }
    }
    String::from_utf8(value).map_err(|_| cur.err("a value that is not UTF-8"))
}

/// A url-like value git may hand to a program: `<helper>::<address>` runs `git-remote-<helper>`
/// (`ext::` runs a shell command), and a leading `-` would read as an option.
fn plain_url(value: Option<&str>) -> bool {
    value.is_some_and(|v| !v.is_empty() && !v.contains("::") && !v.starts_with('-'))
}

fn git_inert(e: &GitEntry) -> bool {
    match (e.section.as_str(), e.sub.as_deref(), e.name.as_str()) {
        (
            "core",
            None,
            "repositoryformatversion"
            | "filemode"
            | "bare"
            | "logallrefupdates"
            | "ignorecase"
            | "precomposeunicode"
            | "symlinks",
        )
        | ("extensions", None, "objectformat" | "refstorage")
        | ("remote", Some(_), "fetch")
        | ("branch", Some(_), "merge")
        | ("user", None, "name" | "email") => true,
        ("remote", Some(_), "url") | ("branch", Some(_), "remote") => plain_url(e.value.as_deref()),
        _ => false,
    }
}

/// Splits `after` against `before`. A key is changed if `after` has a non-inert value for it that
/// `before` lacks (repeated values are matched one for one). A changed key is reverted: the kept
/// entries get `before`'s values for it, at the place of its first value in `after`, and every
/// value of it in `after` that `before` lacks is held (an inert url added beside a held one too,
/// so that nothing of the agent's is lost and `restore` brings it all back). Unchanged keys keep
/// `after`'s entries.
fn git_split(before: &[GitEntry], after: &[GitEntry]) -> (Vec<GitEntry>, Vec<HeldKey>) {
    let counts = || {
        let mut counts: HashMap<&GitEntry, usize> = HashMap::new();
        for e in before {
            *counts.entry(e).or_default() += 1;
        }
        counts
    };
    let take = |pool: &mut HashMap<&GitEntry, usize>, e: &GitEntry| match pool.get_mut(e) {
        Some(n) if *n > 0 => {
            *n -= 1;
            true
        }
        _ => false,
    };
    let mut pool = counts();
    let mut changed = HashSet::new();
    for e in after {
        if !git_inert(e) && !take(&mut pool, e) {
            changed.insert(e.key());
        }
    }
    let mut pool = counts();
    let mut held = Vec::new();
    let mut reverted = HashSet::new();
    let mut kept = Vec::new();
    for e in after {
        if !changed.contains(&e.key()) {
            kept.push(e.clone());
            continue;
        }
        if !take(&mut pool, e) {
            held.push(HeldKey { key: e.dotted(), value: render_git_value(e.value.as_deref()) });
        }
        if reverted.insert(e.key()) {
            kept.extend(before.iter().filter(|b| b.key() == e.key()).cloned());
        }
    }
    (kept, held)
}

fn git_review(before: Option<&str>, after: &str) -> Option<Split> {
    let after = parse_git(after).ok()?;
    // An unparsable earlier file is treated as unknown: every non-inert entry is then new.
    let before = before.and_then(|b| parse_git(b).ok()).map(|d| d.entries).unwrap_or_default();
    let (kept, held) = git_split(&before, &after.entries);
    let text = regenerate(&kept);
    // Belt and braces: the text reads back as exactly the kept entries, and holds nothing.
    let again = parse_git(&text).ok()?;
    if again.entries != kept || !git_split(&before, &again.entries).1.is_empty() {
        return None;
    }
    Some(Split { kept: text, held })
}

/// The canonical text of `entries`: a header whenever the section changes, tab-indented entries.
fn regenerate(entries: &[GitEntry]) -> String {
    let mut out = String::new();
    let mut current: Option<(&str, Option<&str>)> = None;
    for e in entries {
        let here = (e.section.as_str(), e.sub.as_deref());
        if current != Some(here) {
            out.push_str(&render_header(&e.section, e.sub.as_deref()));
            current = Some(here);
        }
        out.push_str(&render_entry(&e.name, e.value.as_deref()));
    }
    out
}

fn render_header(section: &str, sub: Option<&str>) -> String {
    match sub {
        None => format!("[{section}]\n"),
        Some(sub) => {
            let escaped = sub.replace('\\', "\\\\").replace('"', "\\\"");
            format!("[{section} \"{escaped}\"]\n")
        }
    }
}

fn render_entry(name: &str, value: Option<&str>) -> String {
    match value {
        None => format!("\t{name}\n"),
        Some(_) => format!("\t{name} = {}\n", render_git_value(value)),
    }
}

/// A value as it follows `=`: bare when git reads it back unchanged, otherwise quoted with
/// escapes. `None` (a bare key) renders as nothing; the empty string as `""`.
fn render_git_value(value: Option<&str>) -> String {
    let Some(v) = value else {
        return String::new();
    };
    let needs_quotes = v.is_empty()
        || v.starts_with(' ')
        || v.ends_with(' ')
        || v.contains(['"', '\\', '#', ';', '\n', '\t', '\u{8}']);
    if !needs_quotes {
        return v.to_owned();
    }
    let mut out = String::with_capacity(v.len() + 2);
    out.push('"');
    for c in v.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `section.name` or `section.sub.name` (the subsection may itself contain dots).
fn split_git_key(key: &str) -> Option<(String, Option<String>, String)> {
    let (section, rest) = key.split_once('.')?;
    let (sub, name) = match rest.rsplit_once('.') {
        Some((sub, name)) => (Some(sub), name),
        None => (None, rest),
    };
    let word = |s: &str| !s.is_empty() && s.bytes().all(is_key_char);
    let sub_ok = sub.is_none_or(|s| !s.contains(|c: char| c.is_control()));
    let name_ok = word(name) && name.starts_with(|c: char| c.is_ascii_alphabetic());
    (word(section) && name_ok && sub_ok)
        .then(|| (section.to_ascii_lowercase(), sub.map(str::to_owned), name.to_ascii_lowercase()))
}

fn git_restore(current: &str, held: &[HeldKey]) -> Result<String, CodeKeysError> {
    let file = ConfigKind::GitConfig.file();
    let unparsable = |e: GitSyntax| CodeKeysError::Unparsable { file, detail: e.to_string() };
    let mut text = current.to_owned();
    for h in held {
        let entry = held_git_entry(h)?;
        let doc = parse_git(&text).map_err(unparsable)?;
        let line = render_entry(&entry.name, entry.value.as_deref());
        let under = doc
            .line_ends
            .iter()
            .rev()
            .find(|(s, sub, _)| *s == entry.section && *sub == entry.sub)
            .map(|(_, _, end)| *end);
        let mut inserted = None;
        if let Some(at) = under {
            let mut candidate = text.clone();
            let sep = if at > 0 && !text[..at].ends_with('\n') { "\n" } else { "" };
            candidate.insert_str(at, &format!("{sep}{line}"));
            // A header sharing its line with another (`[a][b]`) would put the line elsewhere:
            // accept the place only if the file now reads as before plus exactly this entry.
            if parse_git(&candidate).is_ok_and(|d| inserted_once(&doc.entries, &d.entries, &entry))
            {
                inserted = Some(candidate);
            }
        }
        text = match inserted {
            Some(t) => t,
            None => {
                let sep = if text.is_empty() || text.ends_with('\n') { "" } else { "\n" };
                let header = render_header(&entry.section, entry.sub.as_deref());
                format!("{text}{sep}{header}{line}")
            }
        };
    }
    parse_git(&text).map_err(unparsable)?;
    Ok(text)
}

/// Whether `new` is `old` with `entry` inserted at one place and nothing else changed.
fn inserted_once(old: &[GitEntry], new: &[GitEntry], entry: &GitEntry) -> bool {
    new.len() == old.len() + 1
        && (0..new.len())
            .any(|i| new[i] == *entry && new[..i] == old[..i] && new[i + 1..] == old[i..])
}

/// Parses [`HeldKey::value`] for git: empty = a bare key, otherwise exactly one value.
/// A held key and value as the quarantine manifest spells them, parsed back into an entry.
fn held_git_entry(h: &HeldKey) -> Result<GitEntry, CodeKeysError> {
    let file = ConfigKind::GitConfig.file();
    let (section, sub, name) = split_git_key(&h.key).ok_or_else(|| CodeKeysError::BadKey {
        file,
        key: h.key.clone(),
        detail: "expected `section.name` or `section.subsection.name`".to_owned(),
    })?;
    let value = parse_held_git_value(&h.value).map_err(|detail| CodeKeysError::BadValue {
        file,
        key: h.key.clone(),
        detail,
    })?;
    Ok(GitEntry { section, sub, name, value })
}

fn parse_held_git_value(text: &str) -> Result<Option<String>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    let doc = parse_git(&format!("[x]\n\tk = {text}\n")).map_err(|e| e.to_string())?;
    match doc.entries.as_slice() {
        [GitEntry { name, value: Some(v), .. }] if name == "k" => Ok(Some(v.clone())),
        _ => Err("it is not exactly one value".to_owned()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn run(kind: ConfigKind, before: Option<&str>, after: &str) -> Reviewed {
        review(kind, before.map(str::as_bytes), after.as_bytes())
    }

    fn kept(r: &Reviewed) -> &str {
        std::str::from_utf8(r.kept.as_deref().expect("a kept file")).unwrap()
    }

    fn held_keys(r: &Reviewed) -> Vec<&str> {
        r.held.iter().map(|h| h.key.as_str()).collect()
    }

    fn held(key: &str, value: &str) -> HeldKey {
        HeldKey { key: key.to_owned(), value: value.to_owned() }
    }

    /// The leaves of a TOML text, compared by meaning.
    fn same_toml(a: &str, b: &str) -> bool {
        let (a, b) = (a.parse::<DocumentMut>().unwrap(), b.parse::<DocumentMut>().unwrap());
        let (la, lb) = (leaves(a.as_table()), leaves(b.as_table()));
        la.len() == lb.len()
            && la.iter().all(|(p, i)| get_path(b.as_table(), p).is_some_and(|j| same_item(i, j)))
    }

    fn git_entries(text: &str) -> Vec<GitEntry> {
        parse_git(text).unwrap().entries
    }

    fn sorted(mut v: Vec<GitEntry>) -> Vec<GitEntry> {
        v.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
        v
    }

    // --- kind_of -----------------------------------------------------------------------------

    #[test]
    fn kind_of_names_the_listed_files_at_any_depth() {
        let cases = [
            ("rust-toolchain.toml", ConfigKind::RustToolchain),
            ("crates/x/rust-toolchain", ConfigKind::RustToolchainLegacy),
            (".cargo/config.toml", ConfigKind::CargoConfig),
            ("sub/.cargo/config", ConfigKind::CargoConfig),
            ("mise.toml", ConfigKind::Mise),
            (".mise.toml", ConfigKind::Mise),
            ("mise.local.toml", ConfigKind::Mise),
            ("a/.mise.local.toml", ConfigKind::Mise),
            (".config/mise.toml", ConfigKind::Mise),
            (".config/mise/config.toml", ConfigKind::Mise),
            (".mise/config.toml", ConfigKind::Mise),
            ("mise.development.toml", ConfigKind::Mise),
            (".config/mise/conf.d/10-tools.toml", ConfigKind::Mise),
            ("deep/er/.tool-versions", ConfigKind::ToolVersions),
        ];
        for (path, kind) in cases {
            assert_eq!(kind_of(Path::new(path)), Some(kind), "{path}");
        }
    }

    #[test]
    fn kind_of_ignores_other_files() {
        for path in [
            "config.toml",
            "cargo/config.toml",
            ".cargo/credentials.toml",
            "Cargo.toml",
            "rust-toolchain.json",
            ".git/config",
            "mise.json",
            "tool-versions",
            "",
            "..",
        ] {
            assert_eq!(kind_of(Path::new(path)), None, "{path}");
        }
    }

    // --- rust-toolchain ----------------------------------------------------------------------

    #[test]
    fn toolchain_path_is_held_and_channel_bump_kept_with_its_comment() {
        let before =
            "[toolchain]\nchannel = \"1.79.0\"  # pinned for CI\ncomponents = [\"clippy\"]\n";
        let after = "[toolchain]\nchannel = \"1.80.0\"  # pinned for CI\ncomponents = [\"clippy\"]\n\
                     path = \"/tmp/evil\"\n";
        let r = run(ConfigKind::RustToolchain, Some(before), after);
        assert_eq!(r.held, vec![held("toolchain.path", "\"/tmp/evil\"")]);
        assert!(!r.whole_file_held);
        assert_eq!(
            kept(&r),
            "[toolchain]\nchannel = \"1.80.0\"  # pinned for CI\ncomponents = [\"clippy\"]\n"
        );
    }

    #[test]
    fn toolchain_new_file_with_only_a_path_keeps_nothing() {
        let r = run(ConfigKind::RustToolchain, None, "[toolchain]\npath = \"/tmp/evil\"\n");
        assert_eq!(held_keys(&r), ["toolchain.path"]);
        assert_eq!(kept(&r), "");
    }

    #[test]
    fn toolchain_channel_that_is_a_path_is_reverted() {
        let before = "[toolchain]\nchannel = \"stable\"\n";
        let after = "[toolchain]\nchannel = \"/tmp/evil\" # local\ntargets = [\"wasm32-unknown-unknown\"]\n";
        let r = run(ConfigKind::RustToolchain, Some(before), after);
        assert_eq!(r.held, vec![held("toolchain.channel", "\"/tmp/evil\"")]);
        assert_eq!(
            kept(&r),
            "[toolchain]\nchannel = \"stable\" # local\ntargets = [\"wasm32-unknown-unknown\"]\n"
        );
    }

    #[test]
    fn toolchain_inline_table_form_is_flattened() {
        let after = "toolchain = { channel = \"nightly\", path = \"/tmp/evil\" }\n";
        let r = run(ConfigKind::RustToolchain, None, after);
        assert_eq!(held_keys(&r), ["toolchain.path"]);
        assert!(same_toml(kept(&r), "toolchain = { channel = \"nightly\" }"), "{}", kept(&r));
    }

    #[test]
    fn legacy_toolchain_single_channel_line_is_kept() {
        for after in ["1.80.0\n", "nightly-2024-01-01", "  stable-x86_64-unknown-linux-gnu  \n"] {
            let r = run(ConfigKind::RustToolchainLegacy, Some("1.79.0\n"), after);
            assert!(r.held.is_empty() && !r.whole_file_held, "{after:?}");
            assert_eq!(kept(&r), after);
        }
    }

    #[test]
    fn legacy_toolchain_other_plain_content_is_held_whole() {
        for after in ["/tmp/evil\n", "../toolchain", "stable; touch /tmp/x\n", "-v\n", ""] {
            let r = run(ConfigKind::RustToolchainLegacy, Some("1.79.0\n"), after);
            assert!(r.whole_file_held, "{after:?}");
            assert_eq!(r.kept.as_deref(), Some(&b"1.79.0\n"[..]));
            assert!(r.held.is_empty());
        }
    }

    #[test]
    fn legacy_toolchain_toml_form_holds_path() {
        let after = "[toolchain]\nchannel = \"nightly\"\npath = \"/tmp/evil\"\n";
        let r = run(ConfigKind::RustToolchainLegacy, Some("nightly\n"), after);
        assert_eq!(held_keys(&r), ["toolchain.path"]);
        assert_eq!(kept(&r), "[toolchain]\nchannel = \"nightly\"\n");
    }

    #[test]
    fn legacy_toolchain_that_would_collapse_to_one_line_is_held_whole() {
        // Without `path` this is one line, which rustup would read as a channel name.
        let r = run(ConfigKind::RustToolchainLegacy, None, "[toolchain]\npath = \"/tmp/evil\"\n");
        assert!(r.whole_file_held);
        assert_eq!(r.kept, None);
    }

    // --- Cargo -------------------------------------------------------------------------------

    const CARGO_BEFORE: &str = "\
# Shared settings for the workspace.
[build]
jobs = 4

[alias]
t = \"test --workspace\"
";

    #[test]
    fn cargo_code_running_keys_are_held_and_inert_edits_survive() {
        let after = "\
# Shared settings for the workspace.
[build]
jobs = 8  # the new box has more cores
rustc-wrapper = \"/tmp/evil\"

[alias]
t = \"test --workspace\"
b = \"run --bin evil\"

[target.x86_64-unknown-linux-gnu]
runner = \"./evil.sh\"
linker = \"/tmp/ld\"

[env]
RUSTC_WRAPPER = \"/tmp/evil\"

[source.crates-io]
replace-with = \"evil\"

[source.evil]
directory = \"vendor\"

[term]
color = \"always\"
";
        let r = run(ConfigKind::CargoConfig, Some(CARGO_BEFORE), after);
        assert_eq!(
            held_keys(&r),
            [
                "build.rustc-wrapper",
                "alias.b",
                "target.x86_64-unknown-linux-gnu.runner",
                "target.x86_64-unknown-linux-gnu.linker",
                "env.RUSTC_WRAPPER",
                "source.crates-io.replace-with",
                "source.evil.directory",
            ]
        );
        assert_eq!(r.held[2].value, "\"./evil.sh\"");
        assert_eq!(
            kept(&r),
            "\
# Shared settings for the workspace.
[build]
jobs = 8  # the new box has more cores

[alias]
t = \"test --workspace\"

[term]
color = \"always\"
"
        );
    }

    #[test]
    fn cargo_changed_alias_is_reverted_in_place() {
        let after = CARGO_BEFORE.replace("test --workspace", "run --bin evil");
        let r = run(ConfigKind::CargoConfig, Some(CARGO_BEFORE), &after);
        assert_eq!(r.held, vec![held("alias.t", "\"run --bin evil\"")]);
        assert_eq!(kept(&r), CARGO_BEFORE);
    }

    #[test]
    fn cargo_dotted_and_inline_spellings_are_held_too() {
        let after = "\
build = { jobs = 2, rustc-wrapper = \"/tmp/evil\" }
target.'cfg(unix)'.runner = \"/tmp/evil\"
alias.b = \"run --bin evil\"
";
        let r = run(ConfigKind::CargoConfig, None, after);
        assert_eq!(
            held_keys(&r),
            ["build.rustc-wrapper", "target.\"cfg(unix)\".runner", "alias.b"]
        );
        assert!(same_toml(kept(&r), "build = { jobs = 2 }"), "{}", kept(&r));
    }

    #[test]
    fn cargo_keys_the_agent_removed_stay_removed() {
        let after = "# Shared settings for the workspace.\n[build]\njobs = 4\n";
        let r = run(ConfigKind::CargoConfig, Some(CARGO_BEFORE), after);
        assert!(r.held.is_empty());
        assert_eq!(kept(&r), after);
    }

    #[test]
    fn cargo_developers_own_code_running_keys_are_left_alone() {
        let before = "[target.x86_64-unknown-linux-gnu]\nlinker = \"clang\"\n";
        let after = "[target.x86_64-unknown-linux-gnu]\nlinker = \"clang\"  # faster links\n\
                     [build]\njobs = 2\n";
        let r = run(ConfigKind::CargoConfig, Some(before), after);
        assert!(r.held.is_empty());
        assert_eq!(kept(&r), after);
    }

    #[test]
    fn cargo_empty_table_the_developer_had_is_not_pruned() {
        let before = "# Aliases go here.\n[alias]\n";
        let after = "# Aliases go here.\n[alias]\nb = \"run --bin evil\"\n";
        let r = run(ConfigKind::CargoConfig, Some(before), after);
        assert_eq!(held_keys(&r), ["alias.b"]);
        assert_eq!(kept(&r), before);
    }

    #[test]
    fn cargo_profile_settings_are_inert_but_not_package_overrides() {
        let after = "\
[profile.release]
lto = \"thin\"
codegen-units = 1
debug = \"line-tables-only\"

[profile.dev.package.\"*\"]
opt-level = 2

[profile.dev.build-override]
opt-level = 3
";
        let r = run(ConfigKind::CargoConfig, None, after);
        assert_eq!(
            held_keys(&r),
            ["profile.dev.package.\"*\".opt-level", "profile.dev.build-override.opt-level"]
        );
        assert!(kept(&r).starts_with("[profile.release]\nlto = \"thin\"\ncodegen-units = 1\n"));
        assert!(!kept(&r).contains("opt-level"));
    }

    #[test]
    fn cargo_target_and_target_dir_are_inert_only_in_their_plain_shape() {
        let ok = "[build]\ntarget = \"wasm32-unknown-unknown\"\ntarget-dir = \"target/alt\"\n\
                  incremental = false\n[net]\nretry = 3\noffline = true\n[http]\ntimeout = 30\n\
                  [cargo-new]\nvcs = \"none\"\n[future-incompat-report]\nfrequency = \"never\"\n";
        assert!(run(ConfigKind::CargoConfig, None, ok).held.is_empty());
        for (line, key) in [
            ("target = \"./evil.json\"", "build.target"),
            ("target = [\"x86_64-unknown-linux-gnu\", \"specs/evil.json\"]", "build.target"),
            ("target-dir = \"/home/dev/.local/bin\"", "build.target-dir"),
            ("target-dir = \"../outside\"", "build.target-dir"),
            ("target-dir = \".git/hooks\"", "build.target-dir"),
            ("rustflags = [\"-Clinker=/tmp/evil\"]", "build.rustflags"),
            ("rustc = \"/tmp/evil\"", "build.rustc"),
        ] {
            let r = run(ConfigKind::CargoConfig, None, &format!("[build]\n{line}\n"));
            assert_eq!(held_keys(&r), [key], "{line}");
        }
    }

    #[test]
    fn cargo_other_code_running_tables_are_held() {
        let after = "\
credential-provider = \"/tmp/evil\"
paths = [\"../evil\"]
[doc]
browser = \"/tmp/evil\"
[registries.evil]
index = \"sparse+https://example.com/\"
[patch.crates-io]
serde = { path = \"evil\" }
[unstable]
build-std = [\"std\"]
";
        let r = run(ConfigKind::CargoConfig, None, after);
        assert_eq!(
            held_keys(&r),
            [
                "credential-provider",
                "paths",
                "doc.browser",
                "registries.evil.index",
                "patch.crates-io.serde.path",
                "unstable.build-std"
            ]
        );
        assert_eq!(kept(&r), "");
    }

    #[test]
    fn unparsable_toml_is_held_whole_and_the_earlier_file_stays() {
        let r = run(ConfigKind::CargoConfig, Some(CARGO_BEFORE), "[build\nrustc-wrapper = 1\n");
        assert!(r.whole_file_held && r.held.is_empty());
        assert_eq!(r.kept.as_deref(), Some(CARGO_BEFORE.as_bytes()));
        let r = run(ConfigKind::Mise, None, "[env]\n_.source = \n");
        assert!(r.whole_file_held);
        assert_eq!(r.kept, None);
        let r = review(ConfigKind::CargoConfig, None, b"[build]\njobs = 1 # \xff\n");
        assert!(r.whole_file_held);
    }

    #[test]
    fn oversized_file_is_held_whole() {
        let after = format!("[build]\njobs = 2\n# {}\n", "x".repeat(MAX_BYTES));
        let r = run(ConfigKind::CargoConfig, Some(CARGO_BEFORE), &after);
        assert!(r.whole_file_held);
        assert_eq!(r.kept.as_deref(), Some(CARGO_BEFORE.as_bytes()));
    }

    #[test]
    fn unchanged_file_is_kept_byte_for_byte_even_if_it_does_not_parse() {
        let text = "[build\nweird = \n";
        let r = run(ConfigKind::CargoConfig, Some(text), text);
        assert!(!r.whole_file_held && r.held.is_empty());
        assert_eq!(kept(&r), text);
    }

    // --- mise --------------------------------------------------------------------------------

    #[test]
    fn mise_env_hooks_and_backend_tools_are_held_plain_tools_kept() {
        let before = "[tools]\nnode = \"18\"\n";
        let after = "\
min_version = \"2024.9.0\"

[tools]
node = \"20\"  # LTS
python = [\"3.12\", \"3.11\"]
\"ubi:evil/tool\" = \"latest\"
ruby = \"path:/tmp/ruby\"
go = \"ref:master\"

[env]
NODE_ENV = \"development\"
_.source = \"./evil.sh\"
_.path = [\"./bin\"]

[hooks]
enter = \"./evil.sh\"

[tasks.build]
run = \"cargo build\"

[settings]
experimental = true
";
        let r = run(ConfigKind::Mise, Some(before), after);
        assert_eq!(
            held_keys(&r),
            [
                "tools.\"ubi:evil/tool\"",
                "tools.ruby",
                "tools.go",
                "env.NODE_ENV",
                "env._.source",
                "env._.path",
                "hooks.enter",
                "tasks.build.run",
                "settings.experimental",
            ]
        );
        assert_eq!(
            kept(&r),
            "min_version = \"2024.9.0\"\n\n[tools]\nnode = \"20\"  # LTS\npython = [\"3.12\", \"3.11\"]\n"
        );
    }

    #[test]
    fn mise_tool_option_tables_are_held() {
        let after = "[tools]\nnode = { version = \"20\", postinstall = \"./evil.sh\" }\n";
        let r = run(ConfigKind::Mise, None, after);
        assert_eq!(held_keys(&r), ["tools.node.version", "tools.node.postinstall"]);
    }

    #[test]
    fn mise_array_of_tables_is_one_held_leaf() {
        let after = "[[hooks.enter]]\nscript = \"./a.sh\"\n[[hooks.enter]]\nscript = \"./b.sh\"\n";
        let r = run(ConfigKind::Mise, None, after);
        assert_eq!(r.held.len(), 1);
        assert_eq!(r.held[0].key, "hooks.enter");
        assert!(r.held[0].value.contains("./a.sh") && r.held[0].value.contains("./b.sh"));
        let back = restore(ConfigKind::Mise, r.kept.as_deref().unwrap(), &r.held).unwrap();
        let back = std::str::from_utf8(&back).unwrap();
        let doc = back.parse::<DocumentMut>().unwrap();
        let enter = get_path(doc.as_table(), &["hooks".into(), "enter".into()]).unwrap();
        assert_eq!(enter.as_array().map(toml_edit::Array::len), Some(2), "{back}");
    }

    // --- .tool-versions ----------------------------------------------------------------------

    #[test]
    fn tool_versions_local_code_lines_are_held_and_reverted() {
        let before = "nodejs 18.19.0\npython 3.11.7\n";
        let after = "# pinned\nnodejs path:/tmp/x\npython 3.12.1 3.11.7  # bump\nruby ref:master\n\
                     ubi:evil/tool 1.0\n";
        let r = run(ConfigKind::ToolVersions, Some(before), after);
        assert_eq!(
            r.held,
            vec![
                held("nodejs", "path:/tmp/x"),
                held("ruby", "ref:master"),
                held("ubi:evil/tool", "1.0")
            ]
        );
        assert_eq!(kept(&r), "# pinned\nnodejs 18.19.0\npython 3.12.1 3.11.7  # bump\n");
    }

    #[test]
    fn tool_versions_developers_own_path_line_is_left_alone() {
        let before = "nodejs path:/opt/node\n";
        let after = "nodejs   path:/opt/node\ngolang 1.22.0";
        let r = run(ConfigKind::ToolVersions, Some(before), after);
        assert!(r.held.is_empty());
        assert_eq!(kept(&r), after);
    }

    #[test]
    fn tool_versions_restore_round_trips() {
        let before = "nodejs 18.19.0\npython 3.11.7";
        let after = "nodejs path:/tmp/x\npython 3.11.7\nruby ref:master";
        let r = run(ConfigKind::ToolVersions, Some(before), after);
        assert_eq!(kept(&r), "nodejs 18.19.0\npython 3.11.7\n");
        let back = restore(ConfigKind::ToolVersions, r.kept.as_deref().unwrap(), &r.held).unwrap();
        assert_eq!(
            std::str::from_utf8(&back).unwrap(),
            "nodejs path:/tmp/x\npython 3.11.7\nruby ref:master\n"
        );
    }

    #[test]
    fn tool_versions_restore_rejects_a_damaged_record() {
        for h in [held("a b", "1"), held("node", ""), held("node", "1\nruby ref:x")] {
            assert!(restore(ConfigKind::ToolVersions, b"", &[h]).is_err());
        }
    }

    // --- TOML restore ------------------------------------------------------------------------

    #[test]
    fn toml_restore_round_trips() {
        let cases = [
            (
                ConfigKind::CargoConfig,
                Some(CARGO_BEFORE),
                "[build]\njobs = 8\nrustc-wrapper = \"/tmp/evil\"\n[alias]\nt = \"run --bin evil\"\n\
                 [target.'cfg(unix)']\nrunner = [\"/tmp/evil\", \"--flag\"]\n[env]\nX = { value = \"1\", force = true }\n",
            ),
            (
                ConfigKind::RustToolchain,
                None,
                "[toolchain]\nchannel = \"1.80.0\"\npath = \"/tmp/evil\"\n",
            ),
            (
                ConfigKind::Mise,
                None,
                "[tools]\nnode = \"20\"\n\"ubi:x/y\" = \"1\"\n[env]\n_.source = \"./evil.sh\"\n",
            ),
        ];
        for (kind, before, after) in cases {
            let r = run(kind, before, after);
            assert!(!r.held.is_empty(), "{after}");
            let back = restore(kind, r.kept.as_deref().unwrap(), &r.held).unwrap();
            let back = std::str::from_utf8(&back).unwrap();
            assert!(same_toml(back, after), "{kind:?}:\n{back}");
        }
    }

    #[test]
    fn legacy_toolchain_restore_turns_a_channel_line_into_toml() {
        let back = restore(
            ConfigKind::RustToolchainLegacy,
            b"nightly\n",
            &[held("toolchain.path", "\"/opt/rust\"")],
        )
        .unwrap();
        let back = std::str::from_utf8(&back).unwrap();
        assert!(
            same_toml(back, "[toolchain]\nchannel = \"nightly\"\npath = \"/opt/rust\""),
            "{back}"
        );
    }

    #[test]
    fn toml_restore_fails_clearly() {
        let err =
            restore(ConfigKind::CargoConfig, b"[build\n", &[held("alias.b", "\"x\"")]).unwrap_err();
        assert!(matches!(err, CodeKeysError::Unparsable { .. }), "{err}");
        assert!(err.to_string().contains("fix its syntax by hand"), "{err}");
        let err =
            restore(ConfigKind::CargoConfig, b"target = 1\n", &[held("target.x.runner", "\"r\"")])
                .unwrap_err();
        assert!(matches!(&err, CodeKeysError::Conflict { at, .. } if at == "target"), "{err}");
        let err = restore(ConfigKind::CargoConfig, b"", &[held("a..b", "1")]).unwrap_err();
        assert!(matches!(err, CodeKeysError::BadKey { .. }), "{err}");
        let err = restore(ConfigKind::CargoConfig, b"", &[held("a", "1\nb = 2")]).unwrap_err();
        assert!(matches!(err, CodeKeysError::BadValue { .. }), "{err}");
        let err = restore(ConfigKind::CargoConfig, b"\xff", &[]).unwrap_err();
        assert!(matches!(err, CodeKeysError::NotText { .. }), "{err}");
    }

    // --- git config --------------------------------------------------------------------------

    const GIT_INIT: &str = "\
[core]
\trepositoryformatversion = 0
\tfilemode = true
\tbare = false
\tlogallrefupdates = true
";

    #[test]
    fn git_code_running_keys_are_held_and_remotes_kept() {
        let after = "\
[core]
\trepositoryformatversion = 0
\tfilemode = true
\tbare = false
\tlogallrefupdates = true
\tfsmonitor = /tmp/evil
\thooksPath = /tmp/hooks
\tsshCommand = ssh -oProxyCommand=evil
[include]
\tpath = /tmp/evil.cfg
[remote \"origin\"]
\turl = https://example.com/x.git
\tfetch = +refs/heads/*:refs/remotes/origin/*
\tuploadpack = /tmp/evil
[branch \"main\"]
\tremote = origin
\tmerge = refs/heads/main
";
        let r = run(ConfigKind::GitConfig, Some(GIT_INIT), after);
        assert_eq!(
            r.held,
            vec![
                held("core.fsmonitor", "/tmp/evil"),
                held("core.hookspath", "/tmp/hooks"),
                held("core.sshcommand", "ssh -oProxyCommand=evil"),
                held("include.path", "/tmp/evil.cfg"),
                held("remote.origin.uploadpack", "/tmp/evil"),
            ]
        );
        assert_eq!(
            kept(&r),
            format!(
                "{GIT_INIT}[remote \"origin\"]\n\turl = https://example.com/x.git\n\
                 \tfetch = +refs/heads/*:refs/remotes/origin/*\n[branch \"main\"]\n\tremote = origin\n\
                 \tmerge = refs/heads/main\n"
            )
        );
    }

    #[test]
    fn git_new_repo_config_keeps_only_inert_entries() {
        let after = format!("{GIT_INIT}\tfsmonitor = true\n[user]\n\tname = Dev\n");
        let r = run(ConfigKind::GitConfig, None, &after);
        assert_eq!(held_keys(&r), ["core.fsmonitor"]);
        assert_eq!(kept(&r), format!("{GIT_INIT}[user]\n\tname = Dev\n"));
    }

    #[test]
    fn git_tricky_spellings_are_still_seen() {
        let cases = [
            ("[core]fsmonitor=/tmp/evil\n", "core.fsmonitor", "/tmp/evil"),
            ("[CoRe]\n\tFsMonitor = /tmp/evil\n", "core.fsmonitor", "/tmp/evil"),
            ("[core]\n\tfsmonitor\n", "core.fsmonitor", ""),
            ("[core]\n\tfsmonitor = /tmp/\\\nevil\n", "core.fsmonitor", "/tmp/evil"),
            (
                "[core]\n\tfsmonitor = \"/tmp/e vil \" ; run it\n",
                "core.fsmonitor",
                "\"/tmp/e vil \"",
            ),
            ("[core]\r\n\tfsmonitor = /tmp/evil\r\n", "core.fsmonitor", "/tmp/evil"),
            ("\u{feff}[core]\n\tfsmonitor = x\n", "core.fsmonitor", "x"),
            ("[remote.Origin]\n\tuploadpack = x\n", "remote.origin.uploadpack", "x"),
            ("[remote \"a\\\"b\"]\n\tuploadpack = x\n", "remote.a\"b.uploadpack", "x"),
            // git 2.47 reads this as `core..fsmonitor`: a subsection named "", which is not
            // `core.fsmonitor`. It is not inert either way.
            ("[core \"\"]\n\tfsmonitor = x\n", "core..fsmonitor", "x"),
            ("[core \"x\"]\n\tbare = true\n", "core.x.bare", "true"),
            ("[remote \"o\"]\n\turl = ext::sh -c evil\n", "remote.o.url", "ext::sh -c evil"),
            (
                "[remote \"o\"]\n\turl = -oProxyCommand=evil\n",
                "remote.o.url",
                "-oProxyCommand=evil",
            ),
            ("[branch \"m\"]\n\tremote = fd::3\n", "branch.m.remote", "fd::3"),
            ("[extensions]\n\tworktreeConfig = true\n", "extensions.worktreeconfig", "true"),
            ("[includeIf \"gitdir:/\"]\n\tpath = /tmp/x\n", "includeif.gitdir:/.path", "/tmp/x"),
        ];
        for (after, key, value) in cases {
            let r = run(ConfigKind::GitConfig, None, after);
            assert!(!r.whole_file_held, "{after:?}");
            assert_eq!(r.held, vec![held(key, value)], "{after:?}");
            assert_eq!(kept(&r), "", "{after:?}");
        }
    }

    #[test]
    fn git_comments_and_quotes_with_brackets_hide_nothing() {
        let after = "\
# [core] ] fsmonitor = x
[core] ; fsmonitor = x ]
\tbare = true # ] [alias]
[user]
\tname = \"Dev # ] [core] fsmonitor = x\"
\temail = dev@example.com;fsmonitor=x
";
        let r = run(ConfigKind::GitConfig, None, after);
        assert!(r.held.is_empty(), "{:?}", r.held);
        assert_eq!(
            kept(&r),
            "[core]\n\tbare = true\n[user]\n\tname = \"Dev # ] [core] fsmonitor = x\"\n\
             \temail = dev@example.com\n"
        );
    }

    #[test]
    fn git_continuation_cannot_start_a_new_key() {
        // The backslash joins the next line to the value: git reads one `user.name`.
        let after = "[user]\n\tname = a \\\n\tfsmonitor = x\n";
        let r = run(ConfigKind::GitConfig, None, after);
        assert!(r.held.is_empty());
        let entries = git_entries(kept(&r));
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].value.as_deref(), Some("a \tfsmonitor = x"));
        assert_eq!(kept(&r), "[user]\n\tname = \"a \\tfsmonitor = x\"\n");
    }

    #[test]
    fn git_unparsable_file_is_held_whole() {
        for after in [
            "[core]\n\tfsmonitor = \"unterminated\n",
            "[core]\n\tfsmonitor = \\q\n",
            "fsmonitor = x\n",
            "[core \"x\" ]\n\tbare = true\n",
            "[a.b \"c\"]\n\tk = v\n",
            "[core]\n\tbare # comment\n",
            "[core]\n\t1bare = true\n",
            "[core\n",
            "[core]\n\tbare = tr\0ue\n",
        ] {
            let r = run(ConfigKind::GitConfig, Some(GIT_INIT), after);
            assert!(r.whole_file_held, "{after:?}");
            assert_eq!(r.kept.as_deref(), Some(GIT_INIT.as_bytes()));
        }
    }

    #[test]
    fn git_multi_valued_keys_keep_their_order() {
        let after = "[remote \"origin\"]\n\turl = https://example.com/x\n\
                     \tfetch = +refs/heads/main:refs/remotes/origin/main\n\
                     \tfetch = +refs/tags/*:refs/tags/*\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n";
        let r = run(ConfigKind::GitConfig, None, after);
        assert!(r.held.is_empty());
        assert_eq!(kept(&r), after);
    }

    #[test]
    fn git_changed_key_is_reverted_and_identical_ones_kept() {
        let before = "[core]\n\thooksPath = .githooks\n[alias]\n\tst = status\n";
        let after = "[core]\n\thooksPath = /tmp/evil\n[alias]\n\tst = status\n\tco = !sh evil\n";
        let r = run(ConfigKind::GitConfig, Some(before), after);
        assert_eq!(r.held, vec![held("core.hookspath", "/tmp/evil"), held("alias.co", "!sh evil")]);
        assert_eq!(kept(&r), "[core]\n\thookspath = .githooks\n[alias]\n\tst = status\n");
    }

    #[test]
    fn git_added_value_of_a_repeated_key_reverts_to_the_earlier_values() {
        let before = "[include]\n\tpath = a.cfg\n\tpath = b.cfg\n";
        let after = "[include]\n\tpath = a.cfg\n\tpath = /tmp/evil.cfg\n\tpath = b.cfg\n";
        let r = run(ConfigKind::GitConfig, Some(before), after);
        assert_eq!(r.held, vec![held("include.path", "/tmp/evil.cfg")]);
        assert_eq!(kept(&r), before);
    }

    #[test]
    fn git_inert_value_beside_a_held_one_is_held_with_it() {
        // The key is reverted as a whole, so the agent's new inert url is held too (not lost).
        let before = "[remote \"o\"]\n\turl = https://example.com/a\n";
        let after = "[remote \"o\"]\n\turl = https://example.com/b\n\turl = ext::sh -c evil\n";
        let r = run(ConfigKind::GitConfig, Some(before), after);
        assert_eq!(
            r.held,
            vec![
                held("remote.o.url", "https://example.com/b"),
                held("remote.o.url", "ext::sh -c evil")
            ]
        );
        assert_eq!(kept(&r), before);
    }

    #[test]
    fn git_values_are_quoted_where_git_would_read_them_differently() {
        let cases = [
            (Some(""), "\"\""),
            (Some(" lead"), "\" lead\""),
            (Some("trail "), "\"trail \""),
            (Some("a#b;c"), "\"a#b;c\""),
            (Some("q\"b\\s"), "\"q\\\"b\\\\s\""),
            (Some("l1\nl2\tt\u{8}"), "\"l1\\nl2\\tt\\b\""),
            (Some("plain value = ok [x]"), "plain value = ok [x]"),
            (None, ""),
        ];
        for (value, rendered) in cases {
            assert_eq!(render_git_value(value), rendered);
            let text = format!("[s]\n\tk = {rendered}\n");
            if let Some(v) = value {
                assert_eq!(git_entries(&text)[0].value.as_deref(), Some(v), "{text:?}");
            }
        }
    }

    #[test]
    fn git_restore_round_trips() {
        let after = "\
[core]
\tbare = false
\tfsmonitor = /tmp/evil
[remote \"origin\"]
\turl = https://example.com/x
\tuploadpack = \"/tmp/e vil\"
[alias]
\tx
";
        let r = run(ConfigKind::GitConfig, None, after);
        assert_eq!(held_keys(&r), ["core.fsmonitor", "remote.origin.uploadpack", "alias.x"]);
        let back = restore(ConfigKind::GitConfig, r.kept.as_deref().unwrap(), &r.held).unwrap();
        let back = std::str::from_utf8(&back).unwrap();
        assert_eq!(sorted(git_entries(back)), sorted(git_entries(after)));
        // Under their own sections: `core` and `remote "origin"` existed, `alias` is new.
        assert_eq!(
            back,
            "[core]\n\tbare = false\n\tfsmonitor = /tmp/evil\n[remote \"origin\"]\n\
             \turl = https://example.com/x\n\tuploadpack = /tmp/e vil\n[alias]\n\tx\n"
        );
    }

    #[test]
    fn git_restore_keeps_the_developers_formatting() {
        let current = "# mine\n[core]  # main section\n    bare = false\n[user]\n    name = Dev";
        let back = restore(
            ConfigKind::GitConfig,
            current.as_bytes(),
            &[held("core.fsmonitor", "x"), held("user.email", "dev@example.com")],
        )
        .unwrap();
        assert_eq!(
            std::str::from_utf8(&back).unwrap(),
            "# mine\n[core]  # main section\n    bare = false\n\tfsmonitor = x\n[user]\n    name = Dev\n\
             \temail = dev@example.com\n"
        );
    }

    #[test]
    fn git_restore_does_not_land_in_a_section_sharing_the_header_line() {
        let back =
            restore(ConfigKind::GitConfig, b"[a][b]\n\tk = 1\n", &[held("a.fsmonitor", "x")])
                .unwrap();
        let back = std::str::from_utf8(&back).unwrap();
        let entries = git_entries(back);
        assert!(entries.iter().any(|e| e.dotted() == "a.fsmonitor"), "{back}");
        assert!(entries.iter().all(|e| e.dotted() != "b.fsmonitor"), "{back}");
    }

    #[test]
    fn git_restore_fails_clearly() {
        let err = restore(ConfigKind::GitConfig, b"[core\n", &[held("core.x", "1")]).unwrap_err();
        assert!(matches!(err, CodeKeysError::Unparsable { .. }), "{err}");
        for key in ["core", "core.", ".x", "co re.x", "core.1x"] {
            let err = restore(ConfigKind::GitConfig, b"", &[held(key, "1")]).unwrap_err();
            assert!(matches!(err, CodeKeysError::BadKey { .. }), "{key}: {err}");
        }
        // A value that smuggles a second entry in is refused, not written.
        for value in ["x\n[core]\n\tfsmonitor = y", "\"open", "a\\q"] {
            let err = restore(ConfigKind::GitConfig, b"", &[held("user.name", value)]).unwrap_err();
            assert!(matches!(err, CodeKeysError::BadValue { .. }), "{value:?}: {err}");
        }
    }

    #[test]
    fn held_key_serialises_as_key_and_value() {
        let h = held("core.fsmonitor", "/tmp/evil");
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(json, r#"{"key":"core.fsmonitor","value":"/tmp/evil"}"#);
        assert_eq!(serde_json::from_str::<HeldKey>(&json).unwrap(), h);
    }

    // --- git parser / regenerator properties -------------------------------------------------

    fn git_entry() -> impl Strategy<Value = GitEntry> {
        let keys = prop::sample::select(vec![
            ("core", false, "bare"),
            ("core", false, "fsmonitor"),
            ("core", false, "hookspath"),
            ("core", true, "bare"),
            ("user", false, "name"),
            ("remote", true, "url"),
            ("remote", true, "fetch"),
            ("remote", true, "uploadpack"),
            ("branch", true, "merge"),
            ("include", false, "path"),
            ("alias", false, "st"),
            ("x-y", false, "k-1"),
        ]);
        let sub = "[a-zA-Z0-9 ._\"\\\\/#;:\\[\\]é-]{0,6}";
        let value = prop::option::of("[ -~\\t\\n\\x08é]{0,10}");
        (keys, sub, value).prop_map(|((section, has_sub, name), sub, value)| GitEntry {
            section: section.to_owned(),
            sub: has_sub.then_some(sub),
            name: name.to_owned(),
            value,
        })
    }

    /// `entries` written in one of several spellings git accepts, chosen per entry by `style`.
    fn spell(entries: &[GitEntry], styles: &[u8]) -> String {
        let mut out = String::new();
        for (e, style) in entries.iter().zip(styles.iter().cycle()) {
            let header = render_header(&e.section, e.sub.as_deref());
            let header = header.trim_end();
            let value = render_git_value(e.value.as_deref());
            match (style % 4, &e.value) {
                (0, _) => out
                    .push_str(&format!("{header}\n{}", render_entry(&e.name, e.value.as_deref()))),
                (1, None) => out.push_str(&format!("{header}{}\n", e.name)),
                (1, Some(_)) => out.push_str(&format!("{header}{}={value} ; note ]\n", e.name)),
                (2, None) => out.push_str(&format!(
                    "# [core]\n{}\n  {}  \n",
                    shout(header),
                    e.name.to_uppercase()
                )),
                (2, Some(_)) => out.push_str(&format!(
                    "{}  # c\n  {} =   {value}\t# c\n",
                    shout(header),
                    e.name.to_uppercase()
                )),
                (_, None) => out.push_str(&format!("{header}\r\n\t{}\r\n", e.name)),
                (_, Some(_)) => out.push_str(&format!("{header}\n\t{} = \\\n{value}\n", e.name)),
            }
        }
        out
    }

    /// The section name upper-cased (git ignores its case), the subsection left alone.
    fn shout(header: &str) -> String {
        match header.split_once(' ') {
            Some((section, rest)) => format!("{} {rest}", section.to_uppercase()),
            None => header.to_uppercase(),
        }
    }

    /// Differential check against the real git (run by hand: `cargo test --lib codekeys --
    /// --ignored`): on random config-shaped text, wherever git accepts a file this parser either
    /// reads the same entries or refuses the file (it never reads something git does not).
    #[test]
    #[ignore = "runs the host's git; a by-hand differential check"]
    fn git_parser_agrees_with_real_git() {
        use proptest::strategy::ValueTree;
        use proptest::test_runner::TestRunner;
        let line = "([ \\t]*[a-cA-C][a-c-]{0,2}[ \\t]*(=[\\[\\]\" \\t=#;a-c.\\\\é]{0,12})?\
                    (\\\\?\\n|\\n\\[[a-c.]{1,3}( \"[a-c\\\\\"]{0,3}\")?\\]))*";
        let noise = "[\\[\\]\" \\t\\n=#;a-cA-C.\\\\é]{0,40}";
        let mut runner = TestRunner::deterministic();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config");
        let mut same = 0;
        for strategy in [line, noise] {
            for _ in 0..3000 {
                let text =
                    format!("[s \"x\"]\n{}", strategy.new_tree(&mut runner).unwrap().current());
                std::fs::write(&path, &text).unwrap();
                let git = std::process::Command::new("git")
                    .args(["config", "--list", "-z", "--file"])
                    .arg(&path)
                    .output()
                    .unwrap();
                let Ok(doc) = parse_git(&text) else { continue };
                assert!(git.status.success(), "git refuses what this parser reads: {text:?}");
                let theirs: Vec<String> = git
                    .stdout
                    .split(|&b| b == 0)
                    .filter(|s| !s.is_empty())
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect();
                let ours: Vec<String> = doc
                    .entries
                    .iter()
                    .map(|e| match &e.value {
                        Some(v) => format!("{}\n{v}", e.dotted()),
                        None => e.dotted(),
                    })
                    .collect();
                assert_eq!(theirs, ours, "{text:?}");
                same += 1;
            }
        }
        assert!(same > 100, "too few files parsed to compare ({same})");
    }

    proptest! {
        #[test]
        fn git_parser_reads_every_spelling_back(
            entries in prop::collection::vec(git_entry(), 0..8),
            styles in prop::collection::vec(any::<u8>(), 1..8),
        ) {
            let text = spell(&entries, &styles);
            prop_assert_eq!(parse_git(&text).map(|d| d.entries).map_err(|e| e.to_string()), Ok(entries.clone()));
            prop_assert_eq!(git_entries(&regenerate(&entries)), entries);
        }

        #[test]
        fn git_kept_output_is_a_fixed_point(
            before in prop::collection::vec(git_entry(), 0..6),
            after in prop::collection::vec(git_entry(), 0..8),
            styles in prop::collection::vec(any::<u8>(), 1..8),
        ) {
            let (before, after) = (spell(&before, &styles), spell(&after, &styles));
            for before in [None, Some(before.as_str())] {
                let r = run(ConfigKind::GitConfig, before, &after);
                prop_assert!(!r.whole_file_held);
                let kept = kept(&r).to_owned();
                let again = run(ConfigKind::GitConfig, before, &kept);
                prop_assert!(again.held.is_empty(), "{:?}", again.held);
                prop_assert_eq!(self::kept(&again), kept.as_str());
                // An unchanged file is kept byte for byte; anything else is regenerated.
                if before != Some(after.as_str()) {
                    prop_assert_eq!(regenerate(&git_entries(&kept)), kept.clone());
                }
                // Restoring what was held brings every one of the agent's entries back.
                let back = restore(ConfigKind::GitConfig, kept.as_bytes(), &r.held).unwrap();
                let back = git_entries(std::str::from_utf8(&back).unwrap());
                for e in git_entries(&after) {
                    prop_assert!(back.contains(&e), "{:?} missing", e);
                }
            }
        }

        /// Setting a key in any spelling of a file changes exactly that key, and setting the
        /// old values back reads as the original file.
        #[test]
        fn git_set_changes_exactly_one_key_in_any_spelling(
            entries in prop::collection::vec(git_entry(), 0..8),
            target in git_entry(),
            values in prop::collection::vec(prop::option::of("[ -~\\t\\né]{0,10}"), 0..3),
            styles in prop::collection::vec(any::<u8>(), 1..8),
        ) {
            let text = spell(&entries, &styles);
            let key = GitKey::of(&target);
            let out = git_set(&text, &key, &values).unwrap();
            let got = git_entries(&out);
            let mine: Vec<Option<String>> =
                got.iter().filter(|e| GitKey::of(e) == key).map(|e| e.value.clone()).collect();
            prop_assert_eq!(&mine, &values);
            let others = |es: &[GitEntry]| -> Vec<GitEntry> {
                es.iter().filter(|e| GitKey::of(e) != key).cloned().collect()
            };
            prop_assert_eq!(others(&got), others(&git_entries(&text)));
            let old: Vec<Option<String>> = git_entries(&text)
                .iter()
                .filter(|e| GitKey::of(e) == key)
                .map(|e| e.value.clone())
                .collect();
            let back = git_set(&out, &key, &old).unwrap();
            let again: Vec<Option<String>> = git_entries(&back)
                .iter()
                .filter(|e| GitKey::of(e) == key)
                .map(|e| e.value.clone())
                .collect();
            prop_assert_eq!(again, old);
        }

        #[test]
        fn git_parser_survives_noise(text in "[\\[\\]\"\\\\ \\t\\n=#;a-cA-C.é\\r]{0,60}") {
            let r = run(ConfigKind::GitConfig, None, &text);
            if !r.whole_file_held {
                let kept = kept(&r).to_owned();
                prop_assert!(git_entries(&kept).iter().all(git_inert));
                let again = run(ConfigKind::GitConfig, None, &kept);
                prop_assert!(again.held.is_empty());
                prop_assert_eq!(self::kept(&again), kept.as_str());
            }
        }
    }
}
