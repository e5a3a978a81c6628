//! Path arithmetic of the mount prefix (pure, no I/O).

/// `p` (absolute) with `.`, `..` and repeated slashes resolved lexically
/// (`/..` is `/`).
pub(crate) fn normalize_abs(p: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in p.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    let mut out = String::with_capacity(p.len());
    for c in &parts {
        out.push('/');
        out.push_str(c);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// Is the absolute path `p` what [`normalize_abs`] would make of it (no
/// empty, `.` or `..` component, no trailing `/` but for `/` itself)?
pub(crate) fn is_normal(p: &str) -> bool {
    let Some(rest) = p.strip_prefix('/') else {
        return false;
    };
    rest.is_empty() || rest.split('/').all(|c| !matches!(c, "" | "." | ".."))
}

/// Does the C string `p` start with `prefix` followed by `/` or its end?
///
/// # Safety
/// `p` points to a NUL-terminated string.
pub(crate) unsafe fn has_prefix(p: *const std::ffi::c_char, prefix: &[u8]) -> bool {
    for (i, &b) in prefix.iter().enumerate() {
        // SAFETY: every byte before the NUL is readable, and the loop stops
        // at the first mismatch, which a NUL byte always is.
        if unsafe { *p.add(i) } as u8 != b {
            return false;
        }
    }
    // SAFETY: the bytes up to here matched non-NUL prefix bytes.
    let next = unsafe { *p.add(prefix.len()) } as u8;
    next == b'/' || next == 0
}

/// The chfs-rs path of the normalised local path `n`, if it lies under
/// `mount` (itself normalised, not `/`).
pub(crate) fn strip(mount: &str, n: &str) -> Option<String> {
    let rest = n.strip_prefix(mount)?;
    if rest.is_empty() {
        Some("/".to_string())
    } else if rest.starts_with('/') {
        Some(rest.to_string())
    } else {
        None
    }
}

/// The local path of chfs-rs path `p` (as `getcwd` reports it).
pub(crate) fn local(mount: &str, p: &str) -> String {
    if p == "/" {
        mount.to_string()
    } else {
        format!("{mount}{p}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes() {
        assert_eq!(normalize_abs("/chfs//a/./b/../c/"), "/chfs/a/c");
        assert_eq!(normalize_abs("/.."), "/");
        assert_eq!(normalize_abs("/chfs/../etc"), "/etc");
        assert_eq!(normalize_abs("/"), "/");
    }

    #[test]
    fn normal_paths_are_those_normalize_leaves_alone() {
        for p in [
            "/",
            "/chfs",
            "/chfs/a",
            "/chfs/a.b/..c/.d",
            "//",
            "/chfs/",
            "/chfs//a",
            "/chfs/./a",
            "/chfs/..",
            "/chfs/a/..",
            "/.",
            "chfs",
            "",
        ] {
            let normal = p.starts_with('/') && normalize_abs(p) == p;
            assert_eq!(is_normal(p), normal, "{p:?}");
        }
    }

    #[test]
    fn strips_on_component_boundaries() {
        assert_eq!(strip("/chfs", "/chfs").as_deref(), Some("/"));
        assert_eq!(strip("/chfs", "/chfs/a").as_deref(), Some("/a"));
        assert_eq!(strip("/chfs", "/chfsx/a"), None);
        assert_eq!(strip("/chfs", "/tmp"), None);
        assert_eq!(local("/chfs", "/"), "/chfs");
        assert_eq!(local("/chfs", "/a"), "/chfs/a");
    }

    #[test]
    fn prefix_of_c_strings() {
        // SAFETY: NUL-terminated literals.
        unsafe {
            assert!(has_prefix(c"/chfs".as_ptr(), b"/chfs"));
            assert!(has_prefix(c"/chfs/x".as_ptr(), b"/chfs"));
            assert!(!has_prefix(c"/chfsx".as_ptr(), b"/chfs"));
            assert!(!has_prefix(c"/ch".as_ptr(), b"/chfs"));
            assert!(!has_prefix(c"/tmp".as_ptr(), b"/chfs"));
        }
    }
}
