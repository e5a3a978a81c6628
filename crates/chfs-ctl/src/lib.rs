//! chfsctl and the chfs-rs command-line tools (`chfsctl`, `chlist`,
//! `chmkdir`, `chrmdir`, `chfind`, `chstagein`, `chfs`).
//!
//! - [`ctl`]: `chfsctl start|stop|status|kill|clean|rebalance` — create a pool on the
//!   hosts of a job through ssh (or `mpirun` / `srun`), print the shell
//!   lines that point clients at it, and tear it down.
//! - [`find`]: the parallel find behind `chfind`.
//! - [`stage`]: the parallel stage-in behind `chstagein` and `chfs stagein`.
//! - [`rank`]: which rank of an `mpirun` / `srun` job a tool is (one rule
//!   for all of them).
//! - [`launch`]: hostfiles, shell quoting and the launchers.
//!
//! Libraries here never print or exit; the binaries in `src/bin` do.

pub mod ctl;
mod error;
pub mod find;
pub mod launch;
pub mod rank;
pub mod stage;

pub use error::CtlError;

/// Parses a tool's command line; its `--help` ends with the client
/// settings read from the environment ([`chfs_client::config::env_help`]).
pub fn parse_args<T: clap::Parser>() -> T {
    let m = T::command()
        .after_help(chfs_client::config::env_help())
        .get_matches();
    T::from_arg_matches(&m).unwrap_or_else(|e| e.exit())
}

/// Connects a client from the environment (`CHFS_SERVER`, ...), naming the
/// servers in the error.
pub fn client_from_env() -> Result<chfs_client::Client, CtlError> {
    let cfg = chfs_client::ClientConfig::from_env().map_err(|source| CtlError::Client {
        context: "reading the client configuration".into(),
        source,
    })?;
    let servers = cfg.servers.join(",");
    chfs_client::Client::connect(cfg).map_err(|source| CtlError::Client {
        context: format!("cannot reach the pool through CHFS_SERVER={servers}"),
        source,
    })
}
