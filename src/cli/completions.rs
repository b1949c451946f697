//! Shell completion scripts for both binaries, generated from their clap definitions:
//! `airlock completions SHELL` (here) and `airlockd completions SHELL` (`daemon::cli`), and the
//! files `airlock service install` writes. Hidden (test-only, internal) commands never appear.

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use super::Cli;
use crate::daemon::cli::DaemonCli;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to generate completions for
    pub shell: Shell,
}

/// The two binaries whose command lines are documented and completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    Airlock,
    Airlockd,
}

impl Binary {
    pub const ALL: [Binary; 2] = [Binary::Airlock, Binary::Airlockd];

    pub fn name(self) -> &'static str {
        match self {
            Binary::Airlock => "airlock",
            Binary::Airlockd => "airlockd",
        }
    }

    /// The clap definition, without hidden subcommands at any depth (clap_complete lists a
    /// hidden subcommand in some shells' scripts; a test-only command must not be offered).
    pub fn command(self) -> clap::Command {
        let cmd = match self {
            Binary::Airlock => Cli::command(),
            Binary::Airlockd => DaemonCli::command(),
        };
        without_hidden(cmd)
    }
}

/// A copy of `cmd` whose hidden subcommands are gone at every depth: clap cannot remove a
/// subcommand, so the tree is rebuilt from what completion uses (name, help, version, arguments,
/// groups, aliases, the visible subcommands).
fn without_hidden(cmd: clap::Command) -> clap::Command {
    let mut out = clap::Command::new(cmd.get_name().to_owned())
        .propagate_version(cmd.is_propagate_version_set())
        .disable_help_subcommand(cmd.is_disable_help_subcommand_set());
    if let Some(version) = cmd.get_version() {
        out = out.version(version.to_owned());
    }
    if let Some(about) = cmd.get_about() {
        out = out.about(about.clone());
    }
    if let Some(about) = cmd.get_long_about() {
        out = out.long_about(about.clone());
    }
    out = out.visible_aliases(cmd.get_visible_aliases().map(str::to_owned).collect::<Vec<_>>());
    out = out.args(cmd.get_arguments().cloned());
    out = out.groups(cmd.get_groups().cloned());
    out.subcommands(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned().map(without_hidden))
}

/// The completion script for `binary` in `shell`.
pub fn script(binary: Binary, shell: Shell) -> Vec<u8> {
    let mut cmd = binary.command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, binary.name(), &mut out);
    out
}

pub fn run(args: &CompletionsArgs) -> i32 {
    print_script(Binary::Airlock, args.shell)
}

/// Writes `binary`'s script to stdout; exit 0, or 1 if stdout is gone.
pub fn print_script(binary: Binary, shell: Shell) -> i32 {
    use std::io::Write;
    match std::io::stdout().write_all(&script(binary, shell)) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{}: cannot write the completion script: {e}", binary.name());
            1
        }
    }
}
