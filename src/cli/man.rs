//! Man pages for both binaries (clap_mangen), one per command and subcommand like git's
//! (`airlock.1`, `airlock-exec.1`, `airlock-service-install.1`, `airlockd.1`, …), and
//! `airlock man`: print one page, or write them all for a package (`--out DIR`). Hidden
//! (test-only, internal) commands get no page. `airlock service install` writes the same pages.

use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

use clap::Args;

use super::completions::Binary;

#[derive(Debug, Args)]
pub struct ManArgs {
    /// Write every page of airlock and airlockd into DIR (e.g. a package's
    /// usr/share/man/man1), creating it; prints each path written
    #[arg(long, value_name = "DIR", conflicts_with = "page")]
    pub out: Option<PathBuf>,
    /// The page to print on stdout, e.g. `exec`, `service-install`, `airlockd-proxy`
    /// (default: `airlock`); pipe it to `man -l -`
    pub page: Option<String>,
}

/// A rendered page: its file name (`airlock-exec.1`) and roff source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub file_name: String,
    pub roff: String,
}

/// Every page of `binary`: the binary's own, then one per visible subcommand at every depth.
pub fn pages_of(binary: Binary) -> Result<Vec<Page>, std::io::Error> {
    fn walk(cmd: clap::Command, source: &str, out: &mut Vec<Page>) -> Result<(), std::io::Error> {
        let subs: Vec<clap::Command> =
            cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned().collect();
        let man = clap_mangen::Man::new(cmd).source(source).manual("Airlock Manual");
        let mut roff = Vec::new();
        man.render(&mut roff)?;
        let roff = String::from_utf8(roff)
            .map_err(|e| std::io::Error::other(format!("a man page is not UTF-8: {e}")))?;
        out.push(Page { file_name: man.get_filename(), roff });
        subs.into_iter().try_for_each(|sub| walk(sub, source, out))
    }
    // Built once at the top so every subcommand gets its display name (`airlock-exec`), which
    // is the page's name; `help` is clap's, not a command of ours.
    let mut cmd = binary.command().disable_help_subcommand(true);
    cmd.build();
    let mut out = Vec::new();
    // Every page names the package it belongs to, not its own subcommand (`exec 0.1.0`).
    let source = format!("{} {}", binary.name(), env!("CARGO_PKG_VERSION"));
    walk(cmd, &source, &mut out)?;
    Ok(out)
}

/// Every page of both binaries.
pub fn all_pages() -> Result<Vec<Page>, std::io::Error> {
    let mut out = Vec::new();
    for binary in Binary::ALL {
        out.extend(pages_of(binary)?);
    }
    Ok(out)
}

pub fn run(args: &ManArgs) -> i32 {
    let pages = match all_pages() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("airlock: cannot render the man pages: {e}");
            return 1;
        }
    };
    let Some(dir) = &args.out else {
        let want = match args.page.as_deref() {
            None => "airlock.1".to_owned(),
            Some(p) if p == "airlock" || p.starts_with("airlock-") || p.starts_with("airlockd") => {
                format!("{p}.1")
            }
            // `airlock man exec` means airlock-exec, as `git help commit` means git-commit.
            Some(p) => format!("airlock-{p}.1"),
        };
        let Some(page) = pages.iter().find(|p| p.file_name == want) else {
            let names: Vec<&str> =
                pages.iter().map(|p| p.file_name.trim_end_matches(".1")).collect();
            eprintln!(
                "airlock: no man page {:?}; the pages are: {}",
                want.trim_end_matches(".1"),
                names.join(", ")
            );
            return 2;
        };
        print!("{}", page.roff);
        return 0;
    };
    if let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir) {
        eprintln!("airlock: cannot create {}: {e}; pick a directory you can write", dir.display());
        return 1;
    }
    for page in &pages {
        let path = dir.join(&page.file_name);
        if let Err(e) = std::fs::write(&path, &page.roff) {
            eprintln!("airlock: cannot write {}: {e}", path.display());
            return 1;
        }
        println!("{}", path.display());
    }
    0
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn one_page_per_visible_command_and_none_for_hidden_ones() {
        let pages = all_pages().unwrap();
        let names: Vec<&str> = pages.iter().map(|p| p.file_name.as_str()).collect();
        for want in [
            "airlock.1",
            "airlock-exec.1",
            "airlock-run.1",
            "airlock-service-install.1",
            "airlock-policy-check.1",
            "airlock-man.1",
            "airlockd.1",
            "airlockd-proxy.1",
            "airlockd-completions.1",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("__") || n.contains("-help")), "{names:?}");
        for p in &pages {
            assert!(p.roff.starts_with(".ie \\n(.g .ds Aq"), "{}: {}", p.file_name, p.roff);
            assert!(p.roff.contains(".TH "), "{}", p.file_name);
            assert!(p.roff.contains(".SH NAME"), "{}", p.file_name);
            assert!(!p.roff.contains("__probe") && !p.roff.contains("__audit"), "{}", p.file_name);
        }
        // Names are unique: two commands never share a file.
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
    }
}
