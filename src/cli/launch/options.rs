//! Options every session takes (`exec` and `run`): `--mount`, `-w/--workdir`, `--quiet` and
//! `--phase` and `--backend`.

use std::path::PathBuf;

use clap::Args;

#[derive(Debug, Clone, Default, Args)]
pub struct SessionOptions {
    /// Mount a host tree inside: HOST[:SANDBOX][:ro|:rw] (read-only unless :rw; :rw makes the
    /// tree agent-written). Repeatable. See `[sandbox] mounts` in docs/configuration.md.
    #[arg(long = "mount", value_name = "HOST[:SANDBOX][:ro|:rw]")]
    pub mounts: Vec<String>,
    /// The working directory inside, as a host directory within the repo (default: the current
    /// directory when it lies in the repo, else the repo root).
    #[arg(short = 'w', long = "workdir", value_name = "DIR")]
    pub workdir: Option<PathBuf>,
    /// No summary of the session's refusals on stderr when it ends.
    #[arg(long)]
    pub quiet: bool,
    /// Start the session in phase NAME: each layer with a [phase.NAME.network] block is
    /// evaluated with that block's allow/block lists instead of its [network] lists. Switch
    /// later with `airlock phase set`. See "Phases" in docs/configuration.md.
    #[arg(long, value_name = "NAME")]
    pub phase: Option<String>,
    /// Run the session in Airlock's own sandbox (`native`, the default) or in containers
    /// (`docker`, `podman`): a sandbox container whose only peer is a proxy container. Default:
    /// `[sandbox] backend`, else native. See docs/backends.md.
    #[arg(long, value_name = "native|docker|podman")]
    pub backend: Option<crate::container::Backend>,
}
