//! `airlock quarantine list|show|restore`: what the end of a session took out of the repo
//! (SECURITY §7), and taking back what was legitimate. The store itself is
//! [`crate::sandbox::quarantine`].

use std::path::Path;

use clap::Subcommand;

use super::Context;
use crate::audit::escape_for_terminal as esc;
use crate::paths::Paths;
use crate::sandbox::codekeys::{self, ConfigKind};
use crate::sandbox::quarantine::{self, How, Item, Manifest};

#[derive(Debug, Subcommand)]
pub enum QuarantineCommand {
    /// List the sessions with quarantined items (newest first), or one session's items.
    List {
        /// A session id (from the list, or the message at the end of `airlock exec`/`run`).
        session: Option<String>,
    },
    /// Show a session's items in full, with a diff against what is in the repo now.
    Show {
        session: String,
        /// One item: its path (relative to the repo, or absolute), its number, or
        /// `git-config:<key>` for a held git config key.
        item: Option<String>,
    },
    /// Put items back where they came from (nothing that exists again is overwritten).
    Restore {
        session: String,
        /// One item (as for `show`); without it, every item of the session.
        item: Option<String>,
    },
}

/// Exit status when something asked for does not exist or cannot be restored.
const EXIT_FAILED: i32 = 1;

pub fn run(cmd: &QuarantineCommand, ctx: &Context<'_>) -> i32 {
    let paths = match Paths::from_env(ctx.env) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("airlock: {e}");
            return EXIT_FAILED;
        }
    };
    let dir = paths.airlock_dir();
    let result = match cmd {
        QuarantineCommand::List { session: None } => {
            list_sessions(&dir);
            Ok(())
        }
        QuarantineCommand::List { session: Some(s) } => {
            quarantine::read_manifest(&dir, s).map(|m| list_items(&m))
        }
        QuarantineCommand::Show { session, item } => quarantine::read_manifest(&dir, session)
            .and_then(|m| {
                for it in quarantine::select(&m, item.as_deref())? {
                    show(it, item.as_deref());
                }
                Ok(())
            }),
        QuarantineCommand::Restore { session, item } => {
            quarantine::restore(&dir, session, item.as_deref()).map(|done| {
                if done.is_empty() {
                    println!("nothing to restore (already restored)");
                }
                for r in done {
                    println!("restored {} [{}]: {}", r.path.display(), r.id, r.what);
                }
            })
        }
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("airlock: {e}");
            EXIT_FAILED
        }
    }
}

fn list_sessions(airlock_dir: &Path) {
    let sessions = quarantine::list_sessions(airlock_dir);
    if sessions.is_empty() {
        println!("no quarantined items");
        return;
    }
    for m in sessions {
        let restored = m.items.iter().filter(|i| i.restored_at.is_some()).count();
        println!(
            "{}  {}  {}  {} item(s){}",
            esc(&m.session),
            esc(&m.created_at),
            shown(&m.repo),
            m.items.len(),
            if restored > 0 { format!(", {restored} restored") } else { String::new() }
        );
    }
}

fn list_items(m: &Manifest) {
    println!("session {} ({}), repo {}", esc(&m.session), esc(&m.created_at), shown(&m.repo));
    for i in &m.items {
        println!(
            "  [{}] {}  {} ({}){}",
            i.id,
            shown(&i.host_path()),
            esc(&i.why),
            i.how.as_str(),
            if i.restored_at.is_some() { "  restored" } else { "" }
        );
    }
}

fn show(item: &Item, selector: Option<&str>) {
    println!("[{}] {}", item.id, shown(&item.host_path()));
    println!("  why:    {}", esc(&item.why));
    println!("  how:    {}", item.how.as_str());
    println!("  kind:   {}", esc(&item.kind));
    if let Some(s) = &item.stored {
        println!("  stored: {}", shown(s));
    }
    if let Some(n) = &item.note {
        println!("  note:   {}", esc(n));
    }
    if let Some(r) = &item.restored_at {
        println!("  restored at {}", esc(r));
    }
    let only_key = selector.and_then(|s| s.strip_prefix("git-config:"));
    for k in item.keys.iter().filter(|k| only_key.is_none_or(|o| k.key.eq_ignore_ascii_case(o))) {
        println!("  held:   {} = {}", esc(&k.key), esc(&k.value));
    }
    let current = read_current(item);
    let (old, new, title) = match item.how {
        // What restoring would change in the file as it is now.
        How::HeldKeys => {
            let kind = if item.git_config {
                Some(ConfigKind::GitConfig)
            } else {
                codekeys::kind_of(&item.path)
            };
            let cur = current.clone().unwrap_or_default();
            let keys: Vec<_> = item
                .keys
                .iter()
                .filter(|k| only_key.is_none_or(|o| k.key.eq_ignore_ascii_case(o)))
                .cloned()
                .collect();
            let preview = |k| {
                if item.git_config && item.replaces_values {
                    codekeys::restore_git_replacing(&cur, &keys)
                } else {
                    codekeys::restore(k, &cur, &keys)
                }
            };
            match kind.map(preview) {
                Some(Ok(restored)) => (cur, restored, "restore would change"),
                _ => return,
            }
        }
        _ if item.kind == "file" => match quarantine::stored_bytes(item) {
            Some(held) => (current.clone().unwrap_or_default(), held, "quarantined vs now"),
            None => return,
        },
        _ => return,
    };
    if old == new {
        println!("  (no difference from what is there now)");
        return;
    }
    let (old, new) = (String::from_utf8_lossy(&old), String::from_utf8_lossy(&new));
    let now_name = if current.is_some() { "now" } else { "now (absent)" };
    println!("  {title}:");
    let diff = similar::TextDiff::from_lines(old.as_ref(), new.as_ref());
    let text = diff.unified_diff().context_radius(3).header(now_name, "quarantined").to_string();
    // The content is the agent's: each line is shown with its control characters escaped.
    for line in text.lines() {
        println!("{}", esc(line));
    }
}

/// A path as the terminal may show it (see [`esc`]).
fn shown(p: &Path) -> String {
    esc(&p.display().to_string()).into_owned()
}

/// The file at the item's place now, if it is a readable regular file.
fn read_current(item: &Item) -> Option<Vec<u8>> {
    let root = crate::fsat::open_root(&item.root).ok()?;
    crate::fsat::read_capped(std::os::fd::AsFd::as_fd(&root), &item.path, 16 << 20)
        .ok()
        .flatten()
        .map(|(b, _)| b)
}
