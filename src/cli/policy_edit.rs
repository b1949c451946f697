//! `airlock policy allow | deny HOST[:PORT] [--layer repo|user] [--repo DIR] [--yes]`: add one
//! `allow` (or `block`) entry to a layer file with its formatting and comments kept
//! (`toml_edit`), show the diff, and — for the repo file — record trust only after the user
//! confirms (a terminal prompt or `--yes`), and only when the file was trusted before the edit
//! (otherwise the agent's earlier changes would be trusted unseen).
//!
//! The entry is checked with the configuration's own entry parser, and the whole new file with
//! the layer parser, so nothing is written that `airlock exec` would refuse. Idempotent: an
//! entry already present changes nothing. The file is replaced atomically (a temp file in the
//! same directory, renamed over it); a repo file that is a symlink is refused, never followed.

use std::io::{IsTerminal, Write as _};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};

use super::Context;
use crate::config::{self, fsutil, trust};
use crate::paths::Paths;
use crate::policy::{Entry, EntryKind, LayerKind};
use crate::repo::Repo;

/// Exit codes: 0 written (or already present), 1 written but trust refused (policy tests
/// fail), 2 a malformed entry, 3 a file problem.
const EXIT_MALFORMED: i32 = 2;
const EXIT_CONFIG: i32 = 3;
/// The edit was written but trust was refused: policy tests fail.
const EXIT_TESTS_FAIL: i32 = 1;

/// Which layer file an entry goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EditLayer {
    /// The repo's `.airlock.toml` (re-trusted only after confirmation)
    Repo,
    /// Your `~/.airlock/config.toml`
    User,
}

#[derive(Debug, Args)]
pub struct EditArgs {
    /// The entry, in the `allow`/`block` syntax: `host`, `host:PORT`, `=host`, `*.host`,
    /// `host:*`, an IP or CIDR (docs/configuration.md)
    #[arg(allow_hyphen_values = true, value_name = "HOST[:PORT]")]
    pub entry: String,
    /// The layer file to edit
    #[arg(long, value_enum, default_value = "repo")]
    pub layer: EditLayer,
    /// The repo directory (default: the git top level of the working directory)
    #[arg(long, value_name = "DIR")]
    pub repo: Option<PathBuf>,
    /// Trust the edited repo file without asking (only if it was trusted before the edit)
    #[arg(long)]
    pub yes: bool,
    /// Trust the edited file even though some of its policy tests fail (the edit is written
    /// either way; a managed `require_tests` is not lifted)
    #[arg(long)]
    pub force: bool,
}

/// `policy allow` (`EntryKind::Allow`) or `policy deny` (`EntryKind::Block`).
pub fn run(args: &EditArgs, kind: EntryKind, ctx: &Context<'_>) -> i32 {
    let key = match kind {
        EntryKind::Allow => "allow",
        EntryKind::Block => "block",
    };
    if let Err(e) = Entry::parse(&args.entry, kind) {
        eprintln!("airlock: {e}; see docs/configuration.md for the entry syntax");
        return EXIT_MALFORMED;
    }
    match edit(args, kind, key, ctx) {
        Ok(code) => code,
        Err(msg) => {
            for line in msg.lines() {
                eprintln!("airlock: {line}");
            }
            EXIT_CONFIG
        }
    }
}

