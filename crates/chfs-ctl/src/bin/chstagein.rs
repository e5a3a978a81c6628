//! chstagein: put files (or whole directories) into the pool before a job
//! reads them: local ones are copied in, those of the backend (cache mode)
//! fetched by the servers.

use clap::Parser;

/// Stage files and directories into the pool. A path that exists here is
/// copied in at the same path (a relative one from the pool's root), or,
/// if it lies in the pool's backend directory (cache mode), fetched by the
/// servers from there (`cd BACKEND; find . | chstagein`); any other path
/// is a path of the pool, fetched from the backend. Paths come from the
/// arguments, or from standard input (one a line) when there are none or
/// one is "-", e.g. `find /data -name '*.h5' | chstagein`. Started by
/// `mpirun` or `srun`, every rank reads the same list and stages its share
/// of the files (directories are expanded first); started by a rank (a
/// shell or program the launcher ran), chstagein is one process staging
/// everything, unless CHFS_MPI=1 (CHFS_MPI=0: one process always).
#[derive(Parser)]
#[command(name = "chstagein", version)]
struct Args {
    #[command(flatten)]
    stage: chfs_ctl::stage::StageArgs,
}

fn main() {
    let a: Args = chfs_ctl::parse_args();
    let (lines, code) = chfs_ctl::stage::run_tool("chstagein", &a.stage, chfs_ctl::client_from_env);
    for line in lines {
        // One write per line: ranks under mpirun share the terminal.
        let _ = std::io::Write::write_all(&mut std::io::stderr(), line.as_bytes());
    }
    std::process::exit(code);
}
