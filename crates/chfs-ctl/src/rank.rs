//! Which rank of a launched job this process is: the one rule of every tool
//! that shares its work among the processes a launcher started (`chfind`
//! splits the servers, `chstagein` the files).
//!
//! The rule ([`launcher_split_in`]; see doc/chfind.md):
//!
//! 1. `CHFS_MPI=0` (or its older name `CHFIND_MPI=0`): one process, whatever
//!    the variables say. Another value than 0, 1 or empty is an error.
//! 2. The launcher variables, the first complete pair of
//!    - Open MPI's `OMPI_COMM_WORLD_RANK` / `OMPI_COMM_WORLD_SIZE` (`mpirun`),
//!    - `PMI_RANK` / `PMI_SIZE` (MPICH's Hydra `mpiexec`, other PMI launchers),
//!    - Slurm's `SLURM_PROCID` / `SLURM_STEP_NUM_TASKS` (`srun`: the size of
//!      the job *step*; a batch script or an `salloc` shell of a job of
//!      `-n 4` has `SLURM_PROCID=0` and `SLURM_NTASKS=4` and is one
//!      process, not a quarter of one),
//!
//!    with a size above 1 and a rank below it, say rank r of n. Anything
//!    else is one process.
//! 3. `CHFS_MPI=1`: rank r of n, as the variables say (`mpirun -n 3 sh -c
//!    'chfind ...'`, where the shell in between carries them; see 4).
//! 4. Otherwise rank r of n only if the parent process does not carry the
//!    same values (the pair, and `PMIX_NAMESPACE`, `PMIX_RANK`,
//!    `SLURM_JOB_ID`, `SLURM_STEP_ID`, set or not), read from
//!    `/proc/PPID/environ`. A launcher (`mpirun`, Open MPI's `prted`,
//!    MPICH's proxy, Slurm's `slurmstepd`) sets them for the processes it
//!    starts, never in its own environment; a process started by a rank
//!    (IO500 runs its find script through `popen`, a batch script runs
//!    its commands) inherits them from a parent that has them too, and is
//!    one process. If the parent's environment cannot be read (another
//!    user's, as `slurmstepd` is root's), the variables are taken as they
//!    are.

use crate::error::CtlError;

/// This process's part of work shared by `ranks` processes: the items
/// (servers of a find, files of a stage-in) whose index i has
/// `i % ranks == rank`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankSplit {
    /// This process's rank (0-based).
    pub rank: usize,
    /// Number of processes.
    pub ranks: usize,
}

impl RankSplit {
    /// One process does everything.
    pub const SINGLE: Self = Self { rank: 0, ranks: 1 };

    /// Is item (server) `index` this rank's?
    pub fn owns(&self, index: usize) -> bool {
        self.ranks <= 1 || index % self.ranks == self.rank
    }

    /// This rank's items of `items`: every `ranks`-th from the `rank`-th
    /// (those it [`owns`](Self::owns)).
    pub fn share<T>(&self, items: Vec<T>) -> Vec<T> {
        items
            .into_iter()
            .enumerate()
            .filter(|(i, _)| self.owns(*i))
            .map(|(_, x)| x)
            .collect()
    }
}

/// The launcher variables of a rank, (rank, size), in the order they are
/// read: Open MPI's, those of MPICH and other PMI launchers, Slurm's of a
/// job step.
const LAUNCHER_VARS: [(&str, &str); 3] = [
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMI_RANK", "PMI_SIZE"),
    ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS"),
];

/// Variables naming the job (step) a rank belongs to, compared with the
/// parent's as well: another launcher started inside a rank (a nested
/// `mpirun`, an `srun` in a batch script) gives its processes other values.
const JOB_VARS: [&str; 4] = [
    "PMIX_NAMESPACE",
    "PMIX_RANK",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
];

/// The variables that override the rule, the first set (non-empty) one
/// counting: `CHFS_MPI`, and `CHFIND_MPI`, its name when only chfind read it.
const FORCE_VARS: [&str; 2] = ["CHFS_MPI", "CHFIND_MPI"];

/// This process's rank and the number of ranks when a launcher (`mpirun`,
/// `mpiexec`, `srun`) started it as one of several ranks;
/// [`RankSplit::SINGLE`] otherwise. The rule is in the [module
/// documentation](self); an override other than 0 or 1 is a
/// [`CtlError::Usage`].
pub fn launcher_split() -> Result<RankSplit, CtlError> {
    let parent = parent_environment();
    launcher_split_in(
        |k| std::env::var(k).ok(),
        parent
            .as_ref()
            .map(|env| move |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone())),
    )
}

