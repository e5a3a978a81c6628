//! chmkdir: create directories in the pool named by CHFS_SERVER.

use clap::Parser;

/// chmkdir — create directories in the chfs-rs pool named by CHFS_SERVER.
///
/// Exit status: 0 success, 1 some directory could not be created, 2 bad
/// usage or the pool cannot be reached.
#[derive(Debug, Parser)]
#[command(name = "chmkdir", version, verbatim_doc_comment)]
struct Args {
    /// Create missing parents too; no error if the directory exists.
    #[arg(short = 'p', long = "parents")]
    parents: bool,
    /// Permission bits (octal).
    #[arg(short = 'm', long = "mode", default_value = "755")]
    mode: String,
    /// Directories (chfs-rs paths).
    #[arg(required = true)]
    dirs: Vec<String>,
}

fn main() {
    let a: Args = chfs_ctl::parse_args();
    let Ok(mode) = u32::from_str_radix(&a.mode, 8).map(|m| m & 0o7777) else {
        eprintln!("chmkdir: invalid mode {:?} (octal digits)", a.mode);
        std::process::exit(2);
    };
    let c = match chfs_ctl::client_from_env() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("chmkdir: {e}");
            std::process::exit(2);
        }
    };
    let mut code = 0;
    for d in &a.dirs {
        let r = if a.parents {
            c.mkdir_all(d, mode)
        } else {
            c.mkdir(d, mode)
        };
        if let Err(e) = r {
            eprintln!("chmkdir: cannot create directory {d}: {e}");
            code = 1;
        }
    }
    std::process::exit(code);
}