fn edit(args: &EditArgs, kind: EntryKind, key: &str, ctx: &Context<'_>) -> Result<i32, String> {
    let paths = Paths::from_env(ctx.env).map_err(|e| e.to_string())?;
    let repo = match args.layer {
        EditLayer::Repo => {
            Some(Repo::resolve(args.repo.as_deref(), &ctx.cwd).map_err(|e| e.to_string())?)
        }
        EditLayer::User => None,
    };
    let (path, layer_kind) = match &repo {
        Some(r) => (r.config_file(), LayerKind::Repo),
        None => (paths.user_config(), LayerKind::User),
    };
    let name = config::display_path(&paths, &path);
    // The repo's file lives in the agent's tree: never follow a symlink there.
    let old = fsutil::read_config(&path, repo.is_none())
        .map_err(|e| format!("cannot read {name}: {e}"))?;
    let was_trusted = match (&repo, &old) {
        (Some(r), Some(bytes)) => trust::state(&paths, r, &config::digest(bytes)).is_trusted(),
        // A new repo file: nothing unreviewed in it but the one entry.
        (Some(_), None) => true,
        (None, _) => false,
    };
    let old_text = match &old {
        Some(bytes) => String::from_utf8(bytes.clone())
            .map_err(|_| format!("{name} is not valid UTF-8; re-save it as UTF-8"))?,
        None => String::new(),
    };
    let new_text = match add_entry(&old_text, key, &args.entry, kind) {
        Ok(Some(t)) => t,
        Ok(None) => {
            println!("{} is already in [network] {key} of {name}; nothing changed", args.entry);
            return Ok(0);
        }
        Err(e) => return Err(format!("{name}: {e}")),
    };
    // The whole new file as `airlock exec` will read it: never write what it would refuse.
    config::parse_layer(layer_kind, &name, new_text.as_bytes()).map_err(|e| {
        format!("{e}\nnot written: the edited {name} would not load (fix the file first)")
    })?;
    let diff = similar::TextDiff::from_lines(&old_text, &new_text);
    let before = if old.is_some() { format!("{name} (before)") } else { "/dev/null".into() };
    print!("{}", diff.unified_diff().header(&before, &format!("{name} (after)")));
    write_atomic(&path, new_text.as_bytes(), repo.is_none())
        .map_err(|e| format!("cannot write {name}: {e}"))?;
    println!("added {:?} to [network] {key} in {name}", args.entry);
    let Some(repo) = repo else { return Ok(0) };
    let fix = format!("`airlock policy trust --repo {}`", repo.path.display());
    if !was_trusted {
        println!(
            "{name} was not trusted before this change, so it stays untrusted: review the whole \
             file, then run {fix}"
        );
        return Ok(0);
    }
    let interactive = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    let confirmed = args.yes || (interactive && ask(&format!("Trust the edited {name}? [y/N] ")));
    if !confirmed {
        println!(
            "{name} is written but not trusted, so it does not apply yet; run {fix} (or pass --yes)"
        );
        return Ok(0);
    }
    // Trust exactly the bytes written (re-read: what was written is what is trusted).
    let written = fsutil::read_config(&path, false)
        .map_err(|e| format!("cannot read back {name}: {e}"))?
        .ok_or_else(|| format!("{name} disappeared after writing"))?;
    if written != new_text.as_bytes() {
        return Err(format!("{name} changed while it was being edited; review it and run {fix}"));
    }
    // The tests run against exactly what is trusted; the edit stays written if they fail.
    let parsed = config::parse_layer(layer_kind, &name, &written).map_err(|e| e.to_string())?;
    if let Err(e) = super::policy_test::before_trust(&paths, &repo, &parsed, args.force) {
        for line in e.lines() {
            eprintln!("airlock: {line}");
        }
        eprintln!("airlock: {name} is written but not trusted, so it does not apply yet");
        return Ok(EXIT_TESTS_FAIL);
    }
    trust::trust_content(&paths, &repo, &written).map_err(|e| e.to_string())?;
    let record = trust::record_path(&paths, &repo);
    println!("trusted; recorded in {}", config::display_path(&paths, &record));
    Ok(0)
}

fn ask(prompt: &str) -> bool {
    eprint!("{prompt}");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let _ = std::io::stdin().read_line(&mut answer);
    matches!(answer.trim(), "y" | "Y" | "yes")
}