/// [`launcher_split`] from this process's variables (`own`) and its parent's
/// (`parent`, `None` when unknown).
pub fn launcher_split_in(
    own: impl Fn(&str) -> Option<String>,
    parent: Option<impl Fn(&str) -> Option<String>>,
) -> Result<RankSplit, CtlError> {
    let set = FORCE_VARS
        .iter()
        .find_map(|k| own(k).filter(|v| !v.is_empty()).map(|v| (k, v)));
    let forced = match set {
        None => false,
        Some((_, v)) if v == "0" => return Ok(RankSplit::SINGLE),
        Some((_, v)) if v == "1" => true,
        Some((k, v)) => {
            return Err(CtlError::Usage(format!(
                "{k}={v:?}: expected 0 (one process) or 1 (a rank of the launcher's job)"
            )))
        }
    };
    let get = |k: &str| own(k).and_then(|v| v.parse::<usize>().ok());
    for (r, n) in LAUNCHER_VARS {
        let (Some(rank), Some(ranks)) = (get(r), get(n)) else {
            continue;
        };
        if ranks == 0 || rank >= ranks {
            continue;
        }
        let inherited = !forced
            && parent
                .as_ref()
                .is_some_and(|p| [r, n].into_iter().chain(JOB_VARS).all(|k| p(k) == own(k)));
        return Ok(if inherited {
            RankSplit::SINGLE
        } else {
            RankSplit { rank, ranks }
        });
    }
    Ok(RankSplit::SINGLE)
}

