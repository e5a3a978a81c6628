//! Faults seen through the mount: errors reach the tools, never wrong
//! bytes or sizes (SEMANTICS.md, "Faults").

mod common;

use std::io::Write;

use common::*;

fn statvfs_free(p: &std::path::Path) -> u64 {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: c is NUL-terminated; vfs is a zeroed statvfs that statvfs fills.
    unsafe {
        let mut vfs: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(c.as_ptr(), &mut vfs), 0);
        vfs.f_bfree as u64 * vfs.f_frsize as u64
    }
}

#[test]
fn a_restarted_server_makes_cat_and_md5sum_fail_instead_of_reading_zeros() {
    let mut pool = dram_pool(2, &[]);
    let m = Mount::new(&pool, &[]);
    for i in 0..10 {
        std::fs::write(m.p(&format!("f{i}")), pattern(1 << 20, i)).unwrap();
    }
    pool.restart(1).unwrap();
    for i in 0..10 {
        let f = m.p(&format!("f{i}"));
        let (ok, out) = sh_status(&format!("cat {} > /dev/null", q(&f)));
        assert!(!ok, "cat of a file that lost chunks succeeded");
        assert!(
            out.contains("Input/output error") || out.contains("No such file"),
            "{out}"
        );
        let (ok, out) = sh_status(&format!("md5sum {}", q(&f)));
        assert!(!ok, "md5sum succeeded: {out}");
    }
    // chfuse's log says which file and which server.
    let log = std::fs::read_to_string(&m.log).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("read failed") && l.contains("/f") && l.contains(&pool.addrs()[1])),
        "{log}"
    );
    // New files work as before.
    std::fs::write(m.p("after"), pattern(1 << 20, 42)).unwrap();
    assert_eq!(std::fs::read(m.p("after")).unwrap(), pattern(1 << 20, 42));
}

#[test]
fn out_of_space_through_the_mount_gives_short_writes_and_honest_sizes() {
    let pool = dram_pool(2, &["--size", "1M"]);
    let m = Mount::new(&pool, &[]);
    let free = statvfs_free(&m.mp);

    // dd with 1 MiB blocks stops with ENOSPC; what it wrote is the file.
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("src");
    std::fs::write(&src, pattern(4 << 20, 3)).unwrap();
    let (ok, out) = sh_status(&format!("dd if={} of={} bs=1M", q(&src), q(&m.p("dd"))));
    assert!(!ok && out.contains("No space left on device"), "{out}");
    let size = std::fs::metadata(m.p("dd")).unwrap().len();
    assert!(size > 0 && size < 4 << 20, "{size}");
    assert!(
        std::fs::read(m.p("dd")).unwrap() == pattern(4 << 20, 3)[..size as usize],
        "the file is what dd wrote"
    );
    std::fs::remove_file(m.p("dd")).unwrap();
    free_comes_back(&m.mp, free, "df after the file is removed");

    // One 4 MiB write(2): a short count for what was stored, or ENOSPC
    // with nothing stored; the size says the same.
    let data = pattern(4 << 20, 4);
    let mut f = std::fs::File::create(m.p("one")).unwrap();
    let n = match f.write(&data) {
        Ok(n) => n,
        Err(e) => {
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "{e}");
            0
        }
    };
    assert!(n < data.len());
    drop(f);
    assert_eq!(std::fs::metadata(m.p("one")).unwrap().len(), n as u64);
    assert!(std::fs::read(m.p("one")).unwrap() == data[..n]);
    std::fs::remove_file(m.p("one")).unwrap();
    free_comes_back(&m.mp, free, "df after the short write's file is removed");
}

/// Waits (at most 10 s) for the free space of `mp` to be `free` again: the
/// kernel sends a file's RELEASE after close(2) has returned, and a file
/// removed while still open (to chfuse) keeps its data under a hidden name
/// until then.
fn free_comes_back(mp: &std::path::Path, free: u64, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = statvfs_free(mp);
        if now == free {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {now} free, {free} before"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
