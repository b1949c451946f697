//! `airlock completions <shell>`: shell completion scripts generated from the clap definition.

use clap::{Args, CommandFactory};
use clap_complete::Shell;

use super::Cli;

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to generate completions for
    pub shell: Shell,
}

pub fn run(args: &CompletionsArgs) -> i32 {
    let mut cmd = Cli::command();
    clap_complete::generate(args.shell, &mut cmd, "airlock", &mut std::io::stdout());
    0
}
