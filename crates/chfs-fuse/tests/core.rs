//! The file system core driven directly, without a mount (no /dev/fuse, no
//! kernel): a real local pool of chfsd processes and a [`Core`] over a
//! client of it, called the way the transports call it for kernel
//! requests. Checks attributes, handles, the inode table and errnos.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use chfs_client::{Client, ClientConfig};
use chfs_fuse::core::{
    Attr, Caller, Core, Error, Fh, FileKind, FsOptions, Ino, Result, SetAttr, TimeSet,
};
use chfs_localpool::LocalPool;

/// A core over a fresh pool; the core goes first at drop.
struct Fs {
    core: Core,
    pool: LocalPool,
}

impl std::ops::Deref for Fs {
    type Target = Core;
    fn deref(&self) -> &Core {
        &self.core
    }
}

fn client(pool: &LocalPool) -> Client {
    Client::connect(ClientConfig {
        servers: vec![pool.addrs()[0].clone()],
        rpc_timeout: Duration::from_secs(10),
        ..Default::default()
    })
    .expect("connect client")
}

fn fs_with(opts: FsOptions) -> Fs {
    let pool =
        LocalPool::start(2).expect("start chfsd pool (build it first: cargo build -p chfs-server)");
    Fs {
        core: Core::new(client(&pool), opts),
        pool,
    }
}

fn fs() -> Fs {
    fs_with(FsOptions::default())
}

/// The test process as the requesting user.
fn me() -> Caller {
    // SAFETY: these calls cannot fail and touch no memory.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    Caller {
        uid,
        gid,
        pid: std::process::id(),
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

/// The errno of a failed call.
#[track_caller]
fn errno<T: std::fmt::Debug>(r: Result<T>) -> i32 {
    r.expect_err("the call should have failed").errno()
}

/// Creates `name` in `parent` with `data`, closed again.
fn put(fs: &Fs, parent: Ino, name: &str, data: &[u8]) -> Attr {
    let (a, o) = fs
        .create(me(), parent, n(name), 0o644, libc::O_WRONLY)
        .unwrap();
    assert_eq!(fs.write(o.fh, 0, data).unwrap(), data.len());
    fs.flush(o.fh).unwrap();
    fs.release(o.fh).unwrap();
    a
}

/// The whole content of file `ino`, read through a fresh handle.
fn content(fs: &Fs, ino: Ino) -> Vec<u8> {
    let o = fs.open(ino, libc::O_RDONLY).unwrap();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 7];
    loop {
        let got = fs.read(o.fh, out.len() as u64, &mut buf).unwrap();
        if got == 0 {
            break;
        }
        out.extend_from_slice(&buf[..got]);
    }
    fs.release(o.fh).unwrap();
    out
}

/// One listing entry.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Ent {
    name: String,
    ino: Ino,
    next: u64,
    kind: FileKind,
}

/// Lists open directory `fh` of `dir` from `offset`, taking at most `max`
/// entries (the reply is "full" at the next one, as a kernel buffer is).
fn list_from(fs: &Fs, dir: Ino, fh: Fh, offset: u64, max: usize) -> Result<Vec<Ent>> {
    let mut v = Vec::new();
    fs.readdir(dir, fh, offset, |ino, next, kind, name| {
        if v.len() == max {
            return true;
        }
        v.push(Ent {
            name: name.to_string(),
            ino,
            next,
            kind,
        });
        false
    })?;
    Ok(v)
}

/// The whole listing of `dir`, through its own handle.
fn list(fs: &Fs, dir: Ino) -> Vec<Ent> {
    let fh = fs.opendir();
    let v = list_from(fs, dir, fh, 0, usize::MAX).unwrap();
    fs.releasedir(fh);
    v
}

fn names(v: &[Ent]) -> Vec<&str> {
    let mut v: Vec<&str> = v.iter().map(|e| e.name.as_str()).collect();
    v.sort_unstable();
    v
}

