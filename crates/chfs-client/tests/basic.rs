//! Operations through a real pool of chfsd processes.

mod common;

use chfs_client::flags::*;
use chfs_client::{TimeSet, Whence};
use common::*;

#[test]
fn write_read_across_chunks_and_servers() {
    let (_p, c) = pool(3);
    c.set_chunk_size(4096).unwrap();
    let data = pattern(100_000, 1);
    let fd = c.create("/f", O_RDWR, 0o644).unwrap();
    assert_eq!(c.pwrite(fd, &data, 0).unwrap(), data.len());
    let mut back = vec![0u8; 200_000];
    assert_eq!(c.pread(fd, &mut back, 0).unwrap(), data.len());
    assert_eq!(&back[..data.len()], &data[..]);
    c.close(fd).unwrap();
    assert_eq!(c.stat("/f").unwrap().size, data.len() as u64);
    // A second client (its own connections) sees the published size.
    let c2 = client(&_p, |_| {});
    let fd = c2.open("/f", O_RDONLY, 0).unwrap();
    let mut back = vec![0u8; data.len()];
    assert_eq!(c2.pread(fd, &mut back, 0).unwrap(), data.len());
    assert_eq!(back, data);
    assert_eq!(c2.pread(fd, &mut back, data.len() as u64).unwrap(), 0);
    c2.close(fd).unwrap();
}

#[test]
fn holes_read_as_zeros() {
    let (_p, c) = pool(2);
    c.set_chunk_size(1000).unwrap();
    let fd = c.create("/h", O_RDWR, 0o644).unwrap();
    c.pwrite(fd, b"end", 10_000).unwrap();
    c.close(fd).unwrap();
    let fd = c.open("/h", O_RDONLY, 0).unwrap();
    let mut b = vec![1u8; 10_003];
    assert_eq!(c.pread(fd, &mut b, 0).unwrap(), 10_003);
    assert!(b[..10_000].iter().all(|&x| x == 0));
    assert_eq!(&b[10_000..], b"end");
}

#[test]
fn namespace_operations() {
    let (_p, c) = pool(3);
    c.mkdir("/d", 0o755).unwrap();
    assert_eq!(c.mkdir("/d", 0o755).unwrap_err().errno(), libc::EEXIST);
    assert_eq!(c.mkdir("/nope/x", 0o755).unwrap_err().errno(), libc::ENOENT);
    for i in 0..50 {
        let fd = c.create(&format!("/d/f{i}"), O_WRONLY, 0o600).unwrap();
        c.close(fd).unwrap();
    }
    assert_eq!(
        c.create("/d/f1/x", O_WRONLY, 0o600).unwrap_err().errno(),
        libc::ENOTDIR
    );
    let names: Vec<_> = c
        .readdir("/d")
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names.len(), 50);
    let per_server: usize = (0..3)
        .map(|i| c.readdir_index("/d", i).unwrap().len())
        .sum();
    assert_eq!(per_server, 50);
    assert_eq!(c.rmdir("/d").unwrap_err().errno(), libc::ENOTEMPTY);
    for i in 0..50 {
        c.unlink(&format!("/d/f{i}")).unwrap();
    }
    c.rmdir("/d").unwrap();
    assert_eq!(c.stat("/d").unwrap_err().errno(), libc::ENOENT);
    assert_eq!(c.unlink("/d").unwrap_err().errno(), libc::ENOENT);
}

