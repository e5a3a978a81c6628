//! chfs-localpool: start N chfsd servers on this machine, run a command with
//! CHFS_SERVER set (or wait for Ctrl-C), then stop them.

use clap::Parser;

/// Start a local chfs-rs pool of N servers on loopback.
#[derive(Parser)]
#[command(name = "chfs-localpool", version)]
struct Args {
    /// Number of servers.
    #[arg(short = 'n', long, default_value_t = 4)]
    servers: usize,
    /// Shared secret (also exported to the command as CHFS_SECRET).
    #[arg(long, env = "CHFS_SECRET", hide_env_values = true)]
    secret: Option<String>,
    /// Extra chfsd option (repeatable), e.g. --chfsd-arg=--size=1G.
    #[arg(long = "chfsd-arg", allow_hyphen_values = true)]
    chfsd_args: Vec<String>,
    /// Command to run with CHFS_SERVER set; without one, print the
    /// variables and serve until Ctrl-C.
    #[arg(last = true)]
    command: Vec<String>,
}

fn main() {
    let a = Args::parse();
    let opts = chfs_localpool::PoolOptions {
        servers: a.servers,
        secret: a.secret.clone(),
        args: a.chfsd_args,
        ..Default::default()
    };
    let pool = match chfs_localpool::LocalPool::start_with(opts) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("chfs-localpool: cannot start servers: {e}");
            std::process::exit(1);
        }
    };
    if a.command.is_empty() {
        println!("CHFS_SERVER={}; export CHFS_SERVER;", pool.server_string());
        eprintln!(
            "chfs-localpool: {} servers running; Ctrl-C stops them",
            pool.addrs().len()
        );
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = ctrlc_wait(tx);
        let _ = rx.recv();
        pool.stop();
        return;
    }
    let mut cmd = std::process::Command::new(&a.command[0]);
    cmd.args(&a.command[1..])
        .env("CHFS_SERVER", pool.server_string());
    if let Some(s) = &a.secret {
        cmd.env("CHFS_SECRET", s);
    }
    let code = match cmd.status() {
        Ok(s) => s.code().unwrap_or(1),
        Err(e) => {
            eprintln!("chfs-localpool: cannot run {}: {e}", a.command[0]);
            127
        }
    };
    pool.stop();
    std::process::exit(code);
}

/// Waits for SIGINT/SIGTERM on a thread and signals `tx`.
fn ctrlc_wait(tx: std::sync::mpsc::Sender<()>) -> std::io::Result<()> {
    // SAFETY: sigset operations on a local, zero-initialised sigset_t;
    // blocking the signals in this (main) thread before spawning makes every
    // thread inherit the mask, so sigwait below receives them.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        std::thread::spawn(move || {
            let mut sig = 0;
            libc::sigwait(&set, &mut sig);
            let _ = tx.send(());
        });
    }
    Ok(())
}