#[test]
fn create_write_read_getattr_and_lookup() {
    let fs = fs();
    assert_eq!(errno(fs.lookup(Ino::ROOT, n("f"))), libc::ENOENT);

    let (a, o) = fs
        .create(me(), Ino::ROOT, n("f"), 0o640, libc::O_RDWR)
        .unwrap();
    assert_eq!(a.kind, FileKind::RegularFile);
    assert_eq!(a.perm, 0o640);
    assert_eq!(a.mode(), libc::S_IFREG | 0o640);
    assert_eq!((a.size, a.nlink), (0, 1));
    assert_eq!((a.uid, a.gid), (me().uid, me().gid));
    assert_ne!(a.ino, Ino::ROOT);
    // Default options: direct I/O, and (no client buffer) writes publish
    // the size as they go, so close(2) needs no flush round trip.
    assert!(o.direct_io && o.noflush, "{o:?}");

    assert_eq!(fs.write(o.fh, 0, b"hello world").unwrap(), 11);
    let mut buf = [0u8; 64];
    let got = fs.read(o.fh, 0, &mut buf).unwrap();
    assert_eq!(&buf[..got], b"hello world");
    let got = fs.read(o.fh, 6, &mut buf).unwrap();
    assert_eq!(&buf[..got], b"world");
    assert_eq!(fs.read(o.fh, 11, &mut buf).unwrap(), 0);
    assert_eq!(fs.write(o.fh, 11, b"!").unwrap(), 1);
    fs.fsync(o.fh).unwrap();

    let (ttl, g) = fs.getattr(a.ino).unwrap();
    assert_eq!(ttl, FsOptions::default().attr_timeout);
    assert_eq!(g.ino, a.ino);
    assert_eq!(g.size, 12);
    assert!(g.mtime > 0 && g.ctime > 0, "{g:?}");
    // A lookup of the same name finds the same inode number.
    let l = fs.lookup(Ino::ROOT, n("f")).unwrap();
    assert_eq!((l.ino, l.size, l.kind), (a.ino, 12, FileKind::RegularFile));

    assert_eq!(
        errno(fs.create(me(), Ino::ROOT, n("f"), 0o644, libc::O_RDWR | libc::O_EXCL)),
        libc::EEXIST
    );
    fs.release(o.fh).unwrap();
    // The handle is gone: every use of it is EBADF.
    assert_eq!(errno(fs.release(o.fh)), libc::EBADF);
    assert_eq!(errno(fs.read(o.fh, 0, &mut buf)), libc::EBADF);
    assert_eq!(errno(fs.write(o.fh, 0, b"x")), libc::EBADF);
    assert_eq!(errno(fs.flush(o.fh)), libc::EBADF);
    assert_eq!(errno(fs.fsync(o.fh)), libc::EBADF);
    assert_eq!(content(&fs, a.ino), b"hello world!");

    // A read-only open needs no flush at close(2).
    let r = fs.open(a.ino, libc::O_RDONLY).unwrap();
    assert!(r.noflush);
    assert_ne!(r.fh, o.fh);
    fs.release(r.fh).unwrap();
    // O_TRUNC empties it.
    let t = fs.open(a.ino, libc::O_WRONLY | libc::O_TRUNC).unwrap();
    fs.release(t.fh).unwrap();
    assert_eq!(fs.getattr(a.ino).unwrap().1.size, 0);
}

#[test]
fn names_and_inodes_are_checked() {
    let fs = fs();
    let long = "x".repeat(256);
    assert_eq!(errno(fs.lookup(Ino::ROOT, n(&long))), libc::ENAMETOOLONG);
    assert_eq!(
        errno(fs.mkdir(me(), Ino::ROOT, n(&long), 0o755)),
        libc::ENAMETOOLONG
    );
    let ok = "y".repeat(255);
    put(&fs, Ino::ROOT, &ok, b"");
    let bad = OsStr::from_bytes(b"a\xff");
    assert_eq!(errno(fs.lookup(Ino::ROOT, bad)), libc::EILSEQ);
    assert_eq!(
        errno(fs.create(me(), Ino::ROOT, bad, 0o644, libc::O_RDWR)),
        libc::EILSEQ
    );
    // Inode numbers the kernel was never given.
    let unknown = Ino(0xdead_beef);
    assert_eq!(errno(fs.getattr(unknown)), libc::ENOENT);
    assert_eq!(errno(fs.lookup(unknown, n("x"))), libc::ENOENT);
    assert_eq!(errno(fs.open(unknown, libc::O_RDONLY)), libc::ENOENT);
    assert_eq!(errno(fs.setattr(unknown, SetAttr::default())), libc::ENOENT);
    assert_eq!(errno(fs.readlink(unknown)), libc::ENOENT);
    assert_eq!(errno(fs.access(me(), unknown, libc::F_OK)), libc::ENOENT);
    // Unsupported: hard links, rename flags other than NOREPLACE.
    let a = put(&fs, Ino::ROOT, "f", b"x");
    assert_eq!(errno(fs.link(a.ino, Ino::ROOT, n("g"))), libc::EPERM);
    assert_eq!(
        errno(fs.rename(Ino::ROOT, n("f"), Ino::ROOT, n("g"), libc::RENAME_EXCHANGE)),
        libc::EINVAL
    );
    // Errors carry their errno and say what it is.
    let e = Error::from_errno(libc::ENOTEMPTY);
    assert_eq!(e.errno(), libc::ENOTEMPTY);
    assert!(e.to_string().contains("ENOTEMPTY"), "{e}");
    assert_eq!(
        std::io::Error::from(e).raw_os_error(),
        Some(libc::ENOTEMPTY)
    );
}

