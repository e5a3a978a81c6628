//! chfs: cache-mode utilities — what is still dirty, wait for write-back,
//! sync, stage-in.

use std::time::Duration;

use clap::{Parser, Subcommand};

/// chfs-rs cache-mode utilities (CHFS_SERVER from the environment).
#[derive(Parser)]
#[command(name = "chfs", version)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Dirty chunks and bytes not yet written to the backend, under PATH
    /// (default /), with the last write-back error if any.
    FlushStatus {
        /// File or directory.
        #[arg(default_value = "/")]
        path: String,
    },
    /// Write back everything under PATH now and wait until it is in the
    /// backend (exit 1 on a persistent backend error or the timeout).
    FlushWait {
        /// File or directory.
        #[arg(default_value = "/")]
        path: String,
        /// Give up after this many seconds (0 = wait as long as progress is made).
        #[arg(short, long, default_value_t = 0)]
        timeout: u64,
    },
    /// Write back everything (chfs_sync).
    Sync,
    /// Stage local files and directories, or paths of the backend, in (as
    /// chstagein).
    Stagein {
        /// Paths (standard input when none).
        paths: Vec<String>,
    },
}

fn main() {
    let a: Args = chfs_ctl::parse_args();
    let c = chfs_ctl::client_from_env().unwrap_or_else(|e| {
        eprintln!("chfs: {e}");
        std::process::exit(1);
    });
    let r = match a.cmd {
        Cmd::FlushStatus { path } => c.flush_status(&path).map(|s| {
            println!(
                "{path}: {} dirty chunks, {} bytes not in the backend",
                s.chunks, s.bytes
            );
            if s.failing > 0 {
                println!(
                    "{path}: {} chunks failing; last error: {}",
                    s.failing, s.last_error
                );
            }
        }),
        Cmd::FlushWait { path, timeout } => {
            let t = (timeout > 0).then(|| Duration::from_secs(timeout));
            c.wait_flushed(&path, t)
                .map(|_| println!("{path}: written back"))
        }
        Cmd::Sync => c.sync(),
        Cmd::Stagein { paths } => {
            let paths = chfs_ctl::stage::collect_paths(&paths);
            let r = chfs_ctl::stage::stagein(&c, &paths, 8);
            for (p, e) in &r.failures {
                eprintln!("chfs: {p}: {e}");
            }
            if !r.failures.is_empty() {
                std::process::exit(1);
            }
            Ok(())
        }
    };
    if let Err(e) = r {
        eprintln!("chfs: {e}");
        std::process::exit(1);
    }
}
