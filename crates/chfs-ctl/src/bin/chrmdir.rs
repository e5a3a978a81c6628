//! chrmdir: remove empty directories from the pool named by CHFS_SERVER.

use clap::Parser;

/// chrmdir — remove empty directories from the chfs-rs pool named by
/// CHFS_SERVER. A directory that is not empty is refused (ENOTEMPTY) and
/// left as it was.
///
/// Exit status: 0 success, 1 some directory could not be removed, 2 bad
/// usage or the pool cannot be reached.
#[derive(Debug, Parser)]
#[command(name = "chrmdir", version, verbatim_doc_comment)]
struct Args {
    /// Directories (chfs-rs paths).
    #[arg(required = true)]
    dirs: Vec<String>,
}

fn main() {
    let a: Args = chfs_ctl::parse_args();
    let c = match chfs_ctl::client_from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("chrmdir: {e}");
            std::process::exit(2);
        }
    };
    let mut code = 0;
    for d in &a.dirs {
        if let Err(e) = c.rmdir(d) {
            eprintln!("chrmdir: failed to remove {d}: {e}");
            code = 1;
        }
    }
    std::process::exit(code);
}
