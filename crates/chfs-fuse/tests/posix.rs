//! A POSIX conformance suite in the spirit of pjdfstest: for each syscall,
//! its success cases and its documented errnos, run on a tmpfs directory
//! and on the mount. Outcomes are compared; every difference must be one
//! of [`KNOWN`], each listed (by case name) in SEMANTICS.md with its reason.

mod common;

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use common::*;

/// Cases whose outcome on the mount differs from tmpfs on purpose.
const KNOWN: &[&str] = &[
    "link_hard",
    "rename_exchange",
    "setxattr_user",
    "dir_nlink_counts_subdirs",
    "dir_mtime_on_create",
    "unlink_open_file_fstat_and_write",
];

fn cs(p: &Path) -> CString {
    CString::new(p.as_os_str().as_encoded_bytes()).unwrap()
}

fn errname(e: i32) -> String {
    let n = match e {
        libc::EPERM => "EPERM",
        libc::ENOENT => "ENOENT",
        libc::EIO => "EIO",
        libc::EBADF => "EBADF",
        libc::EACCES => "EACCES",
        libc::EBUSY => "EBUSY",
        libc::EEXIST => "EEXIST",
        libc::EXDEV => "EXDEV",
        libc::ENOTDIR => "ENOTDIR",
        libc::EISDIR => "EISDIR",
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::ENOSPC => "ENOSPC",
        libc::EROFS => "EROFS",
        libc::EMLINK => "EMLINK",
        libc::ENAMETOOLONG => "ENAMETOOLONG",
        libc::ENOTEMPTY => "ENOTEMPTY",
        libc::ELOOP => "ELOOP",
        libc::ENODATA => "ENODATA",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::ENOSYS => "ENOSYS",
        libc::ENXIO => "ENXIO",
        _ => return format!("errno {e}"),
    };
    n.to_string()
}

fn res<T>(r: std::io::Result<T>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => e.raw_os_error().map_or(e.to_string(), errname),
    }
}

fn rc(r: i32) -> String {
    if r == 0 {
        "ok".into()
    } else {
        errname(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }
}

fn touch(p: &Path) {
    File::create(p).unwrap();
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn renameat2(a: &Path, b: &Path, flags: u32) -> String {
    // SAFETY: valid NUL-terminated paths.
    rc(unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            cs(a).as_ptr(),
            libc::AT_FDCWD,
            cs(b).as_ptr(),
            flags,
        )
    })
}

fn utimens(p: &Path, a: (i64, i64), m: (i64, i64), flags: i32) -> String {
    let ts = [
        libc::timespec {
            tv_sec: a.0,
            tv_nsec: a.1,
        },
        libc::timespec {
            tv_sec: m.0,
            tv_nsec: m.1,
        },
    ];
    // SAFETY: valid path and a two-element timespec array.
    rc(unsafe { libc::utimensat(libc::AT_FDCWD, cs(p).as_ptr(), ts.as_ptr(), flags) })
}