/// `text` with `entry` appended to `[network] <key>` (table and array created when absent),
/// every other byte kept; `None` when an equal entry is already there.
pub fn add_entry(
    text: &str,
    key: &str,
    entry: &str,
    kind: EntryKind,
) -> Result<Option<String>, String> {
    add_entry_in(text, &["network"], key, entry, kind)
}

/// [`add_entry`] into the table at `path` (`["phase", "deps", "network"]` for
/// `[phase.deps.network]`): the table is created when absent, every other byte kept.
pub fn add_entry_in(
    text: &str,
    path: &[&str],
    key: &str,
    entry: &str,
    kind: EntryKind,
) -> Result<Option<String>, String> {
    let mut doc: toml_edit::DocumentMut =
        text.parse().map_err(|e: toml_edit::TomlError| format!("malformed TOML: {e}"))?;
    let wanted = Entry::parse(entry, kind).map_err(|e| e.to_string())?;
    let label = path.join(".");
    let mut table: &mut dyn toml_edit::TableLike = doc.as_table_mut();
    for (depth, part) in path.iter().enumerate() {
        if !table.contains_key(part) {
            let mut t = toml_edit::Table::new();
            // Intermediate tables (`[phase]`, `[phase.deps]`) stay implicit: only the leaf
            // gets a header.
            t.set_implicit(depth + 1 < path.len());
            table.insert(part, toml_edit::Item::Table(t));
        }
        table = table
            .get_mut(part)
            .and_then(|i| i.as_table_like_mut())
            .ok_or_else(|| format!("`{label}` is not a table; it must be [{label}]"))?;
    }
    let network = table;
    if network.get(key).is_none() {
        network.insert(key, toml_edit::value(toml_edit::Array::new()));
    }
    let array = network
        .get_mut(key)
        .and_then(|i| i.as_array_mut())
        .ok_or_else(|| format!("[{label}] {key} is not an array of strings"))?;
    let present = array.iter().any(|v| {
        v.as_str()
            .is_some_and(|s| s == entry || Entry::parse(s, kind).is_ok_and(|e| same(&e, &wanted)))
    });
    if present {
        return Ok(None);
    }
    // Lay the new element out like the last one (one per line in a multi-line array). Only
    // the last one's indentation: a comment in its prefix belongs to the line before it.
    let indent = array.iter().last().and_then(|v| {
        let prefix = v.decor().prefix()?.as_str()?;
        prefix.rfind('\n').map(|i| prefix[i..].to_owned())
    });
    array.push(entry);
    if let (Some(indent), Some(last)) = (indent, array.iter_mut().last()) {
        last.decor_mut().set_prefix(indent);
    }
    Ok(Some(doc.to_string()))
}

/// Two entries that match exactly the same targets (pattern and port as canonicalized).
fn same(a: &Entry, b: &Entry) -> bool {
    a.canonical() == b.canonical()
}