#[test]
fn setattr_truncates_chmods_and_sets_times() {
    let fs = fs();
    let data: Vec<u8> = (0..100u8).collect();
    let a = put(&fs, Ino::ROOT, "f", &data);

    let t = fs
        .setattr(
            a.ino,
            SetAttr {
                size: Some(10),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((t.ino, t.size), (a.ino, 10));
    assert_eq!(content(&fs, a.ino), &data[..10]);

    // ftruncate through an open handle, and growing with zeros.
    let o = fs.open(a.ino, libc::O_RDWR).unwrap();
    let t = fs
        .setattr(
            a.ino,
            SetAttr {
                size: Some(4),
                fh: Some(o.fh),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(t.size, 4);
    let t = fs
        .setattr(
            a.ino,
            SetAttr {
                size: Some(6),
                fh: Some(o.fh),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(t.size, 6);
    fs.release(o.fh).unwrap();
    assert_eq!(content(&fs, a.ino), [0, 1, 2, 3, 0, 0]);

    let m = fs
        .setattr(
            a.ino,
            SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((m.kind, m.perm, m.size), (FileKind::RegularFile, 0o600, 6));
    assert_eq!(fs.getattr(a.ino).unwrap().1.perm, 0o600);

    let when = 1_000_000_000_123_456_789;
    let tm = fs
        .setattr(
            a.ino,
            SetAttr {
                atime: TimeSet::At(when - 5),
                mtime: TimeSet::At(when),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((tm.atime, tm.mtime), (when - 5, when));
    // Before the epoch too.
    let tm = fs
        .setattr(
            a.ino,
            SetAttr {
                mtime: TimeSet::At(-1_500_000_000),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(tm.mtime, -1_500_000_000);
    let now = fs
        .setattr(
            a.ino,
            SetAttr {
                mtime: TimeSet::Now,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(now.mtime > when, "{now:?}");
    // Nothing to change: the current attributes.
    let same = fs.setattr(a.ino, SetAttr::default()).unwrap();
    assert_eq!((same.size, same.perm, same.mtime), (6, 0o600, now.mtime));

    // A directory cannot be truncated.
    let d = fs.mkdir(me(), Ino::ROOT, n("d"), 0o755).unwrap();
    let r = fs.setattr(
        d.ino,
        SetAttr {
            size: Some(0),
            ..Default::default()
        },
    );
    assert_eq!(errno(r), libc::EISDIR);
    let dm = fs
        .setattr(
            d.ino,
            SetAttr {
                mode: Some(0o700),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((dm.kind, dm.perm), (FileKind::Directory, 0o700));
}

#[test]
fn mkdir_rmdir_unlink_and_their_errnos() {
    let fs = fs();
    let d = fs.mkdir(me(), Ino::ROOT, n("d"), 0o750).unwrap();
    assert_eq!((d.kind, d.perm), (FileKind::Directory, 0o750));
    assert_eq!(d.mode(), libc::S_IFDIR | 0o750);
    assert_eq!(
        errno(fs.mkdir(me(), Ino::ROOT, n("d"), 0o755)),
        libc::EEXIST
    );
    let f = put(&fs, d.ino, "f", b"abc");
    assert_eq!(
        errno(fs.mkdir(me(), Ino::ROOT, n("d"), 0o755)),
        libc::EEXIST
    );
    assert_eq!(errno(fs.rmdir(Ino::ROOT, n("d"))), libc::ENOTEMPTY);
    assert_eq!(errno(fs.lookup(d.ino, n("missing"))), libc::ENOENT);
    // A file is not a directory, and a directory is not a file.
    assert_eq!(errno(fs.rmdir(d.ino, n("f"))), libc::ENOTDIR);
    assert_eq!(errno(fs.unlink(Ino::ROOT, n("d"))), libc::EISDIR);
    assert_eq!(errno(fs.open(d.ino, libc::O_WRONLY)), libc::EISDIR);
    assert_eq!(errno(fs.mkdir(me(), f.ino, n("sub"), 0o755)), libc::ENOTDIR);
    assert_eq!(errno(fs.unlink(d.ino, n("missing"))), libc::ENOENT);
    assert_eq!(errno(fs.rmdir(Ino::ROOT, n("missing"))), libc::ENOENT);

    fs.unlink(d.ino, n("f")).unwrap();
    assert_eq!(errno(fs.lookup(d.ino, n("f"))), libc::ENOENT);
    fs.rmdir(Ino::ROOT, n("d")).unwrap();
    assert_eq!(errno(fs.lookup(Ino::ROOT, n("d"))), libc::ENOENT);
    // The name is free again.
    let again = fs.mkdir(me(), Ino::ROOT, n("d"), 0o755).unwrap();
    assert_eq!(again.perm, 0o755);

    // mknod of a FIFO.
    let p = fs
        .mknod(me(), Ino::ROOT, n("p"), libc::S_IFIFO | 0o644, 0)
        .unwrap();
    assert_eq!((p.kind, p.perm), (FileKind::NamedPipe, 0o644));
    assert_eq!(
        errno(fs.mknod(me(), Ino::ROOT, n("p"), libc::S_IFIFO | 0o644, 0)),
        libc::EEXIST
    );
}

#[test]
fn readdir_lists_from_offsets_and_keeps_its_snapshot() {
    let fs = fs();
    let d = fs.mkdir(me(), Ino::ROOT, n("d"), 0o755).unwrap();
    let mut want = HashSet::new();
    for i in 0..6 {
        let a = put(&fs, d.ino, &format!("f{i}"), b"");
        want.insert((format!("f{i}"), a.ino));
    }
    let sub = fs.mkdir(me(), d.ino, n("sub"), 0o755).unwrap();
    fs.symlink(me(), d.ino, n("l"), n("f0")).unwrap();

    let all = list(&fs, d.ino);
    assert_eq!(all.len(), 2 + 6 + 2, "{all:?}");
    assert_eq!((all[0].name.as_str(), all[0].ino), (".", d.ino));
    assert_eq!((all[1].name.as_str(), all[1].ino), ("..", Ino::ROOT));
    for (i, e) in all.iter().enumerate() {
        // The offset of an entry is where the next listing resumes.
        assert_eq!(e.next, i as u64 + 1);
    }
    for e in &all[2..] {
        let kind = match e.name.as_str() {
            "sub" => {
                assert_eq!(e.ino, sub.ino);
                FileKind::Directory
            }
            "l" => FileKind::Symlink,
            _ => {
                // Names the kernel knows list with the kernel's inodes.
                assert!(want.contains(&(e.name.clone(), e.ino)), "{e:?}");
                FileKind::RegularFile
            }
        };
        assert_eq!(e.kind, kind, "{e:?}");
    }

    // A reply that fills up after 4 entries; the kernel asks again from
    // the offset of the last one it got.
    let fh = fs.opendir();
    let first = list_from(&fs, d.ino, fh, 0, 4).unwrap();
    assert_eq!(first, all[..4]);
    // Changes after the listing started do not shift the offsets.
    put(&fs, d.ino, "new", b"");
    fs.unlink(d.ino, n("f5")).unwrap();
    let rest = list_from(&fs, d.ino, fh, first[3].next, usize::MAX).unwrap();
    assert_eq!(rest, all[4..]);
    // Past the end: nothing.
    let end = list_from(&fs, d.ino, fh, all.len() as u64, usize::MAX).unwrap();
    assert!(end.is_empty());
    // Offset 0 reads the directory again.
    let again = list_from(&fs, d.ino, fh, 0, usize::MAX).unwrap();
    let got = names(&again);
    assert!(got.contains(&"new") && !got.contains(&"f5"), "{got:?}");
    fs.releasedir(fh);
    assert_eq!(errno(list_from(&fs, d.ino, fh, 0, 10)), libc::EBADF);

    // A file handle is not a directory handle, and the reverse.
    let o = fs.open(sub.ino, libc::O_RDONLY).unwrap();
    assert_eq!(errno(list_from(&fs, sub.ino, o.fh, 0, 10)), libc::EBADF);
    fs.release(o.fh).unwrap();
    let dh = fs.opendir();
    assert_eq!(errno(fs.release(dh)), libc::EBADF);
    // Listing a file fails.
    let f0 = fs.lookup(d.ino, n("f0")).unwrap();
    let fh = fs.opendir();
    assert_eq!(errno(list_from(&fs, f0.ino, fh, 0, 10)), libc::ENOTDIR);
    fs.releasedir(fh);

    // The root lists itself as its parent.
    let root = list(&fs, Ino::ROOT);
    assert_eq!((root[1].name.as_str(), root[1].ino), ("..", Ino::ROOT));
    assert_eq!(names(&root), [".", "..", "d"]);
}

#[test]
fn rename_keeps_open_files_and_their_inodes() {
    let fs = fs();
    let a = fs.mkdir(me(), Ino::ROOT, n("a"), 0o755).unwrap();
    let (f, fo) = fs.create(me(), a.ino, n("f"), 0o644, libc::O_RDWR).unwrap();
    fs.write(fo.fh, 0, b"one").unwrap();

    // A file moves to another directory while open.
    fs.rename(a.ino, n("f"), Ino::ROOT, n("g"), 0).unwrap();
    assert_eq!(errno(fs.lookup(a.ino, n("f"))), libc::ENOENT);
    let g = fs.lookup(Ino::ROOT, n("g")).unwrap();
    assert_eq!(g.ino, f.ino, "the inode number follows the file");
    assert_eq!(fs.getattr(f.ino).unwrap().1.size, 3);
    // Its open handle now writes to the new name.
    fs.write(fo.fh, 3, b"two").unwrap();
    fs.flush(fo.fh).unwrap();
    assert_eq!(content(&fs, g.ino), b"onetwo");

    // A directory moves with an open file below it.
    let (h, ho) = fs
        .create(me(), a.ino, n("h"), 0o644, libc::O_WRONLY)
        .unwrap();
    fs.rename(Ino::ROOT, n("a"), Ino::ROOT, n("b"), 0).unwrap();
    assert_eq!(errno(fs.lookup(Ino::ROOT, n("a"))), libc::ENOENT);
    let b = fs.lookup(Ino::ROOT, n("b")).unwrap();
    assert_eq!(b.ino, a.ino);
    assert_eq!(fs.lookup(b.ino, n("h")).unwrap().ino, h.ino);
    assert_eq!(fs.getattr(h.ino).unwrap().1.kind, FileKind::RegularFile);
    fs.write(ho.fh, 0, b"below").unwrap();
    fs.release(ho.fh).unwrap();
    assert_eq!(content(&fs, h.ino), b"below");
    let listed = list(&fs, b.ino);
    assert!(
        listed.iter().any(|e| e.name == "h" && e.ino == h.ino),
        "{listed:?}"
    );

    // Replacing an existing file: the victim's name now is the mover's.
    let k = put(&fs, Ino::ROOT, "k", b"victim");
    fs.rename(Ino::ROOT, n("g"), Ino::ROOT, n("k"), 0).unwrap();
    let k2 = fs.lookup(Ino::ROOT, n("k")).unwrap();
    assert_eq!(k2.ino, f.ino);
    assert_ne!(k2.ino, k.ino);
    assert_eq!(content(&fs, k2.ino), b"onetwo");
    fs.write(fo.fh, 6, b"3").unwrap();
    fs.release(fo.fh).unwrap();
    assert_eq!(content(&fs, f.ino), b"onetwo3");

    // Errnos.
    put(&fs, Ino::ROOT, "x", b"");
    assert_eq!(
        errno(fs.rename(Ino::ROOT, n("x"), Ino::ROOT, n("k"), libc::RENAME_NOREPLACE)),
        libc::EEXIST
    );
    fs.rename(Ino::ROOT, n("x"), Ino::ROOT, n("y"), libc::RENAME_NOREPLACE)
        .unwrap();
    assert_eq!(
        errno(fs.rename(Ino::ROOT, n("missing"), Ino::ROOT, n("z"), 0)),
        libc::ENOENT
    );
    assert_eq!(
        errno(fs.rename(Ino::ROOT, n("y"), Ino::ROOT, n("b"), 0)),
        libc::EISDIR
    );
    fs.mkdir(me(), Ino::ROOT, n("e"), 0o755).unwrap();
    assert_eq!(
        errno(fs.rename(Ino::ROOT, n("e"), Ino::ROOT, n("y"), 0)),
        libc::ENOTDIR
    );
    assert_eq!(
        errno(fs.rename(Ino::ROOT, n("e"), Ino::ROOT, n("b"), 0)),
        libc::ENOTEMPTY
    );
    // Onto itself: nothing changes.
    fs.rename(Ino::ROOT, n("y"), Ino::ROOT, n("y"), 0).unwrap();
    assert!(fs.lookup(Ino::ROOT, n("y")).is_ok());
}

#[test]
fn an_unlinked_open_file_lives_until_its_last_release() {
    let fs = fs();
    let (a, o1) = fs
        .create(me(), Ino::ROOT, n("f"), 0o644, libc::O_RDWR)
        .unwrap();
    fs.write(o1.fh, 0, b"data").unwrap();
    let o2 = fs.open(a.ino, libc::O_RDONLY).unwrap();

    fs.unlink(Ino::ROOT, n("f")).unwrap();
    assert_eq!(errno(fs.lookup(Ino::ROOT, n("f"))), libc::ENOENT);
    // The name is free: a new file may take it.
    let other = put(&fs, Ino::ROOT, "f", b"new file");
    assert_ne!(other.ino, a.ino);
    // Both handles still work, on the old file.
    let mut buf = [0u8; 16];
    let got = fs.read(o2.fh, 0, &mut buf).unwrap();
    assert_eq!(&buf[..got], b"data");
    fs.write(o1.fh, 4, b"+more").unwrap();
    let got = fs.read(o2.fh, 0, &mut buf).unwrap();
    assert_eq!(&buf[..got], b"data+more");
    assert_eq!(fs.getattr(a.ino).unwrap().1.size, 9);
    // Meanwhile it is kept under a hidden name (as libfuse does).
    let hidden = |fs: &Fs| {
        list(fs, Ino::ROOT)
            .into_iter()
            .filter(|e| e.name.starts_with(".chfuse_hidden_"))
            .count()
    };
    assert_eq!(hidden(&fs), 1);

    fs.release(o1.fh).unwrap();
    assert_eq!(hidden(&fs), 1, "still open through the second handle");
    fs.release(o2.fh).unwrap();
    assert_eq!(hidden(&fs), 0, "removed at the last release");
    assert_eq!(content(&fs, other.ino), b"new file");
    assert_eq!(names(&list(&fs, Ino::ROOT)), [".", "..", "f"]);

    // Unlinking a closed file removes it at once.
    fs.unlink(Ino::ROOT, n("f")).unwrap();
    assert_eq!(names(&list(&fs, Ino::ROOT)), [".", ".."]);
    assert_eq!(errno(fs.unlink(Ino::ROOT, n("f"))), libc::ENOENT);
}

#[test]
fn symlinks_and_readlink() {
    let fs = fs();
    let l = fs
        .symlink(me(), Ino::ROOT, n("l"), n("../some/where"))
        .unwrap();
    assert_eq!(l.kind, FileKind::Symlink);
    assert_eq!(l.size, "../some/where".len() as u64);
    assert_eq!(fs.readlink(l.ino).unwrap(), "../some/where");
    let again = fs.lookup(Ino::ROOT, n("l")).unwrap();
    assert_eq!((again.ino, again.kind), (l.ino, FileKind::Symlink));
    assert_eq!(
        errno(fs.symlink(me(), Ino::ROOT, n("l"), n("x"))),
        libc::EEXIST
    );
    let f = put(&fs, Ino::ROOT, "f", b"12345");
    assert_eq!(errno(fs.readlink(f.ino)), libc::EINVAL);
    let bad = OsStr::from_bytes(b"t\xfe");
    assert_eq!(
        errno(fs.symlink(me(), Ino::ROOT, n("m"), bad)),
        libc::EILSEQ
    );
    // Opening a link opens its target.
    let to_f = fs.symlink(me(), Ino::ROOT, n("to_f"), n("f")).unwrap();
    assert_eq!(content(&fs, to_f.ino), b"12345");
}

#[test]
fn statfs_reports_the_pool() {
    let fs = fs();
    let s = fs.statfs().unwrap();
    assert_eq!(s.bsize, 4096);
    assert_eq!(s.namelen, 255);
    assert!(s.blocks > 0 && s.free <= s.blocks, "{s:?}");
    assert!(s.files >= s.free, "{s:?}");
    put(&fs, Ino::ROOT, "f", &vec![7u8; 1 << 20]);
    // 1 MiB more in use (256 blocks), in more entries (chunks). (Free
    // space, and so the free file count, of a store bounded only by memory
    // follows the host's available memory, which other tests change.)
    let after = fs.statfs().unwrap();
    let used = |s: &chfs_fuse::core::FsStat| s.blocks - s.free;
    let entries = |s: &chfs_fuse::core::FsStat| s.files - s.free;
    assert!(used(&after) >= used(&s) + 256, "{s:?} -> {after:?}");
    assert!(entries(&after) > entries(&s), "{s:?} -> {after:?}");
}

#[test]
fn forget_frees_inode_numbers_but_not_the_root() {
    let fs = fs();
    // create counts one kernel reference, each lookup one more.
    let a = put(&fs, Ino::ROOT, "f", b"x");
    assert_eq!(fs.lookup(Ino::ROOT, n("f")).unwrap().ino, a.ino);
    fs.forget(a.ino, 1);
    assert_eq!(fs.getattr(a.ino).unwrap().1.ino, a.ino);
    fs.forget(a.ino, 1);
    assert_eq!(errno(fs.getattr(a.ino)), libc::ENOENT);
    assert_eq!(errno(fs.open(a.ino, libc::O_RDONLY)), libc::ENOENT);
    // The file itself is still there; a new lookup gives it a number.
    let b = fs.lookup(Ino::ROOT, n("f")).unwrap();
    assert_eq!(fs.getattr(b.ino).unwrap().1.size, 1);
    // Forgetting more than was looked up is harmless.
    fs.forget(b.ino, 10);
    fs.forget(b.ino, 1);
    assert_eq!(errno(fs.getattr(b.ino)), libc::ENOENT);
    // The root is never forgotten.
    fs.forget(Ino::ROOT, 1000);
    assert_eq!(fs.getattr(Ino::ROOT).unwrap().1.kind, FileKind::Directory);
    assert_eq!(fs.lookup(Ino::ROOT, n("f")).unwrap().size, 1);
    // Forgetting an unknown number is harmless too.
    fs.forget(Ino(0x1234_5678), 1);
}

#[test]
fn directory_attributes_are_served_from_the_cache_for_attr_timeout() {
    let fs = fs_with(FsOptions {
        attr_timeout: Duration::from_secs(600),
        ..Default::default()
    });
    let d = fs.mkdir(me(), Ino::ROOT, n("d"), 0o755).unwrap();
    let (ttl, a) = fs.getattr(d.ino).unwrap();
    assert_eq!(a.perm, 0o755);
    assert!(ttl <= Duration::from_secs(600));
    // Changed behind the core's back (another node): not seen yet.
    let other = client(&fs.pool);
    other
        .setattr(
            "/d",
            chfs_proto::msg::SetAttr {
                mode: Some(0o700),
                ..Default::default()
            },
        )
        .unwrap();
    let (ttl, cached) = fs.getattr(d.ino).unwrap();
    assert_eq!(cached.perm, 0o755);
    assert!(ttl < Duration::from_secs(600));
    // A change through the core drops the cached copy.
    let s = fs
        .setattr(
            d.ino,
            SetAttr {
                atime: TimeSet::Now,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(s.perm, 0o700);
    assert_eq!(fs.getattr(d.ino).unwrap().1.perm, 0o700);
    // Files are always asked for.
    let f = put(&fs, Ino::ROOT, "f", b"");
    fs.getattr(f.ino).unwrap();
    other
        .setattr(
            "/f",
            chfs_proto::msg::SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().1.perm, 0o600);
}

#[test]
fn open_modes_choose_the_kernel_caching() {
    // Page cache on: only appends bypass it.
    let fs = fs_with(FsOptions {
        direct_io: false,
        ..Default::default()
    });
    let a = put(&fs, Ino::ROOT, "f", b"abc");
    let r = fs.open(a.ino, libc::O_RDONLY).unwrap();
    assert!(!r.direct_io && r.noflush, "{r:?}");
    let w = fs.open(a.ino, libc::O_WRONLY).unwrap();
    assert!(!w.direct_io && !w.noflush, "{w:?}");
    let ap = fs.open(a.ino, libc::O_WRONLY | libc::O_APPEND).unwrap();
    assert!(ap.direct_io, "{ap:?}");
    // O_APPEND writes land at the end whatever the offset.
    fs.write(ap.fh, 0, b"def").unwrap();
    fs.flush(ap.fh).unwrap();
    for h in [r.fh, w.fh, ap.fh] {
        fs.release(h).unwrap();
    }
    assert_eq!(content(&fs, a.ino), b"abcdef");
    // O_SYNC handles sync every write.
    let s = fs.open(a.ino, libc::O_WRONLY | libc::O_SYNC).unwrap();
    fs.write(s.fh, 6, b"g").unwrap();
    fs.release(s.fh).unwrap();
    assert_eq!(content(&fs, a.ino), b"abcdefg");
}

#[test]
fn access_and_ownership_follow_the_caller() {
    let fs = fs();
    let a = fs
        .create(me(), Ino::ROOT, n("f"), 0o640, libc::O_WRONLY)
        .map(|(a, o)| {
            fs.release(o.fh).unwrap();
            a
        })
        .unwrap();
    fs.access(me(), a.ino, libc::R_OK | libc::W_OK).unwrap();
    fs.access(me(), a.ino, libc::F_OK).unwrap();
    let stranger = Caller {
        uid: 54321,
        gid: 54321,
        pid: 1,
    };
    if me().uid != 0 {
        assert_eq!(errno(fs.access(me(), a.ino, libc::X_OK)), libc::EACCES);
    }
    assert_eq!(errno(fs.access(stranger, a.ino, libc::R_OK)), libc::EACCES);
    fs.access(stranger, a.ino, libc::F_OK).unwrap();
    if !is_root() {
        chfs_localpool::skip(
            "root",
            "access_and_ownership_follow_the_caller (creating for another user)",
            "needs root",
        );
        return;
    }
    // Root creates on behalf of the caller: new entries are theirs.
    let d = fs.mkdir(stranger, Ino::ROOT, n("theirs"), 0o755).unwrap();
    assert_eq!((d.uid, d.gid), (54321, 54321));
    let (f, o) = fs
        .create(stranger, d.ino, n("f"), 0o600, libc::O_WRONLY)
        .unwrap();
    fs.release(o.fh).unwrap();
    assert_eq!((f.uid, f.gid), (54321, 54321));
    fs.access(stranger, f.ino, libc::R_OK | libc::W_OK).unwrap();
    let l = fs.symlink(stranger, d.ino, n("l"), n("f")).unwrap();
    assert_eq!(l.uid, 54321);
    // chown.
    let c = fs
        .setattr(
            f.ino,
            SetAttr {
                uid: Some(0),
                gid: Some(0),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((c.uid, c.gid), (0, 0));
    assert_eq!(errno(fs.access(stranger, f.ino, libc::R_OK)), libc::EACCES);
}

#[test]
fn a_core_is_shared_between_threads() {
    let fs = fs();
    let core = &fs.core;
    std::thread::scope(|s| {
        for t in 0..4 {
            s.spawn(move || {
                let d = core
                    .mkdir(me(), Ino::ROOT, n(&format!("t{t}")), 0o755)
                    .unwrap();
                for i in 0..20 {
                    let name = format!("f{i}");
                    let (a, o) = core
                        .create(me(), d.ino, n(&name), 0o644, libc::O_RDWR)
                        .unwrap();
                    let data = format!("{t}/{i}");
                    core.write(o.fh, 0, data.as_bytes()).unwrap();
                    let mut buf = [0u8; 16];
                    let got = core.read(o.fh, 0, &mut buf).unwrap();
                    assert_eq!(&buf[..got], data.as_bytes());
                    core.release(o.fh).unwrap();
                    assert_eq!(core.lookup(d.ino, n(&name)).unwrap().ino, a.ino);
                }
            });
        }
    });
    for t in 0..4 {
        let d = fs.lookup(Ino::ROOT, n(&format!("t{t}"))).unwrap();
        assert_eq!(list(&fs, d.ino).len(), 22);
    }
    fs.destroy();
}
