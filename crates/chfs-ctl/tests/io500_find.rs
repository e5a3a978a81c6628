//! chfind as IO500's find phase (issue 26). IO500's rank 0 runs
//! `SCRIPT DATADIR -newer RESDIR/timestampfile -size 3901c -name "*01*"`
//! with `popen` (that is `/bin/sh -c`) inside the MPI job's environment, so
//! the script and chfind inherit every `OMPI_*`/`PMIX_*` variable of rank 0,
//! and IO500 parses the last line `MATCHED <hits>/<examined>`.
//!
//! The tree is written through a chfuse mount of a real pool, laid out like
//! IO500's (mdtest-easy files older than the timestamp, 3,901-byte
//! mdtest-hard files newer, a few decoys), and GNU find on the mount gives
//! the expected answer. Needs chfsd and chfuse next to chfind:
//! `cargo build -p chfs-server -p chfs-fuse`.

mod common;
mod find_tree;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime};

use chfs_localpool::LocalPool;
use common::*;
use find_tree::sorted_lines;

/// Is a FUSE file system mounted on `mp` and answering?
fn fuse_answers(mp: &Path) -> bool {
    const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
    let Ok(c) = std::ffi::CString::new(mp.as_os_str().as_encoded_bytes()) else {
        return false;
    };
    // SAFETY: statfs fills the zeroed struct it is given; the path is a
    // NUL-terminated string that lives across the call.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == FUSE_SUPER_MAGIC
    }
}

/// `chfuse -f MNT` of a pool; unmounted and stopped (by its PID) on drop.
struct Mount {
    mp: PathBuf,
    child: Child,
}

