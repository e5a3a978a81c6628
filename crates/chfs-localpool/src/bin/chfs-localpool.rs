//! chfs-localpool: start N chfsd servers on this machine, run a command with
//! CHFS_SERVER (and CHFS_SECRET_FILE) set (or wait for Ctrl-C), then stop
//! them.

use clap::Parser;

/// Start a local chfs-rs pool of N servers on loopback.
///
/// The pool gets a new secret (in a file of mode 0600 that its servers
/// read) unless --no-secret is given; the command, or the shell evaluating
/// the printed variables, gets the pool's client key through
/// CHFS_SECRET_FILE: only processes holding it reach the pool.
#[derive(Parser)]
#[command(name = "chfs-localpool", version)]
struct Args {
    /// Number of servers.
    #[arg(short = 'n', long, default_value_t = 4)]
    servers: usize,
    /// Use this pool secret instead of a new one (prefer the environment
    /// variable: a command line is visible to every user of the machine).
    #[arg(long, env = "CHFS_SECRET", hide_env_values = true)]
    secret: Option<String>,
    /// Start the pool without a secret: it is then open to every local and
    /// remote process that can reach its servers (a warning says so).
    #[arg(long = "no-secret", conflicts_with = "secret")]
    no_secret: bool,
    /// Extra chfsd option (repeatable), e.g. --chfsd-arg=--size=1G.
    #[arg(long = "chfsd-arg", allow_hyphen_values = true)]
    chfsd_args: Vec<String>,
    /// Command to run with CHFS_SERVER and CHFS_SECRET_FILE set; without
    /// one, print the variables and serve until Ctrl-C.
    #[arg(last = true)]
    command: Vec<String>,
}

/// The warning of a pool started without a secret.
const OPEN_POOL_WARNING: &str = "warning: --no-secret: the pool has no secret, so it is open to every local and remote process that can reach its servers: any of them can read, write and delete its files, and stop it";

fn main() {
    let a = Args::parse();
    let mut opts = chfs_localpool::PoolOptions {
        servers: a.servers,
        secret: a.secret.clone().filter(|s| !s.is_empty()),
        args: a.chfsd_args,
        ..Default::default()
    };
    if a.no_secret {
        eprintln!("chfs-localpool: {OPEN_POOL_WARNING}");
        opts.secret = None;
    } else if opts.secret.is_none() {
        opts = opts.with_new_secret();
    }
    let pool = match chfs_localpool::LocalPool::start_with(opts) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("chfs-localpool: cannot start servers: {e}");
            std::process::exit(1);
        }
    };
    let key = pool.client_key_file();
    if a.command.is_empty() {
        // Ctrl-C / SIGTERM are caught from before the variables are
        // printed: whoever reads them may stop the pool at once.
        let (tx, rx) = std::sync::mpsc::channel();
        let _ = ctrlc_wait(tx);
        println!("CHFS_SERVER={}; export CHFS_SERVER;", pool.server_string());
        match &key {
            Some(k) => println!("CHFS_SECRET_FILE={}; export CHFS_SECRET_FILE;", k.display()),
            None => println!("unset CHFS_SECRET_FILE CHFS_SECRET;"),
        }
        eprintln!(
            "chfs-localpool: {} servers running; Ctrl-C stops them",
            pool.addrs().len()
        );
        let _ = rx.recv();
        pool.stop();
        return;
    }
    let mut cmd = std::process::Command::new(&a.command[0]);
    cmd.args(&a.command[1..])
        .env("CHFS_SERVER", pool.server_string())
        .env_remove("CHFS_SECRET")
        .env_remove("CHFS_SECRET_FILE");
    if let Some(k) = &key {
        cmd.env("CHFS_SECRET_FILE", k);
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