#[test]
fn mkdir_all_is_mkdir_p() {
    let (p, c) = pool(3);
    let mode = |path: &str| c.stat(path).unwrap().mode;
    // Every missing level, the last with the mode asked, the ones above
    // it with u+wx added (so the next could be made in them).
    c.mkdir_all("/a/b/c/d", 0o500).unwrap();
    assert_eq!(mode("/a/b/c/d"), libc::S_IFDIR | 0o500);
    for d in ["/a", "/a/b", "/a/b/c"] {
        assert_eq!(mode(d), libc::S_IFDIR | 0o700, "{d}");
    }
    // Existing directories are fine, whole or in part; so is the root,
    // a path given unnormalised, and a symbolic link to a directory.
    c.mkdir_all("/a/b/c/d", 0o755).unwrap();
    assert_eq!(mode("/a/b/c/d"), libc::S_IFDIR | 0o500, "left as it was");
    c.mkdir_all("/a/b/x/y", 0o755).unwrap();
    assert!(c.stat("/a/b/x/y").unwrap().is_dir());
    c.mkdir_all("/", 0o755).unwrap();
    c.mkdir_all("//a/./b/../b/z/", 0o755).unwrap();
    assert!(c.stat("/a/b/z").unwrap().is_dir());
    c.symlink("/a/b", "/link").unwrap();
    c.mkdir_all("/link", 0o755).unwrap();
    // A file in the way: EEXIST as the directory itself, ENOTDIR above it;
    // nothing is made below it. A dangling link is EEXIST too.
    let fd = c.create("/a/file", O_WRONLY, 0o644).unwrap();
    c.close(fd).unwrap();
    assert_eq!(
        c.mkdir_all("/a/file", 0o755).unwrap_err().errno(),
        libc::EEXIST
    );
    assert_eq!(
        c.mkdir_all("/a/file/x/y", 0o755).unwrap_err().errno(),
        libc::ENOTDIR
    );
    assert!(c.stat("/a/file").unwrap().is_file());
    c.symlink("/nowhere", "/dangling").unwrap();
    assert_eq!(
        c.mkdir_all("/dangling", 0o755).unwrap_err().errno(),
        libc::EEXIST
    );
    // Several clients making overlapping trees at once all succeed.
    std::thread::scope(|s| {
        for t in 0..4 {
            let c = client(&p, |_| {});
            s.spawn(move || {
                for i in 0..5 {
                    c.mkdir_all(&format!("/race/{i}/t{t}"), 0o755).unwrap();
                }
            });
        }
    });
    assert_eq!(c.readdir("/race").unwrap().len(), 5);
    for i in 0..5 {
        assert_eq!(c.readdir(&format!("/race/{i}")).unwrap().len(), 4);
    }
}

#[test]
fn excl_trunc_append_seek() {
    let (_p, c) = pool(2);
    let fd = c.create("/a", O_WRONLY | O_EXCL, 0o644).unwrap();
    c.write(fd, b"hello").unwrap();
    c.close(fd).unwrap();
    assert_eq!(
        c.create("/a", O_WRONLY | O_EXCL, 0o644)
            .unwrap_err()
            .errno(),
        libc::EEXIST
    );
    let fd = c.open("/a", O_WRONLY | O_APPEND, 0).unwrap();
    c.write(fd, b" world").unwrap();
    c.close(fd).unwrap();
    let fd = c.open("/a", O_RDONLY, 0).unwrap();
    assert_eq!(c.seek(fd, 0, Whence::End).unwrap(), 11);
    c.seek(fd, 6, Whence::Set).unwrap();
    let mut b = [0u8; 10];
    assert_eq!(c.read(fd, &mut b).unwrap(), 5);
    assert_eq!(&b[..5], b"world");
    assert_eq!(c.pwrite(fd, b"x", 0).unwrap_err().errno(), libc::EBADF);
    c.close(fd).unwrap();
    let fd = c.open("/a", O_WRONLY | O_TRUNC, 0).unwrap();
    c.close(fd).unwrap();
    assert_eq!(c.stat("/a").unwrap().size, 0);
    assert_eq!(c.close(fd).unwrap_err().errno(), libc::EBADF);
}

#[test]
fn truncate_shrinks_and_grows_with_zeros() {
    let (_p, c) = pool(3);
    c.set_chunk_size(1024).unwrap();
    let fd = c.create("/t", O_RDWR, 0o644).unwrap();
    c.pwrite(fd, &pattern(10_000, 2), 0).unwrap();
    c.close(fd).unwrap();
    c.truncate("/t", 2500).unwrap();
    assert_eq!(c.stat("/t").unwrap().size, 2500);
    c.truncate("/t", 8000).unwrap();
    let fd = c.open("/t", O_RDONLY, 0).unwrap();
    let mut b = vec![0u8; 8000];
    assert_eq!(c.pread(fd, &mut b, 0).unwrap(), 8000);
    assert_eq!(&b[..2500], &pattern(10_000, 2)[..2500]);
    assert!(
        b[2500..].iter().all(|&x| x == 0),
        "grown region must be zeros"
    );
}