impl Mount {
    fn new(pool: &LocalPool, mp: PathBuf) -> Mount {
        std::fs::create_dir_all(&mp).unwrap();
        let child = Command::new(sibling("chfuse"))
            .arg(&mp)
            .arg("-f")
            .env("CHFS_SERVER", pool.server_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start chfuse");
        let mut m = Mount { mp, child };
        let t = Instant::now();
        while !fuse_answers(&m.mp) {
            if let Ok(Some(st)) = m.child.try_wait() {
                panic!("chfuse exited ({st}) before mounting");
            }
            assert!(t.elapsed() < Duration::from_secs(20), "mount timed out");
            std::thread::sleep(Duration::from_millis(10));
        }
        m
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .args(["-u", "-q"])
            .arg(&self.mp)
            .status();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("fusermount3")
            .args(["-u", "-q", "-z"])
            .arg(&self.mp)
            .status();
    }
}

/// What rank 0 of `mpirun -n 4` (Open MPI 4.1) finds in its environment:
/// the variables IO500 and everything it starts inherit.
const RANK0_ENV: [(&str, &str); 12] = [
    ("OMPI_COMM_WORLD_RANK", "0"),
    ("OMPI_COMM_WORLD_SIZE", "4"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
    ("OMPI_COMM_WORLD_NODE_RANK", "0"),
    ("OMPI_UNIVERSE_SIZE", "4"),
    ("OMPI_MCA_ess", "^singleton"),
    ("OMPI_MCA_orte_launch", "1"),
    ("PMIX_RANK", "0"),
    ("PMIX_NAMESPACE", "1459421185"),
    ("PMIX_ID", "1459421185.0"),
    (
        "PMIX_SERVER_URI4",
        "pmix-server.4242;tcp4://127.0.0.1:45677",
    ),
];

/// Runs `command` the way IO500's find phase does: `/bin/sh -c` in `dir`,
/// in rank 0's environment (plus `CHFS_SERVER`), and returns its output.
fn popen_like_io500(command: &str, dir: &Path, server: &str, extra: &[(&str, &str)]) -> Output {
    let t = Instant::now();
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .current_dir(dir)
        .env_remove("CHFIND_MPI")
        .envs(RANK0_ENV)
        .env("CHFS_SERVER", server)
        .envs(extra.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run /bin/sh");
    eprintln!(
        "$ {command}  ({:.2} s)\n  -> {:?}\n  stdout (tail): {}\n  stderr: {}",
        t.elapsed().as_secs_f64(),
        out.status.code(),
        text(&out.stdout)
            .lines()
            .rev()
            .take(3)
            .collect::<Vec<_>>()
            .join(" | "),
        text(&out.stderr).trim_end()
    );
    out
}

/// IO500's reading of the script's output: the last line read with
/// `fgets`, its last character (the newline) cut off, then
/// `MATCHED <hits>/<examined>` split at '/'. `None` if the line is not one.
fn io500_parse(stdout: &[u8]) -> Option<(u64, u64)> {
    let s = text(stdout);
    let last = s.split_inclusive('\n').next_back()?;
    let mut line = last.to_string();
    line.pop();
    let rest = line.strip_prefix("MATCHED ")?;
    let (l, r) = rest.split_once('/')?;
    Some((l.parse().ok()?, r.parse().ok()?))
}

fn set_mtime(p: &Path, t: SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(p)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

/// Writes IO500's kind of tree under `root` (through the mount): returns
/// nothing; GNU find is the judge.
fn build_tree(root: &Path, before: SystemTime) {
    let easy = root.join("mdtest-easy/test-dir.0-0/mdtest_tree.0");
    let hard = root.join("mdtest-hard/test-dir.0-0/mdtest_tree.0");
    let ior = root.join("ior-easy");
    for d in [&easy, &hard, &ior] {
        std::fs::create_dir_all(d).unwrap();
    }
    let data = vec![b'x'; 3901];
    for r in 0..2 {
        std::fs::write(ior.join(format!("ior_file_easy.{r:08}")), vec![1u8; 70_000]).unwrap();
        for i in 0..350 {
            // Written before the timestamp: empty, and older.
            let e = easy.join(format!("file.mdtest.{r}.{i}"));
            std::fs::write(&e, b"").unwrap();
            set_mtime(&e, before);
            // After it: 3,901 bytes.
            std::fs::write(hard.join(format!("file.mdtest.{r}.{i}")), &data).unwrap();
        }
    }
    // Decoys: the right size and name but old; the right name but one byte
    // short; a directory whose name matches.
    for k in 0..5 {
        let p = easy.join(format!("old01.{k}"));
        std::fs::write(&p, &data).unwrap();
        set_mtime(&p, before);
        std::fs::write(hard.join(format!("short01.{k}")), &data[1..]).unwrap();
    }
    std::fs::create_dir(hard.join("dir01")).unwrap();
}

#[test]
fn chfind_is_io500s_find_phase_inside_an_mpi_rank() {
    if let Some(why) = fuse_unusable() {
        chfs_localpool::skip(
            "fuse",
            "chfind_is_io500s_find_phase_inside_an_mpi_rank",
            &why,
        );
        return;
    }
    let pool = LocalPool::start(3).expect("start chfsd pool");
    let server = pool.server_string();
    let tmp = tempfile::tempdir().unwrap();
    let m = Mount::new(&pool, tmp.path().join("mnt"));
    // IO500 runs in `work`: its result directory (and the timestamp file)
    // is local, its data directory ("./datafiles/<timestamp>", IO500's
    // default form) a path in the pool.
    let work = tmp.path().join("work");
    let resdir = "./results/2024.01.01-00.00.00";
    let datadir = "./datafiles/2024.01.01-00.00.00";
    std::fs::create_dir_all(work.join(resdir)).unwrap();
    let now = SystemTime::now();
    let stamp = work.join(resdir).join("timestampfile");
    std::fs::write(&stamp, b"").unwrap();
    set_mtime(&stamp, now - Duration::from_secs(30));
    let mnt_data = m.mp.join("datafiles/2024.01.01-00.00.00");
    build_tree(&mnt_data, now - Duration::from_secs(60));

    // The answer, from GNU find over the mount.
    let gnu = Command::new("find")
        .arg(&mnt_data)
        .args(["-newer"])
        .arg(&stamp)
        .args(["-size", "3901c", "-name", "*01*"])
        .output()
        .unwrap();
    assert!(gnu.status.success(), "{}", text(&gnu.stderr));
    let strip = m.mp.to_str().unwrap();
    let expected = sorted_lines(&text(&gnu.stdout), strip);
    let all = Command::new("find").arg(&mnt_data).output().unwrap();
    let examined = text(&all.stdout).lines().count() as u64;
    eprintln!(
        "GNU find on the mount: {} of {examined} entries match",
        expected.len()
    );
    // -newer, -size and -name all matter on this tree.
    assert!(!expected.is_empty() && expected.len() < 700, "{expected:?}");

    // IO500's command line: "%s %s %s %s" of external-mpi-args (empty),
    // external-script, external-extra-args and the arguments.
    let arguments = format!("{datadir} -newer {resdir}/timestampfile -size 3901c -name \"*01*\"");
    let cmd = |script: &str, extra: &str| format!(" {script} {extra} {arguments}");
    let chfind = bin("chfind");
    let chfind = chfind.to_str().unwrap();

    // chfind itself as the script: the matches, GNU find's set.
    let out = popen_like_io500(&cmd(chfind, ""), &work, &server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let mine = sorted_lines(&text(&out.stdout), "");
    assert_eq!(mine, expected, "chfind's matches vs GNU find's");

    // With -q (external-extra-args = -q): the line IO500 parses.
    let out = popen_like_io500(&cmd(chfind, "-q"), &work, &server, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        io500_parse(&out.stdout),
        Some((expected.len() as u64, examined)),
        "last line of {:?}",
        text(&out.stdout)
    );

    // The wrapper the documentation gives (scripts/io500-chfind.sh), as
    // external-script, finding chfind through CHFIND.
    let wrapper = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/io500-chfind.sh");
    let wrapper = wrapper.canonicalize().expect("scripts/io500-chfind.sh");
    let out = popen_like_io500(
        &cmd(wrapper.to_str().unwrap(), ""),
        &work,
        &server,
        &[("CHFIND", chfind)],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        io500_parse(&out.stdout),
        Some((expected.len() as u64, examined)),
        "wrapper's last line of {:?}",
        text(&out.stdout)
    );
    // ... and through PATH, as the ini in doc/io500.md runs it.
    let path = format!(
        "{}:{}",
        bin("chfind").parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = popen_like_io500(
        &cmd(wrapper.to_str().unwrap(), ""),
        &work,
        &server,
        &[("PATH", &path)],
    );
    assert_eq!(
        io500_parse(&out.stdout),
        Some((expected.len() as u64, examined)),
        "wrapper through PATH: {:?} {}",
        text(&out.stdout),
        text(&out.stderr)
    );

    // Launched by mpirun (the parent does not carry the variables): without
    // --features mpi, chfind refuses rather than print 4 copies.
    if !cfg!(feature = "mpi") {
        let out = Command::new(bin("chfind"))
            .args(["-q", "/"])
            .envs(RANK0_ENV)
            .env("CHFS_SERVER", &server)
            .env_remove("CHFIND_MPI")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(text(&out.stderr).contains("under mpirun"));
        // Asked to be one process: it is.
        let out = Command::new(bin("chfind"))
            .args(["-q", "/datafiles"])
            .envs(RANK0_ENV)
            .env("CHFS_SERVER", &server)
            .env("CHFIND_MPI", "0")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        // Every entry matches no test: /datafiles and the tree below it.
        let n = examined + 1;
        assert_eq!(io500_parse(&out.stdout), Some((n, n)));
    }
    drop(m);
}