type Case = (&'static str, fn(&Path) -> String);

fn cases() -> Vec<Case> {
    vec![
        // ---- open / creat
        ("open_creat_excl_existing", |d| {
            touch(&d.join("f"));
            res(OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(d.join("f")))
        }),
        ("open_creat_excl_dangling_symlink", |d| {
            std::os::unix::fs::symlink("nowhere", d.join("l")).unwrap();
            res(OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(d.join("l")))
        }),
        ("open_missing", |d| res(File::open(d.join("nope")))),
        ("open_dir_for_write", |d| {
            fs::create_dir(d.join("x")).unwrap();
            res(OpenOptions::new().write(true).open(d.join("x")))
        }),
        ("open_file_o_directory", |d| {
            touch(&d.join("f"));
            res(OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECTORY)
                .open(d.join("f")))
        }),
        ("open_through_a_file", |d| {
            touch(&d.join("f"));
            res(File::open(d.join("f/x")))
        }),
        ("creat_in_missing_dir", |d| {
            res(File::create(d.join("no/f")))
        }),
        ("creat_mode_and_umask", |d| {
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o666)
                .open(d.join("f"))
                .unwrap();
            format!("ok:{:o}", mode(&d.join("f")))
        }),
        ("open_trunc", |d| {
            fs::write(d.join("f"), b"0123456789").unwrap();
            OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(d.join("f"))
                .unwrap();
            format!("ok:{}", fs::metadata(d.join("f")).unwrap().len())
        }),
        ("name_too_long", |d| {
            res(File::create(d.join("n".repeat(256))))
        }),
        ("name_255_ok", |d| {
            res(File::create(d.join("n".repeat(255))))
        }),
        ("open_nofollow_symlink", |d| {
            touch(&d.join("f"));
            std::os::unix::fs::symlink("f", d.join("l")).unwrap();
            res(OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(d.join("l")))
        }),
        ("open_symlink_loop", |d| {
            std::os::unix::fs::symlink("loop", d.join("loop")).unwrap();
            res(File::open(d.join("loop")))
        }),
        ("open_follows_symlink_chain", |d| {
            fs::write(d.join("f"), b"abc").unwrap();
            std::os::unix::fs::symlink("f", d.join("l1")).unwrap();
            std::os::unix::fs::symlink("l1", d.join("l2")).unwrap();
            format!("ok:{}", fs::read_to_string(d.join("l2")).unwrap())
        }),
        // ---- mkdir / rmdir
        ("mkdir_mode", |d| {
            let c = cs(&d.join("x"));
            // SAFETY: valid path.
            let r = rc(unsafe { libc::mkdir(c.as_ptr(), 0o777) });
            format!("{r}:{:o}", mode(&d.join("x")))
        }),
        ("mkdir_existing", |d| {
            fs::create_dir(d.join("x")).unwrap();
            res(fs::create_dir(d.join("x")))
        }),
        ("mkdir_over_file", |d| {
            touch(&d.join("x"));
            res(fs::create_dir(d.join("x")))
        }),
        ("mkdir_missing_parent", |d| {
            res(fs::create_dir(d.join("a/b")))
        }),
        ("mkdir_under_file", |d| {
            touch(&d.join("f"));
            res(fs::create_dir(d.join("f/b")))
        }),
        ("rmdir_nonempty", |d| {
            fs::create_dir_all(d.join("x/y")).unwrap();
            res(fs::remove_dir(d.join("x")))
        }),
        ("rmdir_nonempty_file", |d| {
            fs::create_dir(d.join("x")).unwrap();
            touch(&d.join("x/f"));
            res(fs::remove_dir(d.join("x")))
        }),
        ("rmdir_file", |d| {
            touch(&d.join("f"));
            res(fs::remove_dir(d.join("f")))
        }),
        ("rmdir_missing", |d| res(fs::remove_dir(d.join("x")))),
        ("rmdir_dot", |d| {
            fs::create_dir(d.join("x")).unwrap();
            res(fs::remove_dir(d.join("x/.")))
        }),
        ("rmdir_ok_then_gone", |d| {
            fs::create_dir(d.join("x")).unwrap();
            fs::remove_dir(d.join("x")).unwrap();
            res(fs::metadata(d.join("x")))
        }),
        // ---- unlink
        ("unlink_dir", |d| {
            fs::create_dir(d.join("x")).unwrap();
            res(fs::remove_file(d.join("x")))
        }),
        ("unlink_missing", |d| res(fs::remove_file(d.join("x")))),
        ("unlink_open_file_fstat_and_write", |d| {
            let mut f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(d.join("f"))
                .unwrap();
            fs::remove_file(d.join("f")).unwrap();
            f.write_all(b"more").unwrap();
            let len = f.metadata().map(|m| m.len());
            let names = fs::read_dir(d).unwrap().count();
            drop(f);
            let after = fs::read_dir(d).unwrap().count();
            format!("ok:{:?}:{}:{after}", len.ok(), d.join("f").exists())
                + if names == 0 { "" } else { ":hidden-visible" }
        }),
        ("unlink_symlink_not_target", |d| {
            touch(&d.join("f"));
            std::os::unix::fs::symlink("f", d.join("l")).unwrap();
            fs::remove_file(d.join("l")).unwrap();
            res(fs::metadata(d.join("f")))
        }),
        ("unlink_open_file_still_readable", |d| {
            fs::write(d.join("f"), b"keep").unwrap();
            let mut f = File::open(d.join("f")).unwrap();
            fs::remove_file(d.join("f")).unwrap();
            let mut s = String::new();
            let r = res(f.read_to_string(&mut s));
            format!("{r}:{s}")
        }),
        // ---- rename
        ("rename_file_over_file", |d| {
            fs::write(d.join("a"), b"A").unwrap();
            fs::write(d.join("b"), b"B").unwrap();
            let r = res(fs::rename(d.join("a"), d.join("b")));
            format!(
                "{r}:{}:{}",
                fs::read_to_string(d.join("b")).unwrap(),
                d.join("a").exists()
            )
        }),
        ("rename_dir_over_empty_dir", |d| {
            fs::create_dir_all(d.join("a/in")).unwrap();
            fs::create_dir(d.join("b")).unwrap();
            let r = res(fs::rename(d.join("a"), d.join("b")));
            format!("{r}:{}", d.join("b/in").is_dir())
        }),
        ("rename_dir_over_nonempty_dir", |d| {
            fs::create_dir(d.join("a")).unwrap();
            fs::create_dir_all(d.join("b/x")).unwrap();
            res(fs::rename(d.join("a"), d.join("b")))
        }),
        ("rename_file_over_dir", |d| {
            touch(&d.join("a"));
            fs::create_dir(d.join("b")).unwrap();
            res(fs::rename(d.join("a"), d.join("b")))
        }),
        ("rename_dir_over_file", |d| {
            fs::create_dir(d.join("a")).unwrap();
            touch(&d.join("b"));
            res(fs::rename(d.join("a"), d.join("b")))
        }),
        ("rename_into_own_subdir", |d| {
            fs::create_dir_all(d.join("a/b")).unwrap();
            res(fs::rename(d.join("a"), d.join("a/b/c")))
        }),
        ("rename_missing", |d| {
            res(fs::rename(d.join("a"), d.join("b")))
        }),
        ("rename_to_missing_dir", |d| {
            touch(&d.join("a"));
            res(fs::rename(d.join("a"), d.join("no/b")))
        }),
        ("rename_same_file", |d| {
            touch(&d.join("a"));
            res(fs::rename(d.join("a"), d.join("a")))
        }),
        ("rename_noreplace_existing", |d| {
            touch(&d.join("a"));
            touch(&d.join("b"));
            renameat2(&d.join("a"), &d.join("b"), libc::RENAME_NOREPLACE)
        }),
        ("rename_noreplace_free", |d| {
            touch(&d.join("a"));
            let r = renameat2(&d.join("a"), &d.join("b"), libc::RENAME_NOREPLACE);
            format!("{r}:{}", d.join("b").exists())
        }),
        ("rename_exchange", |d| {
            touch(&d.join("a"));
            touch(&d.join("b"));
            renameat2(&d.join("a"), &d.join("b"), libc::RENAME_EXCHANGE)
        }),
        ("rename_dir_tree_contents_follow", |d| {
            fs::create_dir_all(d.join("a/b")).unwrap();
            fs::write(d.join("a/b/f"), b"deep").unwrap();
            fs::rename(d.join("a"), d.join("z")).unwrap();
            format!(
                "ok:{}:{}",
                fs::read_to_string(d.join("z/b/f")).unwrap(),
                d.join("a").exists()
            )
        }),
        ("rename_open_file_then_write", |d| {
            let mut f = File::create(d.join("a")).unwrap();
            f.write_all(b"1").unwrap();
            fs::rename(d.join("a"), d.join("b")).unwrap();
            f.write_all(b"2").unwrap();
            drop(f);
            format!("ok:{}", fs::read_to_string(d.join("b")).unwrap())
        }),
        // ---- symlink / readlink / link
        ("symlink_existing", |d| {
            touch(&d.join("a"));
            res(std::os::unix::fs::symlink("x", d.join("a")))
        }),
        ("readlink_value", |d| {
            std::os::unix::fs::symlink("../some/where", d.join("l")).unwrap();
            format!("ok:{}", fs::read_link(d.join("l")).unwrap().display())
        }),
        ("readlink_on_file", |d| {
            touch(&d.join("f"));
            res(fs::read_link(d.join("f")))
        }),
        ("symlink_lstat_size", |d| {
            std::os::unix::fs::symlink("12345", d.join("l")).unwrap();
            format!("ok:{}", fs::symlink_metadata(d.join("l")).unwrap().len())
        }),
        ("link_hard", |d| {
            touch(&d.join("a"));
            res(fs::hard_link(d.join("a"), d.join("b")))
        }),
        // ---- truncate / ftruncate
        ("truncate_grow_then_shrink", |d| {
            fs::write(d.join("f"), b"abc").unwrap();
            let f = OpenOptions::new().write(true).open(d.join("f")).unwrap();
            f.set_len(200_000).unwrap();
            let a = fs::read(d.join("f")).unwrap();
            f.set_len(2).unwrap();
            let b = fs::read(d.join("f")).unwrap();
            format!("ok:{}:{}:{:?}", a.len(), a[3..].iter().all(|&x| x == 0), b)
        }),
        ("truncate_dir", |d| {
            fs::create_dir(d.join("x")).unwrap();
            // SAFETY: valid path.
            rc(unsafe { libc::truncate(cs(&d.join("x")).as_ptr(), 0) })
        }),
        ("truncate_negative", |d| {
            touch(&d.join("f"));
            // SAFETY: valid path.
            rc(unsafe { libc::truncate(cs(&d.join("f")).as_ptr(), -1) })
        }),
        ("ftruncate_readonly_fd", |d| {
            touch(&d.join("f"));
            let f = File::open(d.join("f")).unwrap();
            res(f.set_len(10))
        }),
        // ---- attributes
        ("chmod_file_and_dir", |d| {
            touch(&d.join("f"));
            fs::create_dir(d.join("x")).unwrap();
            fs::set_permissions(d.join("f"), PermissionsExt::from_mode(0o4751)).unwrap();
            fs::set_permissions(d.join("x"), PermissionsExt::from_mode(0o1777)).unwrap();
            format!("ok:{:o}:{:o}", mode(&d.join("f")), mode(&d.join("x")))
        }),
        ("chmod_missing", |d| {
            res(fs::set_permissions(
                d.join("no"),
                PermissionsExt::from_mode(0o600),
            ))
        }),
        ("chown_as_root", |d| {
            if !is_root() {
                return "skipped".into();
            }
            touch(&d.join("f"));
            // SAFETY: valid path.
            let r = rc(unsafe { libc::chown(cs(&d.join("f")).as_ptr(), 4321, 8765) });
            let m = fs::metadata(d.join("f")).unwrap();
            format!("{r}:{}:{}", m.uid(), m.gid())
        }),
        ("ctime_changes_on_chmod", |d| {
            touch(&d.join("f"));
            let a = fs::metadata(d.join("f")).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            fs::set_permissions(d.join("f"), PermissionsExt::from_mode(0o600)).unwrap();
            let b = fs::metadata(d.join("f")).unwrap();
            format!(
                "ok:{}",
                (b.ctime(), b.ctime_nsec()) > (a.ctime(), a.ctime_nsec())
            )
        }),
        ("mtime_changes_on_write", |d| {
            touch(&d.join("f"));
            let a = fs::metadata(d.join("f")).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            fs::write(d.join("f"), b"x").unwrap();
            let b = fs::metadata(d.join("f")).unwrap();
            format!(
                "ok:{}",
                (b.mtime(), b.mtime_nsec()) > (a.mtime(), a.mtime_nsec())
            )
        }),
        ("utimens_exact", |d| {
            touch(&d.join("f"));
            let r = utimens(&d.join("f"), (1000, 1), (2000, 999_999_999), 0);
            let m = fs::metadata(d.join("f")).unwrap();
            format!(
                "{r}:{}.{}:{}.{}",
                m.atime(),
                m.atime_nsec(),
                m.mtime(),
                m.mtime_nsec()
            )
        }),
        ("utimens_omit_keeps", |d| {
            touch(&d.join("f"));
            utimens(&d.join("f"), (1000, 0), (2000, 0), 0);
            let r = utimens(&d.join("f"), (0, libc::UTIME_OMIT), (3000, 0), 0);
            let m = fs::metadata(d.join("f")).unwrap();
            format!("{r}:{}:{}", m.atime(), m.mtime())
        }),
        ("utimens_now", |d| {
            touch(&d.join("f"));
            utimens(&d.join("f"), (1000, 0), (2000, 0), 0);
            let r = utimens(&d.join("f"), (0, libc::UTIME_NOW), (0, libc::UTIME_NOW), 0);
            let m = fs::metadata(d.join("f")).unwrap();
            format!(
                "{r}:{}",
                m.mtime() > 1_700_000_000 && m.atime() > 1_700_000_000
            )
        }),
        ("utimens_symlink_nofollow", |d| {
            touch(&d.join("f"));
            std::os::unix::fs::symlink("f", d.join("l")).unwrap();
            utimens(&d.join("f"), (1000, 0), (2000, 0), 0);
            let r = utimens(
                &d.join("l"),
                (5000, 0),
                (6000, 0),
                libc::AT_SYMLINK_NOFOLLOW,
            );
            let l = fs::symlink_metadata(d.join("l")).unwrap();
            let f = fs::metadata(d.join("f")).unwrap();
            format!("{r}:{}:{}", l.mtime(), f.mtime())
        }),
        ("utimens_missing", |d| {
            utimens(&d.join("no"), (1, 0), (1, 0), 0)
        }),
        // ---- special files
        ("mkfifo_type", |d| {
            let c = cs(&d.join("p"));
            // SAFETY: valid path.
            let r = rc(unsafe { libc::mkfifo(c.as_ptr(), 0o640) });
            let m = fs::symlink_metadata(d.join("p")).unwrap();
            format!("{r}:{:o}", m.mode())
        }),
        ("mknod_char_device_as_root", |d| {
            if !is_root() {
                return "skipped".into();
            }
            let c = cs(&d.join("c"));
            let dev = libc::makedev(1, 3);
            // SAFETY: valid path.
            let r = rc(unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, dev) });
            let m = fs::symlink_metadata(d.join("c")).unwrap();
            format!("{r}:{:o}:{}", m.mode(), m.rdev() == dev)
        }),
        ("mknod_existing", |d| {
            touch(&d.join("f"));
            let c = cs(&d.join("f"));
            // SAFETY: valid path.
            rc(unsafe { libc::mkfifo(c.as_ptr(), 0o640) })
        }),
        // ---- access
        ("access_f_ok", |d| {
            touch(&d.join("f"));
            // SAFETY: valid path.
            rc(unsafe { libc::access(cs(&d.join("f")).as_ptr(), libc::F_OK) })
        }),
        ("access_missing", |d| {
            // SAFETY: valid path.
            rc(unsafe { libc::access(cs(&d.join("no")).as_ptr(), libc::F_OK) })
        }),
        ("access_x_on_plain_file_as_root", |d| {
            touch(&d.join("f"));
            fs::set_permissions(d.join("f"), PermissionsExt::from_mode(0o644)).unwrap();
            // SAFETY: valid path.
            rc(unsafe { libc::access(cs(&d.join("f")).as_ptr(), libc::X_OK) })
        }),
        // ---- directories
        ("readdir_names", |d| {
            for n in ["c", "a", "b"] {
                touch(&d.join(n));
            }
            fs::create_dir(d.join("sub")).unwrap();
            let mut v: Vec<String> = fs::read_dir(d)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            format!("ok:{}", v.join(","))
        }),
        ("readdir_while_unlinking", |d| {
            for i in 0..300 {
                touch(&d.join(format!("f{i:03}")));
            }
            let mut seen = 0;
            for e in fs::read_dir(d).unwrap() {
                fs::remove_file(e.unwrap().path()).unwrap();
                seen += 1;
            }
            format!("ok:{seen}:{}", fs::read_dir(d).unwrap().count())
        }),
        ("readdir_dtype", |d| {
            fs::create_dir(d.join("x")).unwrap();
            std::os::unix::fs::symlink("x", d.join("l")).unwrap();
            touch(&d.join("f"));
            let mut v: Vec<String> = fs::read_dir(d)
                .unwrap()
                .map(|e| {
                    let e = e.unwrap();
                    let t = e.file_type().unwrap();
                    format!(
                        "{}{}",
                        e.file_name().to_string_lossy(),
                        if t.is_dir() {
                            "/"
                        } else if t.is_symlink() {
                            "@"
                        } else {
                            ""
                        }
                    )
                })
                .collect();
            v.sort();
            format!("ok:{}", v.join(","))
        }),
        ("dir_nlink_counts_subdirs", |d| {
            fs::create_dir_all(d.join("x/y")).unwrap();
            format!("ok:{}", fs::metadata(d.join("x")).unwrap().nlink())
        }),
        ("dir_mtime_on_create", |d| {
            fs::create_dir(d.join("x")).unwrap();
            let a = fs::metadata(d.join("x")).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            touch(&d.join("x/f"));
            let b = fs::metadata(d.join("x")).unwrap();
            format!(
                "ok:{}",
                (b.mtime(), b.mtime_nsec()) > (a.mtime(), a.mtime_nsec())
            )
        }),
        // ---- data
        ("write_read_across_chunks", |d| {
            let data = pattern(3 << 20, 1);
            fs::write(d.join("f"), &data).unwrap();
            format!("ok:{}", fs::read(d.join("f")).unwrap() == data)
        }),
        ("pread_beyond_eof", |d| {
            fs::write(d.join("f"), b"abc").unwrap();
            let mut f = File::open(d.join("f")).unwrap();
            f.seek(SeekFrom::Start(100)).unwrap();
            let mut b = [0u8; 10];
            format!("ok:{}", f.read(&mut b).unwrap())
        }),
        ("hole_reads_zeros", |d| {
            let mut f = File::create(d.join("f")).unwrap();
            f.seek(SeekFrom::Start(1_000_000)).unwrap();
            f.write_all(b"end").unwrap();
            drop(f);
            let b = fs::read(d.join("f")).unwrap();
            format!("ok:{}:{}", b.len(), b[..1_000_000].iter().all(|&x| x == 0))
        }),
        ("append_writes_at_end", |d| {
            fs::write(d.join("f"), b"abc").unwrap();
            let mut f = OpenOptions::new().append(true).open(d.join("f")).unwrap();
            f.write_all(b"de").unwrap();
            let mut g = OpenOptions::new().append(true).open(d.join("f")).unwrap();
            g.write_all(b"fg").unwrap();
            f.write_all(b"hi").unwrap();
            drop((f, g));
            format!("ok:{}", fs::read_to_string(d.join("f")).unwrap())
        }),
        ("lseek_end_and_size_while_open", |d| {
            let mut f = File::create(d.join("f")).unwrap();
            f.write_all(&[1u8; 70_000]).unwrap();
            let end = f.seek(SeekFrom::End(0)).unwrap();
            let len = fs::metadata(d.join("f")).unwrap().len();
            format!("ok:{end}:{len}")
        }),
        ("read_write_same_fd", |d| {
            let mut f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(d.join("f"))
                .unwrap();
            f.write_all(b"hello world").unwrap();
            f.seek(SeekFrom::Start(6)).unwrap();
            let mut s = String::new();
            f.read_to_string(&mut s).unwrap();
            format!("ok:{s}")
        }),
        ("fsync_and_fdatasync", |d| {
            let f = File::create(d.join("f")).unwrap();
            format!("{}:{}", res(f.sync_all()), res(f.sync_data()))
        }),
        ("read_dir_as_file", |d| {
            fs::create_dir(d.join("x")).unwrap();
            let mut f = File::open(d.join("x")).unwrap();
            let mut b = [0u8; 4];
            res(f.read(&mut b))
        }),
        ("setxattr_user", |d| {
            touch(&d.join("f"));
            let n = CString::new("user.test").unwrap();
            // SAFETY: valid path, name and a 1-byte value.
            rc(unsafe {
                libc::lsetxattr(
                    cs(&d.join("f")).as_ptr(),
                    n.as_ptr(),
                    b"v".as_ptr().cast(),
                    1,
                    0,
                )
            })
        }),
        ("statfs_answers", |d| {
            // SAFETY: statvfs is plain data filled by the call.
            let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
            // SAFETY: valid path and out pointer.
            let r = rc(unsafe { libc::statvfs(cs(d).as_ptr(), &mut s) });
            format!("{r}:{}", s.f_namemax)
        }),
    ]
}

