//! chlist: list the servers of the pool named by CHFS_SERVER.

use clap::Parser;

/// chlist — list the servers of the chfs-rs pool named by CHFS_SERVER, one
/// per line in placement order.
///
/// Exit status: 0 success, 1 the pool cannot be reached, 2 bad usage.
#[derive(Debug, Parser)]
#[command(name = "chlist", version, verbatim_doc_comment)]
struct Args {
    /// Print the comma-separated CHFS_SERVER form on one line.
    #[arg(short = 'c')]
    comma: bool,
    /// Also ask every server for its state (up, or the error).
    #[arg(short = 's')]
    state: bool,
}

fn main() {
    let a: Args = chfs_ctl::parse_args();
    let c = match chfs_ctl::client_from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("chlist: {e}");
            std::process::exit(e.exit_code());
        }
    };
    if a.comma {
        println!("{}", c.servers().join(","));
        return;
    }
    if !a.state {
        for s in c.servers() {
            println!("{s}");
        }
        return;
    }
    let mut code = 0;
    for (s, r) in c.server_status() {
        match r {
            Ok(_) => println!("{s} up"),
            Err(e) => {
                println!("{s} DOWN");
                eprintln!("chlist: server {s}: {e}");
                code = 1;
            }
        }
    }
    std::process::exit(code);
}
