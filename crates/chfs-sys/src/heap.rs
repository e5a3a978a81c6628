//! The C heap (glibc malloc): how much it holds free, and giving that
//! back to the system; the process's resident memory.
//!
//! Elsewhere (another C library) nothing is known: [`free_bytes`] is 0
//! and [`trim`] does nothing.

/// Bytes the heap holds free (`mallinfo2().fordblks`: freed memory not
/// yet given back to the system, in every arena).
pub fn free_bytes() -> usize {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics (under
        // its locks) and returns them by value.
        unsafe { libc::mallinfo2() }.fordblks
    }
    #[cfg(not(target_env = "gnu"))]
    {
        0
    }
}

/// The process's resident memory in bytes (`/proc/self/statm`; 0 if it
/// cannot be read).
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * crate::map::page_size() as u64)
}

/// Gives the heap's free memory back to the system (`malloc_trim(0)`:
/// the top of the heap is shrunk and whole free pages within it are
/// released with MADV_DONTNEED); true if any was. Every allocation in the
/// process waits meanwhile (it holds the arenas' locks): call it when
/// the process is otherwise idle.
pub fn trim() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim takes the allocator's own locks and changes
        // nothing a live allocation owns.
        unsafe { libc::malloc_trim(0) != 0 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}

/// How the kernel hands out transparent huge pages
/// (/sys/kernel/mm/transparent_hugepage/enabled).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThpMode {
    /// To every process's anonymous memory.
    Always,
    /// To memory a process asked for them with madvise(MADV_HUGEPAGE).
    Madvise,
    /// To none.
    Never,
    /// No such setting (another kernel, no sysfs).
    Unknown,
}

/// The kernel's transparent huge page mode.
pub fn thp_mode() -> ThpMode {
    let Ok(s) = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled") else {
        return ThpMode::Unknown;
    };
    if s.contains("[always]") {
        ThpMode::Always
    } else if s.contains("[madvise]") {
        ThpMode::Madvise
    } else if s.contains("[never]") {
        ThpMode::Never
    } else {
        ThpMode::Unknown
    }
}

/// Whether malloc asks the kernel for transparent huge pages
/// (madvise(MADV_HUGEPAGE)) on the memory it gets for a large block, as
/// glibc does with the tunable `glibc.malloc.hugetlb=1` when the kernel's
/// mode is [`ThpMode::Madvise`]: a 4 MiB block is allocated (not
/// touched), the flags of the mapping holding it looked up in
/// /proc/self/smaps (`hg`), and the block freed. None when that cannot be
/// told (no /proc, no memory).
pub fn malloc_asks_huge_pages() -> Option<bool> {
    const BLOCK: usize = 4 << 20;
    // SAFETY: a plain allocation, freed below; its memory is never
    // touched, only its address compared.
    let p = unsafe { libc::malloc(BLOCK) };
    if p.is_null() {
        return None;
    }
    let smaps = std::fs::read_to_string("/proc/self/smaps");
    // SAFETY: p came from malloc above and is freed once.
    unsafe { libc::free(p) };
    mapping_has_flag(&smaps.ok()?, p as usize, "hg")
}

/// Whether the mapping of `smaps` (the text of /proc/PID/smaps) that
/// holds `addr` has `flag` among its VmFlags; None if no mapping holds it.
fn mapping_has_flag(smaps: &str, addr: usize, flag: &str) -> Option<bool> {
    let mut inside = false;
    for line in smaps.lines() {
        let range = line
            .split_once(' ')
            .and_then(|(r, _)| r.split_once('-'))
            .and_then(|(a, b)| {
                Some((
                    usize::from_str_radix(a, 16).ok()?,
                    usize::from_str_radix(b, 16).ok()?,
                ))
            });
        if let Some((start, end)) = range {
            inside = start <= addr && addr < end;
        } else if let Some(flags) = line.strip_prefix("VmFlags:") {
            if inside {
                return Some(flags.split_whitespace().any(|f| f == flag));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapping_holding_an_address_is_found_by_its_range() {
        let smaps = "\
55d0a0000000-55d0a0200000 rw-p 00000000 00:00 0                          [heap]
Size:               2048 kB
VmFlags: rd wr mr mw me ac hg 
7f0000000000-7f0000401000 rw-p 00000000 00:00 0 
Size:               4100 kB
AnonHugePages:         0 kB
VmFlags: rd wr mr mw me ac 
";
        assert_eq!(mapping_has_flag(smaps, 0x55d0a0000000, "hg"), Some(true));
        assert_eq!(mapping_has_flag(smaps, 0x55d0a01fffff, "hg"), Some(true));
        assert_eq!(mapping_has_flag(smaps, 0x7f0000000010, "hg"), Some(false));
        assert_eq!(mapping_has_flag(smaps, 0x55d0a0200000, "hg"), None);
        assert_eq!(mapping_has_flag(smaps, 0x10, "hg"), None);
    }

    #[test]
    fn malloc_here_asks_for_no_huge_pages() {
        // The test runs without glibc.malloc.hugetlb; chfsd's tests check
        // the other answer (crates/chfs-server/tests/heap.rs).
        let tunables = std::env::var("GLIBC_TUNABLES").unwrap_or_default();
        if cfg!(target_env = "gnu") && !tunables.contains("glibc.malloc.hugetlb") {
            assert_eq!(malloc_asks_huge_pages(), Some(false));
        }
    }
}
