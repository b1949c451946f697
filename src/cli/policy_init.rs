//! `airlock policy init --agent claude|codex [--layer repo|user] [--force]`: writes a commented
//! starting policy listing the hosts a coding agent needs (docs/agents.md#the-hosts-an-agent-needs):
//! the repo's `.airlock.toml` (default; untrusted until `airlock policy trust`) or the user layer
//! `~/.airlock/config.toml`. An existing file is never overwritten without `--force`.
//!
//! The repo is agent-writable, so the file is written through a directory fd: an `O_EXCL` temp
//! file renamed over the name (`fsat::write_replace`), never through a symlink planted there.

use std::ffi::OsStr;
use std::os::fd::AsFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};

use super::Context;
use super::policy::RepoArgs;
use crate::paths::Paths;
use crate::policy::LayerKind;
use crate::repo::Repo;

/// The agents with a starting policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InitAgent {
    /// Claude Code
    Claude,
    /// OpenAI Codex CLI
    Codex,
}

/// The layers `policy init` can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum InitLayer {
    /// The repo's .airlock.toml (applies once you trust it)
    Repo,
    /// ~/.airlock/config.toml (applies to every repo)
    User,
}

#[derive(Debug, Args)]
pub struct InitArgs {
    /// The agent whose hosts to list (repeat for both: --agent claude --agent codex)
    #[arg(long, value_enum, required = true)]
    pub agent: Vec<InitAgent>,
    /// Which file to write
    #[arg(long, value_enum, default_value = "repo")]
    pub layer: InitLayer,
    #[command(flatten)]
    pub repo: RepoArgs,
    /// Replace the file if it exists (its contents are lost)
    #[arg(long)]
    pub force: bool,
}

const HEADER: &str = "\
# Starting network policy for a coding agent, written by `airlock policy init`.
# Every connection attempt is an audit line, allowed or refused (`airlock logs`). Keep only
# what you use; add your own hosts (package registries, git hosts) below. Entries:
# `=host:443` is exactly that name on port 443; `host` alone is the name and its subdomains
# on ports 80 and 443. Reference: docs/configuration.md; the hosts: docs/agents.md.
";

const CLAUDE: &str = r#"
  # --- Claude Code ---
  # The API: every model request, and the check Claude Code makes before each WebFetch.
  "=api.anthropic.com:443",
  # Signing in with a Claude account: the OAuth token exchange and refresh (the sign-in page
  # itself opens in your browser, outside the sandbox; `airlock agent import-login claude`
  # copies an existing host login instead). console.anthropic.com is the older endpoint.
  "=platform.claude.com:443",
  "=console.anthropic.com:443",
  "=claude.ai:443",
  # Telemetry (Statsig) and error reports (Sentry): optional, left out. To stop Claude Code
  # trying, export DISABLE_TELEMETRY=1 and DISABLE_ERROR_REPORTING=1 (or
  # CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1) on the host and list them in [env] pass.
  # "=statsig.anthropic.com:443",
  # "sentry.io:443",
  # Updates: none from inside (Airlock sets DISABLE_AUTOUPDATER=1: the package is read-only
  # there); update Claude Code on the host with npm.
  # "=registry.npmjs.org:443",
"#;

const CODEX: &str = r#"
  # --- Codex ---
  # Signed in with ChatGPT: model requests go to chatgpt.com (its backend API).
  "=chatgpt.com:443",
  # Signing in with ChatGPT and refreshing that login (OAuth; the sign-in page opens in your
  # browser, outside the sandbox; `airlock agent import-login codex` copies a host login).
  "=auth.openai.com:443",
  # Signed in with an API key (OPENAI_API_KEY, through [env] pass): the OpenAI API.
  "=api.openai.com:443",
  # The update check at start: optional, left out (turn it off with
  # check_for_update_on_startup = false in the agent home's .codex/config.toml); update
  # Codex on the host with npm.
  # "=api.github.com:443",
  # Telemetry: Codex exports OpenTelemetry only when [otel] is set in its config.toml; then
  # allow that collector here.
"#;

const CLAUDE_ENV: &str = "\
# An API key instead of a sign-in: export it on the host and pass it in.
# pass = [\"ANTHROPIC_API_KEY\"]
";

const CODEX_ENV: &str = "\
# An API key instead of a ChatGPT sign-in: export it on the host and pass it in.
# pass = [\"OPENAI_API_KEY\"]
";

/// The starting file for `agents` (each listed once, in the order given).
pub fn render(agents: &[InitAgent]) -> String {
    let mut seen = Vec::new();
    for a in agents {
        if !seen.contains(a) {
            seen.push(*a);
        }
    }
    let mut out = String::from(HEADER);
    out.push_str("\n[network]\nallow = [");
    for a in &seen {
        out.push_str(match a {
            InitAgent::Claude => CLAUDE,
            InitAgent::Codex => CODEX,
        });
    }
    out.push_str("]\n\n[env]\n");
    for a in &seen {
        out.push_str(match a {
            InitAgent::Claude => CLAUDE_ENV,
            InitAgent::Codex => CODEX_ENV,
        });
    }
    out
}