#[test]
fn rename_files_and_directories() {
    let (_p, c) = pool(4);
    c.set_chunk_size(512).unwrap();
    c.mkdir("/src", 0o755).unwrap();
    c.mkdir("/src/sub", 0o700).unwrap();
    let data = pattern(5000, 3);
    let fd = c.create("/src/sub/file", O_WRONLY, 0o640).unwrap();
    c.pwrite(fd, &data, 0).unwrap();
    c.close(fd).unwrap();
    c.rename("/src", "/dst").unwrap();
    assert_eq!(c.stat("/src").unwrap_err().errno(), libc::ENOENT);
    assert_eq!(c.stat("/dst/sub").unwrap().mode & 0o777, 0o700);
    let fd = c.open("/dst/sub/file", O_RDONLY, 0).unwrap();
    let mut b = vec![0u8; 6000];
    assert_eq!(c.pread(fd, &mut b, 0).unwrap(), 5000);
    assert_eq!(&b[..5000], &data[..]);
    c.close(fd).unwrap();
    // Replace an existing file; NOREPLACE refuses.
    let fd = c.create("/other", O_WRONLY, 0o644).unwrap();
    c.close(fd).unwrap();
    assert_eq!(
        c.rename_flags("/dst/sub/file", "/other", true)
            .unwrap_err()
            .errno(),
        libc::EEXIST
    );
    c.rename("/dst/sub/file", "/other").unwrap();
    assert_eq!(c.stat("/other").unwrap().size, 5000);
    assert_eq!(
        c.rename("/dst", "/dst/sub/x").unwrap_err().errno(),
        libc::EINVAL
    );
    assert_eq!(c.readdir("/dst/sub").unwrap().len(), 0);
}

#[test]
fn attributes_symlinks_and_special_files() {
    let (_p, c) = pool(2);
    let fd = c.create("/f", O_WRONLY, 0o644).unwrap();
    c.close(fd).unwrap();
    assert_eq!(c.chmod("/f", 0o600).unwrap().mode, libc::S_IFREG | 0o600);
    c.chown("/f", Some(1234), Some(99)).unwrap();
    let s = c
        .utimens("/f", TimeSet::At(1_000_000_000), TimeSet::At(2_000_000_000))
        .unwrap();
    assert_eq!(
        (s.uid, s.gid, s.atime, s.mtime),
        (1234, 99, 1_000_000_000, 2_000_000_000)
    );
    let before = c.stat("/f").unwrap().mtime;
    let s = c.utimens("/f", TimeSet::Omit, TimeSet::Omit).unwrap();
    assert_eq!(s.mtime, before);
    c.symlink("f", "/l").unwrap();
    assert_eq!(c.readlink("/l").unwrap(), "f");
    assert!(c.lstat("/l").unwrap().is_symlink());
    assert!(c.stat("/l").unwrap().is_file());
    assert_eq!(c.readlink("/f").unwrap_err().errno(), libc::EINVAL);
    c.mknod("/fifo", libc::S_IFIFO | 0o644, 0).unwrap();
    assert_eq!(c.stat("/fifo").unwrap().mode & libc::S_IFMT, libc::S_IFIFO);
    let fs = c.statfs().unwrap();
    assert_eq!(fs.servers, 2);
    assert!(fs.total > 0);
}

