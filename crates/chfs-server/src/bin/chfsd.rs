//! chfsd: the chfs-rs server daemon.

use clap::Parser;

fn main() {
    let cfg = chfs_server::Config::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cfg.log_level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    let result = match &cfg.log_file {
        Some(path) => match std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            Ok(f) => {
                builder
                    .with_ansi(false)
                    .with_writer(std::sync::Mutex::new(f))
                    .init();
                chfs_server::run(cfg)
            }
            Err(e) => {
                eprintln!("chfsd: cannot open log file {}: {e}", path.display());
                std::process::exit(1);
            }
        },
        None => {
            builder.with_writer(std::io::stderr).init();
            chfs_server::run(cfg)
        }
    };
    if let Err(e) = result {
        tracing::error!("{e}");
        eprintln!("chfsd: {e}");
        std::process::exit(1);
    }
}