fn run_all(base: &Path) -> Vec<(&'static str, String)> {
    cases()
        .into_iter()
        .map(|(name, f)| {
            let d = base.join(name);
            fs::create_dir(&d).unwrap();
            let out = std::panic::catch_unwind(|| f(&d)).unwrap_or_else(|_| "PANIC".to_string());
            (name, out)
        })
        .collect()
}

/// Does this kernel offer FUSE over io_uring (`fuse.enable_uring=1`)?
fn kernel_offers_io_uring() -> bool {
    fs::read_to_string("/sys/module/fuse/parameters/enable_uring").is_ok_and(|v| v.trim() == "Y")
}

/// Threads the pool's servers run for CPU lanes.
fn lanes_of(pool: &chfs_localpool::LocalPool) -> usize {
    (0..pool.addrs().len())
        .filter_map(|i| pool.pid(i))
        .flat_map(|pid| {
            fs::read_dir(format!("/proc/{pid}/task"))
                .into_iter()
                .flatten()
        })
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|n| n.starts_with("chfsd-lane"))
        .count()
}

/// Chunk writes the pool's servers copied from shared-memory windows.
fn shm_writes(pool: &chfs_localpool::LocalPool) -> u64 {
    let admin = chfs_client::Client::connect(chfs_client::ClientConfig {
        servers: pool.addrs().to_vec(),
        ..Default::default()
    })
    .unwrap();
    admin
        .server_status()
        .into_iter()
        .map(|(_, s)| s.unwrap().shm_writes)
        .sum()
}

