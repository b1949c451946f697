//! The launch's container branch (`--backend docker|podman`): the layers file from the
//! session's configuration, the repo's log directory, the images and ids, then
//! [`crate::container::session::run`].

use crate::config::layers_file::LayersFile;
use crate::container::engine::Cli;
use crate::container::plan::{self, Bind, RunAs};
use crate::container::session::{self, Outcome, Plan};
use crate::container::{Backend, Engine};
use crate::env::Env;
use crate::paths::Paths;
use crate::sandbox::bridge::ProxyBridge;
use crate::sandbox::supervisor::Request;

use super::Prepared;

/// The backend in force: `--backend`, else `[sandbox] backend` of the applied layers.
pub fn choose(flag: Option<Backend>, prepared: &Prepared) -> Backend {
    flag.or(prepared.backend).unwrap_or_default()
}

/// Runs `req` in `engine`'s containers.
pub fn run(
    engine: Engine,
    paths: &Paths,
    req: &Request,
    prepared: &Prepared,
    env: &dyn Env,
    bridge: &mut dyn ProxyBridge,
) -> Result<Outcome, String> {
    let managed = crate::config::load_managed(paths).map_err(|e| e.to_string())?;
    let client = if prepared.by_content.sources.is_empty() {
        crate::protocol::PolicyLayers::from(&prepared.layers)
    } else {
        crate::config::documents_from_sources(&prepared.by_content).map_err(|e| e.to_string())?
    };
    let layers = LayersFile::new(managed.as_ref(), &client);
    // The proxy container would refuse to start on the same error; say it here, plainly.
    layers.build_policy(prepared.phase.as_deref()).map_err(|e| e.to_string())?;
    let log_dir = crate::audit::logdir::claim(&paths.logs_root(), &req.repo.name, &req.repo.path)
        .map_err(|e| e.to_string())?;
    let uid = nix::unistd::getuid().as_raw();
    let gid = nix::unistd::getgid().as_raw();
    let (base_image, proxy_image) = plan::images(env);
    let (proxy_env, proxy_binds) = test_resolver(env);
    let cli = Cli::new(engine, env);
    let plan = Plan {
        engine: &cli,
        run_dir: paths.airlock_dir().join("run").join(&req.session),
        log_dir,
        layers: &layers,
        phase: prepared.phase.clone(),
        base_image,
        proxy_image,
        run_as: RunAs { uid, gid, rootless_podman: engine == Engine::Podman && uid != 0 },
        proxy_env,
        proxy_binds,
    };
    session::run(req, &plan, bridge).map_err(|e| e.to_string())
}

/// Test builds only: the proxy container resolves names from the test's file, as the native
/// daemon does under `AIRLOCK_TEST_RESOLVER` (network safety: test names map to test addresses).
#[cfg(feature = "test-hooks")]
fn test_resolver(env: &dyn Env) -> (Vec<(String, String)>, Vec<Bind>) {
    let Some(file) = env.var("AIRLOCK_TEST_RESOLVER").filter(|f| !f.is_empty()) else {
        return (Vec::new(), Vec::new());
    };
    const INSIDE: &str = "/airlock/test-resolver";
    let env = vec![
        ("AIRLOCK_TEST_RESOLVER".to_owned(), INSIDE.to_owned()),
        (
            "AIRLOCK_TEST_RESOLVER_LOG".to_owned(),
            format!("{}/resolver.queries", plan::PROXY_RUN_DIR),
        ),
    ];
    (env, vec![Bind { host: file.into(), inside: INSIDE.into(), read_only: true }])
}

#[cfg(not(feature = "test-hooks"))]
fn test_resolver(_env: &dyn Env) -> (Vec<(String, String)>, Vec<Bind>) {
    (Vec::new(), Vec::new())
}
