//! `airlock login --email`, `airlock whoami`, `airlock logout`: the identity file (DESIGN §3).

use clap::Args;

use super::Context;
use crate::config::{self, identity};
use crate::paths::Paths;

#[derive(Debug, Args)]
pub struct LoginArgs {
    /// Your email address; a stable local user id is generated for it
    #[arg(long, value_name = "ADDRESS")]
    pub email: String,
}

fn paths(ctx: &Context<'_>) -> Result<Paths, i32> {
    Paths::from_env(ctx.env).map_err(|e| {
        eprintln!("airlock: {e}");
        1
    })
}

pub fn login(args: &LoginArgs, ctx: &Context<'_>) -> i32 {
    let paths = match paths(ctx) {
        Ok(p) => p,
        Err(code) => return code,
    };
    match identity::login_email(&paths, &args.email) {
        Ok(id) => {
            println!(
                "logged in as {} (user_id {}); identity saved to {}",
                id.email,
                id.user_id,
                config::display_path(&paths, &paths.identity_file())
            );
            0
        }
        Err(e) => {
            eprintln!("airlock: {e}");
            1
        }
    }
}

pub fn whoami(ctx: &Context<'_>) -> i32 {
    let paths = match paths(ctx) {
        Ok(p) => p,
        Err(code) => return code,
    };
    match identity::read(&paths.identity_file()) {
        Ok(Some(id)) => {
            println!("email: {}", id.email);
            println!("user_id: {}", id.user_id);
            if let Some(server) = &id.server {
                println!("server: {server}");
            }
            0
        }
        Ok(None) => {
            eprintln!("airlock: not logged in; run `airlock login --email ADDRESS`");
            1
        }
        Err(e) => {
            eprintln!("airlock: {e}");
            1
        }
    }
}

pub fn logout(ctx: &Context<'_>) -> i32 {
    let paths = match paths(ctx) {
        Ok(p) => p,
        Err(code) => return code,
    };
    let shown = config::display_path(&paths, &paths.identity_file());
    match identity::logout(&paths) {
        Ok(true) => {
            println!("logged out (removed {shown})");
            0
        }
        Ok(false) => {
            println!("not logged in ({shown} does not exist)");
            0
        }
        Err(e) => {
            eprintln!("airlock: {e}");
            1
        }
    }
}