#[test]
fn publish_on_write_makes_the_size_visible_before_close() {
    let (p, c) = pool(3);
    let other = client(&p, |_| {});
    c.set_chunk_size(4096).unwrap();
    // Default: data chunks written, size published at close.
    let fd = c.create("/lazy", O_WRONLY, 0o644).unwrap();
    c.pwrite(fd, &pattern(20_000, 1), 0).unwrap();
    // (chunk 0 holds the entry: its part of the write counts at once)
    assert_eq!(other.stat("/lazy").unwrap().size, 4096);
    c.close(fd).unwrap();
    assert_eq!(other.stat("/lazy").unwrap().size, 20_000);
    // Eager: every growing write publishes; overwrites inside keep it.
    let fd = c.create("/eager", O_WRONLY, 0o644).unwrap();
    c.set_publish_on_write(fd, true).unwrap();
    c.pwrite(fd, &pattern(20_000, 2), 0).unwrap();
    assert_eq!(other.stat("/eager").unwrap().size, 20_000);
    c.pwrite(fd, &pattern(5_000, 3), 30_000).unwrap();
    assert_eq!(other.stat("/eager").unwrap().size, 35_000);
    c.pwrite(fd, &pattern(100, 4), 8_000).unwrap();
    assert_eq!(other.stat("/eager").unwrap().size, 35_000);
    c.close(fd).unwrap();
    let mut back = vec![0u8; 35_000];
    let rfd = other.open("/eager", O_RDONLY, 0).unwrap();
    assert_eq!(other.pread(rfd, &mut back, 0).unwrap(), 35_000);
    let mut want = pattern(20_000, 2);
    want[8_000..8_100].copy_from_slice(&pattern(100, 4));
    want.resize(30_000, 0);
    want.extend(pattern(5_000, 3));
    assert!(back == want);
    // Switching it on publishes what was pending.
    let fd = c.create("/late", O_WRONLY, 0o644).unwrap();
    c.pwrite(fd, &pattern(9_000, 5), 0).unwrap();
    assert_eq!(other.stat("/late").unwrap().size, 4096);
    c.set_publish_on_write(fd, true).unwrap();
    assert_eq!(other.stat("/late").unwrap().size, 9_000);
    c.close(fd).unwrap();
}

#[test]
fn servers_on_this_host_are_reached_through_their_unix_socket() {
    let (p, c) = pool(3);
    c.set_chunk_size(4096).unwrap();
    let data = pattern(60_000, 7);
    let fd = c.create("/u", O_RDWR, 0o644).unwrap();
    assert_eq!(c.pwrite(fd, &data, 0).unwrap(), data.len());
    c.close(fd).unwrap();
    // Every chunk owner was contacted, each through its Unix socket.
    assert_eq!(c.local_connections(), (3, 3));
    // CHFS_LOCAL_SOCKET=0: TCP only, same bytes.
    let t = client(&p, |c| c.local_socket = false);
    let fd = t.open("/u", O_RDONLY, 0).unwrap();
    let mut back = vec![0u8; data.len()];
    assert_eq!(t.pread(fd, &mut back, 0).unwrap(), data.len());
    t.close(fd).unwrap();
    assert_eq!(back, data);
    assert_eq!(t.local_connections(), (0, 3));
}

/// Writes `data` to `path`; returns how much the servers' counter
/// `counter` grew meanwhile.
fn counted_during(
    c: &chfs_client::Client,
    counter: fn(&chfs_proto::msg::ServerStatus) -> u64,
    path: &str,
    data: &[u8],
) -> u64 {
    let count = || -> u64 {
        c.server_status()
            .into_iter()
            .map(|(_, s)| counter(&s.unwrap()))
            .sum()
    };
    let before = count();
    let fd = c.create(path, O_RDWR, 0o644).unwrap();
    assert_eq!(c.pwrite(fd, data, 0).unwrap(), data.len());
    c.close(fd).unwrap();
    count() - before
}

/// Write requests the servers copied from the client's memory while
/// `data` was written to `path`.
fn cma_writes_during(c: &chfs_client::Client, path: &str, data: &[u8]) -> u64 {
    counted_during(c, |s| s.cma_writes, path, data)
}

#[test]
fn local_servers_copy_large_writes_from_the_clients_memory() {
    let (p, c) = pool(2);
    c.set_chunk_size(64 << 10).unwrap();
    let data = pattern(1 << 20, 9);
    // 16 chunk writes of 64 KiB, each copied with process_vm_readv.
    assert_eq!(cma_writes_during(&c, "/cma", &data), 16);
    let mut back = vec![0u8; data.len()];
    let fd = c.open("/cma", O_RDONLY, 0).unwrap();
    assert_eq!(c.pread(fd, &mut back, 0).unwrap(), data.len());
    c.close(fd).unwrap();
    assert_eq!(back, data);
    // Small writes travel in the frame.
    assert_eq!(cma_writes_during(&c, "/small", &data[..8192]), 0);
    // CHFS_CMA=0, and TCP: the data travels in the frame, same bytes.
    for (name, cma, local) in [("/nocma", false, true), ("/tcp", true, false)] {
        let t = client(&p, |c| {
            c.cma = cma;
            c.local_socket = local;
        });
        t.set_chunk_size(64 << 10).unwrap();
        assert_eq!(cma_writes_during(&t, name, &data), 0, "{name}");
        let fd = c.open(name, O_RDONLY, 0).unwrap();
        assert_eq!(c.pread(fd, &mut back, 0).unwrap(), data.len());
        c.close(fd).unwrap();
        assert_eq!(back, data, "{name}");
    }
}