/// The transport chfuse reported when it mounted.
fn transport(m: &Mount) -> String {
    let log = fs::read_to_string(&m.log).unwrap_or_default();
    let line = log.lines().find(|l| l.contains("mounted")).unwrap_or("");
    line.split("transport=")
        .nth(1)
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or("")
        .trim_matches('"')
        .to_string()
}

#[test]
fn posix_suite_mount_vs_tmpfs() {
    // Default: FUSE over io_uring where the kernel offers it (setup.sh
    // enables it), else /dev/fuse.
    let want = if kernel_offers_io_uring() {
        "io_uring"
    } else {
        chfs_localpool::skip(
            "uring",
            "posix_suite_mount_vs_tmpfs over io_uring",
            "this kernel does not offer FUSE over io_uring: testing /dev/fuse only",
        );
        "/dev/fuse"
    };
    posix_suite(&[], want);
}

#[test]
fn cpu_lanes_can_be_turned_off() {
    let pool = pool(2);
    let m = Mount::new(&pool, &["--cpu-lanes=false"]);
    fs::write(m.mp.join("f"), b"shared connections").unwrap();
    assert_eq!(fs::read(m.mp.join("f")).unwrap(), b"shared connections");
    if transport(&m) != "io_uring" {
        eprintln!("no FUSE over io_uring here: the ring threads this is about do not run");
    }
    assert_eq!(lanes_of(&pool), 0, "lane threads with --cpu-lanes=false");
}