/// Replaces `path` with `bytes`: a temp file in the same directory (never following a link),
/// synced, renamed over the target (so a symlink at `path` is replaced, not written through).
/// Keeps the old file's permission bits; a new file is 0644 in a repo, 0600 under ~/.airlock.
pub(super) fn write_atomic(path: &Path, bytes: &[u8], private: bool) -> std::io::Result<()> {
    let dir = path.parent().ok_or_else(|| std::io::Error::other("path has no parent directory"))?;
    if private {
        fsutil::private_dir(dir)?;
    }
    let mode = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => m.permissions().mode() & 0o7777,
        Ok(_) => return Err(std::io::Error::other("it is not a regular file")),
        Err(_) if private => 0o600,
        Err(_) => 0o644,
    };
    let mut rnd = [0u8; 6];
    getrandom::fill(&mut rnd).map_err(|e| std::io::Error::other(e.to_string()))?;
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = dir.join(format!(".{file_name}.tmp-{}", hex::encode(rnd)));
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn comments_and_layout_are_kept() {
        let text = "# team policy\n[network]\n# registries\nallow = [\n  \"crates.io\", # rust\n  \"github.com\",\n]\n\n[env]\npass = [\"LANG\"]\n";
        let out = add_entry(text, "allow", "pypi.org", EntryKind::Allow).unwrap().unwrap();
        assert_eq!(
            out,
            "# team policy\n[network]\n# registries\nallow = [\n  \"crates.io\", # rust\n  \"github.com\",\n  \"pypi.org\",\n]\n\n[env]\npass = [\"LANG\"]\n"
        );
        let inline = add_entry(
            "[network]\nallow = [\"a.test\"] # x\n",
            "allow",
            "b.test:8443",
            EntryKind::Allow,
        )
        .unwrap()
        .unwrap();
        assert_eq!(inline, "[network]\nallow = [\"a.test\", \"b.test:8443\"] # x\n");
    }

    #[test]
    fn missing_tables_and_arrays_are_created() {
        assert_eq!(
            add_entry("", "allow", "pypi.org", EntryKind::Allow).unwrap().unwrap(),
            "[network]\nallow = [\"pypi.org\"]\n"
        );
        let out = add_entry("[env]\npass = []\n", "block", "10.0.0.0/8", EntryKind::Block)
            .unwrap()
            .unwrap();
        assert!(out.starts_with("[env]\npass = []\n"), "{out}");
        assert!(out.contains("[network]\nblock = [\"10.0.0.0/8\"]\n"), "{out}");
    }

    #[test]
    fn present_entries_change_nothing_even_when_spelled_differently() {
        let text = "[network]\nallow = [\"PyPI.org\"]\n";
        assert_eq!(add_entry(text, "allow", "pypi.org", EntryKind::Allow).unwrap(), None);
        assert_eq!(add_entry(text, "allow", "pypi.org.", EntryKind::Allow).unwrap(), None);
        assert!(add_entry(text, "allow", "pypi.org:8443", EntryKind::Allow).unwrap().is_some());
    }

    #[test]
    fn wrong_shapes_are_errors_that_say_what_is_wrong() {
        let e = add_entry("network = 1\n", "allow", "a.test", EntryKind::Allow).unwrap_err();
        assert!(e.contains("must be [network]"), "{e}");
        let e = add_entry("[network]\nallow = \"a.test\"\n", "allow", "b.test", EntryKind::Allow)
            .unwrap_err();
        assert!(e.contains("not an array"), "{e}");
        let e = add_entry("[network\n", "allow", "b.test", EntryKind::Allow).unwrap_err();
        assert!(e.contains("malformed TOML"), "{e}");
    }

    proptest! {
        /// Whatever valid entry is added to whatever file, the result is that file plus the
        /// entry: it parses as a layer, holds the entry, and adding it again changes nothing.
        #[test]
        fn adding_is_exact_and_idempotent(
            label in "[a-z][a-z0-9]{0,10}",
            port in proptest::option::of(1u16..),
            comment in "[ -~]{0,20}",
            prior in proptest::collection::vec("[a-z]{1,8}\\.test", 0..4),
        ) {
            let entry = match port { Some(p) => format!("{label}.test:{p}"), None => format!("{label}.test") };
            let list: Vec<String> = prior.iter().map(|p| format!("\"{p}\"")).collect();
            let text = format!("# {comment}\n[network]\nallow = [{}]\n", list.join(", "));
            let Some(out) = add_entry(&text, "allow", &entry, EntryKind::Allow).unwrap() else {
                prop_assert!(prior.contains(&entry));
                return Ok(());
            };
            prop_assert!(out.starts_with(&format!("# {comment}\n")), "comment kept: {}", out);
            let doc = config::parse_layer(LayerKind::Repo, "t", out.as_bytes()).unwrap().doc;
            let mut want = prior.clone();
            want.push(entry.clone());
            prop_assert_eq!(doc.network.allow, want);
            prop_assert_eq!(add_entry(&out, "allow", &entry, EntryKind::Allow).unwrap(), None);
        }
    }
}
