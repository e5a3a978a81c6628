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
    /// Capacity and use of the pool, with the node-local areas (of every
    /// node, and of this one) apart.
    Df,
    /// Stage local files and directories, or paths of the backend, in (as
    /// chstagein: the same options, and the same share of the work under
    /// mpirun or srun).
    Stagein(chfs_ctl::stage::StageArgs),
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
        Cmd::Df => c.statfs().map(|s| {
            println!(
                "pool: {} servers, {} bytes total, {} used, {} free, {} entries",
                s.servers, s.total, s.used, s.free, s.entries
            );
            println!(
                "node-local areas (every node, counted in the pool): {} bytes in {} entries",
                s.node_local_bytes, s.node_local_entries
            );
            let area = c.config().node_local.clone().unwrap_or_default();
            match s.this_node {
                Some((entries, bytes)) => {
                    println!("this node's area ({area}): {bytes} bytes in {entries} entries")
                }
                None if area.is_empty() => println!("this node's area: off"),
                None => println!("this node's area ({area}): no server of the pool on this host"),
            }
        }),
        Cmd::Stagein(args) => {
            let (lines, code) = chfs_ctl::stage::run_tool("chfs", &args, || Ok(c.clone()));
            for line in lines {
                // One write per line: ranks under mpirun share the terminal.
                let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
            }
            std::process::exit(code);
        }
    };
    if let Err(e) = r {
        eprintln!("chfs: {e}");
        std::process::exit(1);
    }
}