/// Where the file goes: (directory, file name, layer).
fn target(
    args: &InitArgs,
    ctx: &Context<'_>,
) -> Result<(PathBuf, &'static str, LayerKind), String> {
    match args.layer {
        InitLayer::Repo => {
            let repo =
                Repo::resolve(args.repo.repo.as_deref(), &ctx.cwd).map_err(|e| e.to_string())?;
            Ok((repo.path, ".airlock.toml", LayerKind::Repo))
        }
        InitLayer::User => {
            let paths = Paths::from_env(ctx.env).map_err(|e| e.to_string())?;
            Ok((paths.airlock_dir(), "config.toml", LayerKind::User))
        }
    }
}

pub fn run(args: &InitArgs, ctx: &Context<'_>) -> i32 {
    match init(args, ctx) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("airlock: {e}");
            // Like `policy check`'s configuration errors.
            super::policy::EXIT_CONFIG
        }
    }
}

fn init(args: &InitArgs, ctx: &Context<'_>) -> Result<(), String> {
    let (dir, name, layer) = target(args, ctx)?;
    let path = dir.join(name);
    let contents = render(&args.agent);
    // What we write must be a valid layer: parse it with the real parser first.
    crate::config::parse_layer(layer, &path.display().to_string(), contents.as_bytes())
        .map_err(|e| format!("the starting policy does not parse (a bug in Airlock): {e}"))?;

    if layer == LayerKind::User {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let dir_fd =
        crate::fsat::open_root(&dir).map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
    let existing = crate::fsat::lstat_at(dir_fd.as_fd(), Path::new(name))
        .map_err(|e| format!("cannot look at {}: {e}", path.display()))?;
    if existing.is_some() && !args.force {
        return Err(format!(
            "{} already exists; edit it (see `airlock policy show`), or pass --force to replace \
             it with the starting policy (its contents are lost)",
            path.display()
        ));
    }
    crate::fsat::write_replace(dir_fd.as_fd(), OsStr::new(name), contents.as_bytes(), 0o644)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("wrote {}", path.display());
    if layer == LayerKind::Repo {
        println!(
            "review it, then run `airlock policy trust` so sessions apply it (a repo file applies \
             only while trusted)"
        );
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    #[test]
    fn every_combination_parses_in_every_layer_and_lists_its_hosts() {
        let combos: [&[InitAgent]; 4] = [
            &[InitAgent::Claude],
            &[InitAgent::Codex],
            &[InitAgent::Claude, InitAgent::Codex],
            &[InitAgent::Codex, InitAgent::Codex],
        ];
        for agents in combos {
            let text = render(agents);
            for kind in [LayerKind::Repo, LayerKind::User] {
                let parsed = crate::config::parse_layer(kind, "/r/.airlock.toml", text.as_bytes())
                    .unwrap_or_else(|e| panic!("{agents:?} in {kind:?}: {e}\n{text}"));
                assert!(parsed.warnings.is_empty(), "{:?}", parsed.warnings);
            }
            let claude = agents.contains(&InitAgent::Claude);
            let codex = agents.contains(&InitAgent::Codex);
            assert_eq!(text.contains("\"=api.anthropic.com:443\","), claude);
            assert_eq!(text.contains("\"=chatgpt.com:443\","), codex);
            assert_eq!(text.matches("# --- Codex ---").count(), usize::from(codex));
        }
    }

    /// The starter policy and the review plane's correlate checks keep the agents' own hosts in
    /// two places (a commented template here, `review::correlate::AGENT_HOSTS` there): every
    /// host one lists, the other must too, or `correlate.unreported-egress` would flag an
    /// agent's own traffic (or excuse a host `policy init` never offers).
    #[test]
    fn the_template_and_the_correlate_host_list_name_the_same_hosts() {
        use crate::review::correlate::AGENT_HOSTS;
        let template = format!("{CLAUDE}{CODEX}");
        let listed: std::collections::BTreeSet<String> = template
            .lines()
            .filter_map(|l| {
                let l = l.trim().trim_start_matches("# ");
                let entry = l.strip_prefix('"')?.split('"').next()?;
                let host = entry.trim_start_matches('=').split(':').next()?;
                Some(host.to_string())
            })
            .collect();
        let correlate: std::collections::BTreeSet<String> =
            AGENT_HOSTS.iter().map(|(h, _, _)| h.to_string()).collect();
        assert_eq!(listed, correlate);
    }
}