/// Pins the calling thread to `cpu`.
fn pin(cpu: usize) {
    chfs_sys::cpu::pin_current_thread(cpu).unwrap();
}

#[test]
fn cpu_lanes_give_a_pinned_thread_its_own_connections() {
    let (p, c) = pool(2);
    c.set_cpu_lanes(chfs_client::CpuLanes::Always);
    let data = pattern(200_000, 3);
    let on0 = {
        let (c, data) = (c.clone(), data.clone());
        std::thread::spawn(move || {
            pin(0);
            // Large writes still leave their data here for the servers.
            let copied = cma_writes_during(&c, "/lane", &data);
            let fd = c.open("/lane", O_RDONLY, 0).unwrap();
            let mut back = vec![0u8; data.len()];
            assert_eq!(c.pread(fd, &mut back, 0).unwrap(), data.len());
            c.close(fd).unwrap();
            assert_eq!(back, data);
            copied
        })
        .join()
        .unwrap()
    };
    assert!(on0 > 0, "no write copied from the client's memory");
    // One connection per local server for CPU 0, next to the shared ones.
    assert_eq!(c.lane_connections(), 2);
    assert_eq!(c.local_connections(), (2, 2));
    if std::thread::available_parallelism().map_or(1, |n| n.get()) > 1 {
        let c1 = c.clone();
        std::thread::spawn(move || {
            pin(1);
            assert_eq!(c1.stat("/lane").unwrap().size, 200_000);
            c1.unlink("/lane").unwrap();
        })
        .join()
        .unwrap();
        assert!(c.lane_connections() >= 3, "{}", c.lane_connections());
    }
    // Over TCP there are no lanes; the same calls work.
    let t = client(&p, |c| c.local_socket = false);
    t.set_cpu_lanes(chfs_client::CpuLanes::Always);
    let fd = t.create("/tcp", O_RDWR, 0o644).unwrap();
    assert_eq!(t.pwrite(fd, &data, 0).unwrap(), data.len());
    t.close(fd).unwrap();
    assert_eq!(t.stat("/tcp").unwrap().size, data.len() as u64);
    assert_eq!(t.lane_connections(), 0);
}

#[test]
fn by_default_only_threads_pinned_to_one_cpu_use_cpu_lanes() {
    let (_p, c) = pool(2);
    let fd = c.create("/shared", O_RDWR, 0o644).unwrap();
    c.close(fd).unwrap();
    assert_eq!(c.lane_connections(), 0, "an unpinned thread");
    let c0 = c.clone();
    std::thread::spawn(move || {
        pin(0);
        assert_eq!(c0.stat("/shared").unwrap().size, 0);
        let fd = c0.create("/pinned", O_RDWR, 0o644).unwrap();
        c0.close(fd).unwrap();
    })
    .join()
    .unwrap();
    assert!(c.lane_connections() >= 1, "a thread pinned to CPU 0");
    // Turned off: a thread pinned to a CPU without a lane yet opens none.
    c.set_cpu_lanes(chfs_client::CpuLanes::Never);
    let before = c.lane_connections();
    let c1 = c.clone();
    let cpu = usize::from(std::thread::available_parallelism().map_or(1, |n| n.get()) > 1);
    std::thread::spawn(move || {
        pin(cpu);
        c1.unlink("/pinned").unwrap();
        c1.unlink("/shared").unwrap();
    })
    .join()
    .unwrap();
    assert_eq!(
        c.lane_connections(),
        before,
        "lanes turned off: none opened"
    );
}

/// Chunk writes the servers copied from a shared-memory window while
/// `data` was written to `path`.
fn shm_writes_during(c: &chfs_client::Client, path: &str, data: &[u8]) -> u64 {
    counted_during(c, |s| s.shm_writes, path, data)
}