/// The environment of this process's parent, if it can be read.
fn parent_environment() -> Option<Vec<(String, String)>> {
    let ppid = std::os::unix::process::parent_id();
    let raw = std::fs::read(format!("/proc/{ppid}/environ")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter_map(|kv| std::str::from_utf8(kv).ok()?.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(kv: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| kv.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    }

    /// The rule with this process's variables `own` and its parent's
    /// (`None`: unknown).
    fn split(own: &[(&str, &str)], parent: Option<&[(&str, &str)]>) -> RankSplit {
        let none: Option<fn(&str) -> Option<String>> = None;
        match parent {
            Some(p) => launcher_split_in(env(own), Some(env(p))),
            None => launcher_split_in(env(own), none),
        }
        .unwrap()
    }

    fn rank(rank: usize, ranks: usize) -> RankSplit {
        RankSplit { rank, ranks }
    }

    const SINGLE: RankSplit = RankSplit::SINGLE;

    #[test]
    fn no_launcher_is_one_process() {
        assert_eq!(split(&[], Some(&[])), SINGLE);
        assert_eq!(split(&[], None), SINGLE);
        assert_eq!(
            split(&[("PATH", "/bin")], Some(&[("PATH", "/bin")])),
            SINGLE
        );
    }

    #[test]
    fn open_mpi_ranks() {
        let rank1 = [
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("PMIX_NAMESPACE", "42"),
            ("PMIX_RANK", "1"),
        ];
        // Started by mpirun / prted (whose own environment has none of them).
        assert_eq!(split(&rank1, Some(&[("PATH", "/bin")])), rank(1, 3));
        // Parent unknown: the variables are taken as they are.
        assert_eq!(split(&rank1, None), rank(1, 3));
        // Started by a rank (IO500's popen): the parent has the same values.
        assert_eq!(split(&rank1, Some(&rank1)), SINGLE);
        // Started by another job's launcher inside a rank: other values.
        let outer = [
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "3"),
            ("PMIX_NAMESPACE", "7"),
            ("PMIX_RANK", "1"),
        ];
        assert_eq!(split(&rank1, Some(&outer)), rank(1, 3));
        // One rank of one is one process.
        let alone = [("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1")];
        assert_eq!(split(&alone, Some(&[])), SINGLE);
        // Under Slurm (mpirun's daemons are srun tasks): Open MPI's count.
        let in_slurm = [
            &rank1[..],
            &[
                ("SLURM_PROCID", "0"),
                ("SLURM_STEP_NUM_TASKS", "1"),
                ("SLURM_JOB_ID", "5"),
            ],
        ]
        .concat();
        assert_eq!(split(&in_slurm, Some(&[("SLURM_JOB_ID", "5")])), rank(1, 3));
    }

    #[test]
    fn pmi_mpich_ranks() {
        let pmi = [("PMI_RANK", "0"), ("PMI_SIZE", "2")];
        assert_eq!(split(&pmi, Some(&[])), rank(0, 2));
        assert_eq!(split(&pmi, Some(&pmi)), SINGLE);
        // Nonsense values are ignored.
        let bad = [("PMI_RANK", "5"), ("PMI_SIZE", "2")];
        assert_eq!(split(&bad, Some(&[])), SINGLE);
        let bad = [("PMI_RANK", "x"), ("PMI_SIZE", "2")];
        assert_eq!(split(&bad, Some(&[])), SINGLE);
        let zero = [("PMI_RANK", "0"), ("PMI_SIZE", "0")];
        assert_eq!(split(&zero, Some(&[])), SINGLE);
    }

    #[test]
    fn slurm_srun_steps_not_batch_scripts() {
        // Task 1 of `srun -n 4` in a job of 4 tasks (parent: slurmstepd).
        let task = [
            ("SLURM_JOB_ID", "77"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_STEP_NUM_TASKS", "4"),
        ];
        assert_eq!(split(&task, Some(&[])), rank(1, 4));
        // slurmstepd is root's: its environment cannot be read.
        assert_eq!(split(&task, None), rank(1, 4));
        // A batch script (or an salloc shell) of a 4-task job: one process,
        // however many tasks the job has.
        let batch = [
            ("SLURM_JOB_ID", "77"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "4"),
        ];
        assert_eq!(split(&batch, Some(&[])), SINGLE);
        assert_eq!(split(&batch, None), SINGLE);
        // A command the batch step's shell runs, where the batch step says
        // it has 4 tasks: the shell (its parent) carries the same values.
        let step = [
            ("SLURM_JOB_ID", "77"),
            ("SLURM_STEP_ID", "4294967291"),
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_NUM_TASKS", "4"),
        ];
        assert_eq!(split(&step, Some(&step)), SINGLE);
        // `srun -n 2` inside that script: a new step, its own tasks.
        let nested = [
            ("SLURM_JOB_ID", "77"),
            ("SLURM_STEP_ID", "1"),
            ("SLURM_PROCID", "1"),
            ("SLURM_STEP_NUM_TASKS", "2"),
        ];
        assert_eq!(split(&nested, Some(&step)), rank(1, 2));
        // Only the job's count, no step's: one process.
        let job_only = [("SLURM_PROCID", "1"), ("SLURM_NTASKS", "4")];
        assert_eq!(split(&job_only, Some(&[])), SINGLE);
    }

    #[test]
    fn the_override_forces_either_way() {
        let rank1 = [("OMPI_COMM_WORLD_RANK", "1"), ("OMPI_COMM_WORLD_SIZE", "3")];
        for var in ["CHFS_MPI", "CHFIND_MPI"] {
            // `mpirun sh -c 'chfind ...'`: the shell in between.
            let asked = [&rank1[..], &[(var, "1")]].concat();
            assert_eq!(split(&asked, Some(&rank1)), rank(1, 3), "{var}");
            let alone = [&rank1[..], &[(var, "0")]].concat();
            assert_eq!(split(&alone, Some(&[])), SINGLE, "{var}");
            // Asking for a rank without launcher variables: one process.
            assert_eq!(split(&[(var, "1")], Some(&[])), SINGLE, "{var}");
            let bad = [(var, "yes")];
            let e = launcher_split_in(env(&bad), Some(env(&[]))).unwrap_err();
            assert!(matches!(&e, CtlError::Usage(m) if m.contains(var)), "{e}");
        }
        // CHFS_MPI counts before CHFIND_MPI; an empty one is not set.
        let both = [&rank1[..], &[("CHFS_MPI", "0"), ("CHFIND_MPI", "1")]].concat();
        assert_eq!(split(&both, Some(&[])), SINGLE);
        let empty = [&rank1[..], &[("CHFS_MPI", ""), ("CHFIND_MPI", "1")]].concat();
        assert_eq!(split(&empty, Some(&rank1)), rank(1, 3));
    }

    #[test]
    fn a_rank_owns_every_ranks_th_item() {
        let items: Vec<usize> = (0..10).collect();
        assert_eq!(rank(1, 3).share(items.clone()), vec![1, 4, 7]);
        assert_eq!(SINGLE.share(items.clone()), items);
        assert!(rank(2, 3).owns(5) && !rank(2, 3).owns(4));
        let all: usize = (0..4).map(|r| rank(r, 4).share(items.clone()).len()).sum();
        assert_eq!(all, items.len());
    }
}
