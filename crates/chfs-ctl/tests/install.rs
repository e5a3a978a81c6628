//! scripts/install.sh into a temporary PREFIX: the programs, their manual
//! pages (generated from each program's --help), the documents, and `man`
//! finding and rendering the pages the way a user runs it.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// Every command with a manual page, with its section.
const PAGES: [(&str, u8); 10] = [
    ("chfsd", 8),
    ("chfuse", 1),
    ("chfsctl", 1),
    ("chlist", 1),
    ("chmkdir", 1),
    ("chrmdir", 1),
    ("chfind", 1),
    ("chstagein", 1),
    ("chfs", 1),
    ("chfs-bench", 1),
];

/// A directory of the built programs, as `install.sh --from` takes it:
/// this crate's, chfsd, and the other crates' programs, libchfs.so and
/// libchfs_preload.so where they have been built (`cargo test --workspace`
/// builds them all).
fn built() -> (tempfile::TempDir, Vec<&'static str>, Vec<&'static str>) {
    let d = tempfile::tempdir().unwrap();
    let target = bin("chfsctl").parent().unwrap().to_path_buf();
    let mut have = Vec::new();
    let mut lacking = Vec::new();
    for (name, _) in PAGES {
        let p: PathBuf = match name {
            "chfsctl" | "chlist" | "chmkdir" | "chrmdir" | "chfind" | "chstagein" | "chfs" => {
                bin(name)
            }
            "chfsd" => chfsd(),
            _ => target.join(name),
        };
        if p.is_file() {
            std::os::unix::fs::symlink(&p, d.path().join(name)).unwrap();
            have.push(name);
        } else {
            lacking.push(name);
        }
    }
    for lib in ["libchfs.so", "libchfs_preload.so"] {
        if target.join(lib).is_file() {
            std::os::unix::fs::symlink(target.join(lib), d.path().join(lib)).unwrap();
            have.push(lib);
        } else {
            lacking.push(lib);
        }
    }
    (d, have, lacking)
}

fn install(script: &str, from: &Path, prefix: &Path, extra: &[&str]) -> std::process::Output {
    let out = Command::new("bash")
        .arg(Path::new(ROOT).join("scripts").join(script))
        .arg("--from")
        .arg(from)
        .args(extra)
        .arg(prefix)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed: {}",
        text(&out.stderr)
    );
    out
}

/// `man` as a user runs it, with plain text out, its white space (line
/// breaks of the filled text) collapsed to single spaces.
fn man(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut c = Command::new("man");
    c.args(args)
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .env("MANWIDTH", "250")
        .env_remove("MANPATH");
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("man (apt-get install man-db)");
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    (
        out.status.success(),
        all.split_whitespace().collect::<Vec<_>>().join(" "),
    )
}

#[test]
fn install_puts_programs_pages_and_documents_under_the_prefix() {
    let (from, have, lacking) = built();
    if !lacking.is_empty() {
        eprintln!(
            "not built, so not installed by this run (cargo build --workspace builds them): {}",
            lacking.join(" ")
        );
    }
    let prefix = tempfile::tempdir().unwrap();
    let p = prefix.path();
    install("install.sh", from.path(), p, &["--benches"]);
    for (name, sec) in PAGES.iter().filter(|(n, _)| have.contains(n)) {
        assert!(p.join("bin").join(name).is_file(), "bin/{name}");
        let page = p.join(format!("share/man/man{sec}/{name}.{sec}"));
        assert!(page.is_file(), "{}", page.display());
        // groff finds nothing wrong in the page.
        let out = Command::new("groff")
            .args(["-man", "-Tutf8", "-ww", "-z"])
            .arg(&page)
            .output()
            .unwrap();
        assert!(out.stderr.is_empty(), "{name}: {}", text(&out.stderr));
        // It renders, with the program's name, synopsis and options.
        let (ok, shown) = man(&["-l", page.to_str().unwrap()], &[]);
        assert!(ok, "{shown}");
        for want in [
            "NAME",
            &format!("{name} - "),
            "SYNOPSIS",
            "SEE ALSO",
            "--help",
        ] {
            assert!(shown.contains(want), "{name}: no {want:?} in\n{shown}");
        }
    }
    // The LD_PRELOAD interposer, beside libchfs.
    if have.contains(&"libchfs_preload.so") {
        let l = p.join("lib/libchfs_preload.so");
        assert!(std::fs::metadata(&l).unwrap().permissions().mode() & 0o111 != 0);
    }
    for d in ["chfsctl.md", "chfind.md", "cache-mode.md"] {
        assert!(p.join("share/doc/chfs-rs").join(d).is_file(), "{d}");
    }
    {
        let s = p.join("share/doc/chfs-rs/io500-chfind.sh");
        assert!(std::fs::metadata(&s).unwrap().permissions().mode() & 0o111 != 0);
    }

    // chfsctl's page: its actions and options, found through MANPATH.
    let manpath = p.join("share/man");
    let (ok, shown) = man(&["chfsctl"], &[("MANPATH", manpath.to_str().unwrap())]);
    assert!(ok, "{shown}");
    for want in [
        "chfsctl - start, stop and inspect a chfs-rs pool",
        "start | stop | status | kill | clean | rebalance",
        "-c, --scratch <SCRATCH>",
        "-s, --db-size <DB_SIZE>",
        "1G for a new pmem store",
        "no server found",
        "share/doc/chfs-rs/chfsctl.md",
    ] {
        assert!(shown.contains(want), "no {want:?} in\n{shown}");
    }
    // chfsd in section 8, found through the PATH alone (man-db looks in
    // PREFIX/share/man for PREFIX/bin).
    let path = format!(
        "{}:{}",
        p.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let (ok, shown) = man(&["-w", "chfsd"], &[("PATH", &path)]);
    assert!(ok, "{shown}");
    assert_eq!(
        shown.trim(),
        p.join("share/man/man8/chfsd.8").to_str().unwrap()
    );
}

#[test]
fn the_former_name_still_installs_what_it_is_given() {
    // What the C API tests hand it: chfsd (and libchfs.so) only.
    let from = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(chfsd(), from.path().join("chfsd")).unwrap();
    let prefix = tempfile::tempdir().unwrap();
    let out = install("install-capi.sh", from.path(), prefix.path(), &[]);
    let err = text(&out.stderr);
    assert!(err.contains("not installed: chfuse chfsctl"), "{err}");
    assert!(prefix.path().join("bin/chfsd").is_file());
    assert!(prefix.path().join("share/man/man8/chfsd.8").is_file());
    assert!(!prefix.path().join("bin/chfsctl").exists());
}
