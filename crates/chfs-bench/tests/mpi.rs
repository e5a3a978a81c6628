//! MPI mode (`cargo test -p chfs-bench --features mpi`; needs `mpirun` from
//! openmpi-bin and `chfsd` built): every rank a process started by mpirun.
#![cfg(feature = "mpi")]

use std::process::Command;

use chfs_bench::report::RunResult;

#[test]
fn mpirun_three_ranks_on_a_pool_and_a_directory() {
    let dir = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
    let out = tempfile::tempdir().unwrap();
    let json = out.path().join("m.json");
    let o = Command::new("mpirun")
        .args([
            "--oversubscribe",
            "-n",
            "3",
            env!("CARGO_BIN_EXE_chfs-bench"),
        ])
        .args(["--servers", "2", "--reference"])
        .arg(dir.path())
        .args([
            "--quick",
            "--stonewall",
            "10",
            "--transfer",
            "65536",
            "--easy-segments",
            "4",
        ])
        .args([
            "--hard-records",
            "3",
            "--easy-files",
            "20",
            "--hard-files",
            "110",
        ])
        .arg("--json")
        .arg(&json)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env_remove("CHFS_SERVER")
        .output()
        .expect("mpirun (apt-get install openmpi-bin)");
    assert!(
        o.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let run: RunResult = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // -n on the command line is ignored: the MPI world has 3 ranks
    assert_eq!(run.params.nprocs, 3);
    for t in std::iter::once(&run.system).chain(run.reference.iter()) {
        assert_eq!(t.phases.len(), 12);
        assert!(t
            .phases
            .iter()
            .all(|p| p.valid && p.per_rank.len() == 3 || p.name == "find"));
        let get = |n: &str| t.phases.iter().find(|p| p.name == n).unwrap();
        assert_eq!(get("ior-easy-read").bytes, 3 * 4 * 65536);
        assert_eq!(get("ior-hard-read").bytes, 3 * 3 * 47008);
        assert_eq!(get("mdtest-hard-delete").items, 3 * 110);
        assert_eq!(t.find.found, 3);
        assert_eq!(t.find.expected, 3);
        assert_eq!(t.open_storm.ranks, 3);
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