#[test]
fn restarted_servers_are_told_about_the_ring_buffers_again() {
    let mut pool = pool(2);
    let m = Mount::new(&pool, &[]);
    if transport(&m) != "io_uring" {
        chfs_localpool::skip(
            "uring",
            "restarted_servers_are_told_about_the_ring_buffers_again",
            "no FUSE over io_uring here: chfuse's ring buffers are not in use",
        );
        return;
    }
    let data = pattern(1 << 20, 8);
    fs::write(m.p("before"), &data).unwrap();
    assert!(shm_writes(&pool) > 0);
    // New servers (DRAM: empty) on the same addresses; the mount's
    // connections break and are opened again, each offered the window.
    pool.restart_all().unwrap();
    let mut ok = false;
    for _ in 0..50 {
        if fs::write(m.p("after"), &data).is_ok() {
            ok = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(ok, "the mount did not reach the restarted servers");
    assert_eq!(fs::read(m.p("after")).unwrap(), data);
    assert!(
        shm_writes(&pool) > 0,
        "restarted servers copied nothing from the ring buffers"
    );
}

#[test]
fn posix_suite_over_dev_fuse() {
    posix_suite(&["--io-uring=false"], "/dev/fuse");
}

/// The suite through a pool whose servers speak libfabric's tcp provider
/// (chfsd -p ofi+tcp): the mount reaches them over the fabric.
#[test]
fn posix_suite_over_ofi_tcp() {
    if !chfs_fabric::BUILT_WITH_LIBFABRIC {
        chfs_localpool::skip(
            "fabric",
            "posix_suite_over_ofi_tcp",
            "built without libfabric",
        );
        return;
    }
    posix_suite_on(&["--io-uring=false"], "/dev/fuse", Some("ofi+tcp"));
}

fn posix_suite(args: &[&str], want_transport: &str) {
    posix_suite_on(args, want_transport, None)
}

fn posix_suite_on(args: &[&str], want_transport: &str, protocol: Option<&str>) {
    // SAFETY: umask only sets the process file-creation mask.
    unsafe { libc::umask(0o022) };
    let tmpfs = tempfile::tempdir_in("/dev/shm").expect("tmpfs directory");
    let pool = match protocol {
        None => pool(3),
        Some(p) => chfs_localpool::LocalPool::start_with(chfs_localpool::PoolOptions {
            servers: 3,
            args: vec!["-p".into(), p.into()],
            ..Default::default()
        })
        .expect("start chfsd pool"),
    };
    if let Some(p) = protocol {
        assert!(
            pool.server_string().starts_with(p),
            "{}",
            pool.server_string()
        );
    }
    let m = Mount::new(&pool, args);
    assert_eq!(transport(&m), want_transport, "chfuse {args:?}");
    let want = run_all(tmpfs.path());
    let got = run_all(&m.mp);
    // Over io_uring the ring threads' requests went through CPU lanes.
    assert_eq!(
        lanes_of(&pool) > 0,
        want_transport == "io_uring",
        "chfuse {args:?}: {} lane threads in the servers",
        lanes_of(&pool)
    );
    // And the data of large writes, which the kernel copied into the ring
    // buffers, was copied by the servers from their mapping of those.
    let data = pattern(1 << 20, 5);
    let before = shm_writes(&pool);
    fs::write(m.mp.join("shm"), &data).unwrap();
    let copied = shm_writes(&pool) - before;
    assert_eq!(fs::read(m.mp.join("shm")).unwrap(), data);
    assert_eq!(
        copied > 0,
        want_transport == "io_uring",
        "chfuse {args:?}: {copied} chunk writes from the ring buffers"
    );
    let semantics = fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../SEMANTICS.md"))
        .unwrap_or_default();
    let mut report = String::new();
    let mut unexpected = Vec::new();
    let mut same = 0;
    for ((name, w), (_, g)) in want.iter().zip(&got) {
        if w == g {
            same += 1;
            continue;
        }
        let known = KNOWN.contains(name);
        report.push_str(&format!(
            "{} {name}: tmpfs {w:?}, mount {g:?}\n",
            if known { "KNOWN     " } else { "UNEXPECTED" }
        ));
        if !known {
            unexpected.push(*name);
        }
    }
    println!(
        "POSIX suite over {want_transport}: {} cases, {same} identical on the mount and tmpfs\n{report}",
        want.len()
    );
    assert!(
        unexpected.is_empty(),
        "unexpected differences: {unexpected:?}\n{report}"
    );
    for k in KNOWN {
        assert!(
            semantics.contains(&format!("`{k}`")),
            "SEMANTICS.md must explain the known difference `{k}`"
        );
        let differs = want
            .iter()
            .zip(&got)
            .any(|((n, w), (_, g))| n == k && w != g);
        assert!(
            differs,
            "`{k}` is listed as a difference but now matches tmpfs: update KNOWN and SEMANTICS.md"
        );
    }
}
