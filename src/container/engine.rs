//! Running the engine's CLI: [`EngineCli`] is the seam (a session's steps take it, so they can
//! be driven by a recording double), [`Cli`] the real one, which spawns `podman` or `docker`
//! (or the binary `AIRLOCK_PODMAN` / `AIRLOCK_DOCKER` names) and reports a failure with the
//! command and the engine's own words.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use super::Engine;
use crate::env::Env;
use crate::sys::signals::Hold;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error(
        "{engine} is not installed or not on PATH ({source}); install it, point {var} at it, or \
         run with --backend native"
    )]
    Missing {
        engine: Engine,
        var: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed { command: String, status: String, stderr: String },
}

/// One engine command's result.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

/// How a session talks to its engine. `Sync`: a session runs the Docker bridge guard on a
/// second thread while its proxy starts.
pub trait EngineCli: std::fmt::Debug + Sync {
    fn engine(&self) -> Engine;
    /// Runs one command to completion with its output captured.
    fn output(&self, args: &[OsString]) -> Result<Output, EngineError>;
    /// Runs one command to completion and fails unless it succeeded; returns stdout.
    fn check(&self, args: &[OsString]) -> Result<String, EngineError> {
        let out = self.output(args)?;
        if out.success {
            Ok(out.stdout)
        } else {
            Err(EngineError::Failed {
                command: self.describe(args),
                status: "non-zero exit".into(),
                stderr: out.stderr.trim().to_owned(),
            })
        }
    }
    /// Runs the sandbox container with this process's stdio; returns its exit code (the
    /// engine's 125–127 when it could not run it, 128+N for a signal). The held signals are
    /// passed on to the engine CLI meanwhile.
    fn attached(&self, args: &[OsString], hold: &Hold) -> Result<i32, EngineError>;
    /// The command as the user would type it, for messages.
    fn describe(&self, args: &[OsString]) -> String {
        let mut s = self.engine().program().to_owned();
        for a in args {
            s.push(' ');
            s.push_str(&a.to_string_lossy());
        }
        s
    }
}

/// The engine's real CLI.
#[derive(Debug, Clone)]
pub struct Cli {
    engine: Engine,
    program: PathBuf,
}

impl Cli {
    /// The CLI for `engine`: `$AIRLOCK_PODMAN`/`$AIRLOCK_DOCKER` when set, else its name on
    /// `PATH`.
    pub fn new(engine: Engine, env: &dyn Env) -> Self {
        let program = env
            .var_os(engine.override_var())
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(engine.program()));
        Self { engine, program }
    }

    fn command(&self, args: &[OsString]) -> Command {
        let mut c = Command::new(&self.program);
        c.args(args);
        c
    }

    fn spawn_error(&self, e: std::io::Error, args: &[OsString]) -> EngineError {
        if e.kind() == std::io::ErrorKind::NotFound {
            EngineError::Missing { engine: self.engine, var: self.engine.override_var(), source: e }
        } else {
            EngineError::Failed {
                command: self.describe(args),
                status: "could not start".into(),
                stderr: e.to_string(),
            }
        }
    }
}

impl EngineCli for Cli {
    fn engine(&self) -> Engine {
        self.engine
    }

    fn output(&self, args: &[OsString]) -> Result<Output, EngineError> {
        let out = self
            .command(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| self.spawn_error(e, args))?;
        Ok(Output {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    fn attached(&self, args: &[OsString], hold: &Hold) -> Result<i32, EngineError> {
        use std::os::unix::process::ExitStatusExt;
        let mut child = self.command(args).spawn().map_err(|e| self.spawn_error(e, args))?;
        let pid = child.id();
        // The terminal's signals reach the engine CLI too (same process group), and it passes
        // them on to the container; ours are held meanwhile, so this process lives to stop the
        // proxy and sweep the repo (SIGTERM sent to us alone is passed on to the engine CLI).
        let forwarding = crate::sys::signals::Forwarder::start(hold, pid);
        crate::sys::signals::wait_exited_unreaped(pid);
        drop(forwarding);
        let status = child.wait();
        let status = status.map_err(|e| EngineError::Failed {
            command: self.describe(args),
            status: "wait failed".into(),
            stderr: e.to_string(),
        })?;
        Ok(status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(125))
    }
}