#[test]
fn writes_from_a_shared_buffer_are_copied_from_the_servers_mapping() {
    let (p, c) = pool(2);
    c.set_chunk_size(64 << 10).unwrap();
    let buf = c.shared_buffer(2 << 20).unwrap();
    assert_eq!(buf.len(), 2 << 20);
    let data = pattern(1 << 20, 11);
    // SAFETY: the buffer is 2 MiB of this client's memory, written by this
    // thread only; the slices below end before the writes that use them.
    let shared = unsafe { std::slice::from_raw_parts_mut(buf.as_ptr(), buf.len()) };
    shared[4096..4096 + data.len()].copy_from_slice(&data);
    // 16 chunk writes of 64 KiB from the buffer; none from other memory.
    let from_buffer = &shared[4096..4096 + data.len()];
    assert_eq!(shm_writes_during(&c, "/shm", from_buffer), 16);
    assert_eq!(shm_writes_during(&c, "/heap", &data), 0);
    for path in ["/shm", "/heap"] {
        let mut back = vec![0u8; data.len()];
        let fd = c.open(path, O_RDONLY, 0).unwrap();
        assert_eq!(c.pread(fd, &mut back, 0).unwrap(), data.len());
        c.close(fd).unwrap();
        assert_eq!(back, data, "{path}");
    }
    // One per client.
    assert_eq!(c.shared_buffer(4096).unwrap_err().errno(), libc::EBUSY);
    // Over TCP the data travels in the frame, same bytes.
    let t = client(&p, |c| c.local_socket = false);
    t.set_chunk_size(64 << 10).unwrap();
    let tbuf = t.shared_buffer(1 << 20).unwrap();
    // SAFETY: as above, for this client's buffer.
    let tshared = unsafe { std::slice::from_raw_parts_mut(tbuf.as_ptr(), tbuf.len()) };
    tshared.copy_from_slice(&data);
    assert_eq!(shm_writes_during(&t, "/tcp", tshared), 0);
    let mut back = vec![0u8; data.len()];
    let fd = c.open("/tcp", O_RDONLY, 0).unwrap();
    assert_eq!(c.pread(fd, &mut back, 0).unwrap(), data.len());
    c.close(fd).unwrap();
    assert_eq!(back, data);
}

#[test]
fn callers_poll_for_replies_within_a_bounded_window_and_never_on_a_cpu_lane() {
    let (p, _) = pool(2);
    // Over TCP with a generous window: replies of every size come back
    // intact and most of them while the caller polls.
    let t = client(&p, |c| {
        c.local_socket = false;
        c.poll = chfs_client::Polling::Upto(std::time::Duration::from_millis(2));
    });
    let before = t.stats();
    for (i, len) in [1usize, 47_008, 1 << 20, 3 * 65_536 + 5]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, i as u64);
        let path = format!("/polled{i}");
        let fd = t.create(&path, O_RDWR, 0o644).unwrap();
        assert_eq!(t.pwrite(fd, &data, 0).unwrap(), len);
        let mut back = vec![0u8; len];
        assert_eq!(t.pread(fd, &mut back, 0).unwrap(), len);
        t.close(fd).unwrap();
        assert_eq!(back, data, "{len} bytes");
        assert_eq!(t.stat(&path).unwrap().size, len as u64);
        t.unlink(&path).unwrap();
    }
    for _ in 0..200 {
        t.ping(1).unwrap();
    }
    let after = t.stats();
    let hits = after.poll_hits - before.poll_hits;
    assert!(
        hits >= 100,
        "{hits} of {} replies polled",
        after.rpcs - before.rpcs
    );
    // Turned off: nobody polls.
    let off = client(&p, |c| {
        c.local_socket = false;
        c.poll = chfs_client::Polling::Off;
    });
    for _ in 0..100 {
        off.ping(0).unwrap();
    }
    assert_eq!((off.stats().poll_hits, off.stats().poll_misses), (0, 0));
    // A thread on a CPU lane: its server runs on the same CPU, so its
    // replies are never polled for (only the shared connections' first
    // requests were).
    let l = client(&p, |c| {
        c.poll = chfs_client::Polling::Upto(std::time::Duration::from_millis(2));
        c.cpu_lanes = chfs_client::CpuLanes::Always;
    });
    let l2 = l.clone();
    let (on_lane, polled) = std::thread::spawn(move || {
        pin(0);
        l2.ping(0).unwrap();
        l2.ping(1).unwrap();
        let s = l2.stats();
        for _ in 0..200 {
            l2.ping(0).unwrap();
            l2.ping(1).unwrap();
        }
        let e = l2.stats();
        (
            l2.lane_connections(),
            e.poll_hits + e.poll_misses - s.poll_hits - s.poll_misses,
        )
    })
    .join()
    .unwrap();
    assert_eq!(on_lane, 2);
    assert_eq!(polled, 0);
}

#[test]
fn a_read_sees_writes_buffered_on_another_descriptor_of_the_file() {
    let (p, _) = pool(2);
    let c = client(&p, |cfg| cfg.buf_size = 65536);
    c.set_chunk_size(4096).unwrap();
    let w = c.create("/buf", O_RDWR, 0o644).unwrap();
    let r = c.open("/buf", O_RDONLY, 0).unwrap();
    c.pwrite(w, &pattern(10_000, 3), 0).unwrap();
    c.pwrite(w, b"tail", 10_000).unwrap();
    let mut b = vec![0u8; 20_000];
    // Through the other descriptor: every byte (was zeros: the buffer
    // stayed with the writing descriptor until its flush).
    assert_eq!(c.pread(r, &mut b, 0).unwrap(), 10_004);
    assert!(
        b[..10_000] == pattern(10_000, 3)[..],
        "buffered bytes not seen"
    );
    assert!(&b[10_000..10_004] == b"tail");
    c.close(r).unwrap();
    c.close(w).unwrap();
}

/// The parallel walk visits every entry once, with any number of threads:
/// a directory listed in several pages by each server, a chain of nested
/// directories (one new item at a time), and a subtree it is told not to
/// descend into; each thread's state gets the entries it visited.
#[test]
fn walk_parallel_visits_every_entry_once() {
    let (_p, c) = pool(2);
    let mut want = Vec::new();
    let touch = |p: String| {
        let fd = c.create(&p, O_WRONLY, 0o644).unwrap();
        c.close(fd).unwrap();
        p
    };
    c.mkdir("/w", 0o755).unwrap();
    c.mkdir("/w/big", 0o755).unwrap();
    want.push("/w/big".to_string());
    // More than two pages (4,096 names) on each of the two servers.
    for i in 0..9000 {
        want.push(touch(format!("/w/big/f{i:05}")));
    }
    let mut chain = "/w".to_string();
    for i in 0..30 {
        chain = format!("{chain}/c{i}");
        c.mkdir(&chain, 0o755).unwrap();
        want.push(chain.clone());
        want.push(touch(format!("{chain}/x")));
    }
    for d in 0..20 {
        let dir = format!("/w/d{d}");
        c.mkdir(&dir, 0o755).unwrap();
        want.push(dir.clone());
        for f in 0..10 {
            want.push(touch(format!("{dir}/f{f}")));
        }
    }
    want.sort();
    for threads in [1, 3, 16] {
        let (states, errors) = c.walk_parallel_with(
            "/w",
            threads,
            &|_| true,
            &Vec::new,
            &|seen: &mut Vec<String>, full, e| {
                assert_eq!(full.rsplit('/').next(), Some(e.name.as_str()));
                seen.push(full.to_string());
                true
            },
        );
        assert!(errors.is_empty(), "{threads} threads");
        assert_eq!(states.len(), threads);
        let mut seen: Vec<String> = states.into_iter().flatten().collect();
        seen.sort();
        assert_eq!(seen, want, "{threads} threads");
    }
    // Not descending into /w/c0/c1: nothing below it is visited.
    let count = std::sync::atomic::AtomicUsize::new(0);
    let errors = c.walk_parallel("/w", 4, &|_| true, &|full, _| {
        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        full != "/w/c0/c1"
    });
    assert!(errors.is_empty());
    let below = want.iter().filter(|p| p.starts_with("/w/c0/c1/")).count();
    assert_eq!(count.into_inner(), want.len() - below);
}
