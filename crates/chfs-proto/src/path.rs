//! Path rules.
//!
//! Clients normalise every path before it leaves the process
//! ([`normalize`]); servers accept only normalised paths ([`validate`]), so a
//! `..` can never climb out of the file system's root — nor, in cache mode,
//! out of the backend directory.

/// Longest path accepted, in bytes (`PATH_MAX`).
pub const MAX_PATH: usize = 4096;
/// Longest name of one component, in bytes (`NAME_MAX`).
pub const MAX_NAME: usize = 255;

/// A path that cannot be used, with the errno the user sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathError {
    /// `ENAMETOOLONG`, `EINVAL`, ...
    pub errno: i32,
    /// Explanation.
    pub message: String,
}

fn err(errno: i32, message: String) -> PathError {
    PathError { errno, message }
}

/// Normalises a user path: makes it absolute, drops empty and `.`
/// components, resolves `..` lexically (never above the root) and checks the
/// length limits. The result is `/` or `/a/b` (no trailing slash).
pub fn normalize(path: &str) -> Result<String, PathError> {
    if path.is_empty() {
        return Err(err(libc::ENOENT, "empty path".into()));
    }
    if path.as_bytes().contains(&0) {
        return Err(err(libc::EINVAL, "path contains a NUL byte".into()));
    }
    if path.len() > MAX_PATH {
        return Err(err(
            libc::ENAMETOOLONG,
            format!("path of {} bytes is too long", path.len()),
        ));
    }
    // Built in place (one allocation): a `..` cuts the last component off.
    let mut out = String::with_capacity(path.len() + 1);
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                let cut = out.rfind('/').unwrap_or(0);
                out.truncate(cut);
            }
            name => {
                if name.len() > MAX_NAME {
                    return Err(err(
                        libc::ENAMETOOLONG,
                        format!("name of {} bytes is too long", name.len()),
                    ));
                }
                out.push('/');
                out.push_str(name);
            }
        }
    }
    if out.is_empty() {
        out.push('/');
    }
    // A relative path gains a leading '/': one byte more than was checked.
    if out.len() > MAX_PATH {
        return Err(err(
            libc::ENAMETOOLONG,
            format!("path of {} bytes is too long", out.len()),
        ));
    }
    Ok(out)
}

/// Checks that a path received from a peer is normalised; servers refuse
/// anything else with `EINVAL`.
pub fn validate(path: &str) -> Result<(), PathError> {
    if path.len() > MAX_PATH {
        return Err(err(libc::ENAMETOOLONG, "path too long".into()));
    }
    if path == "/" {
        return Ok(());
    }
    if !path.starts_with('/') || path.ends_with('/') || path.as_bytes().contains(&0) {
        return Err(err(
            libc::EINVAL,
            format!("path {path:?} is not normalised"),
        ));
    }
    for c in path[1..].split('/') {
        if c.is_empty() || c == "." || c == ".." {
            return Err(err(
                libc::EINVAL,
                format!("path {path:?} is not normalised"),
            ));
        }
        if c.len() > MAX_NAME {
            return Err(err(libc::ENAMETOOLONG, "name too long".into()));
        }
    }
    Ok(())
}

/// Parent directory of a normalised path (`/` for `/a` and for `/`).
pub fn parent(path: &str) -> &str {
    match path.rfind('/') {
        Some(0) | None => "/",
        Some(i) => &path[..i],
    }
}

/// Last component of a normalised path (empty for `/`).
pub fn file_name(path: &str) -> &str {
    match path.rfind('/') {
        Some(i) => &path[i + 1..],
        None => path,
    }
}

/// Joins a directory and a name.
pub fn join(dir: &str, name: &str) -> String {
    let mut p = String::with_capacity(dir.len() + 1 + name.len());
    join_into(&mut p, dir, name);
    p
}

/// [`join`] into `out` (cleared first): a buffer reused for many names of
/// one directory allocates once.
pub fn join_into(out: &mut String, dir: &str, name: &str) {
    out.clear();
    if dir != "/" {
        out.push_str(dir);
    }
    out.push('/');
    out.push_str(name);
}

/// Is `path` equal to `dir` or below it?
/// The default path of the node-local area (entries kept on a server of
/// the creating node and seen there only; `CHFS_NODE_LOCAL_PREFIX`,
/// `chfsd --node-local-prefix`).
pub const NODE_LOCAL_PREFIX: &str = "/.nodelocal";

/// Is `path` the directory `dir` or inside it?
pub fn is_within(path: &str, dir: &str) -> bool {
    dir == "/"
        || path == dir
        || (path.starts_with(dir) && path.as_bytes().get(dir.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes() {
        assert_eq!(normalize("a/b").unwrap(), "/a/b");
        assert_eq!(normalize("//a/./b/").unwrap(), "/a/b");
        assert_eq!(normalize("/a/../../..").unwrap(), "/");
        assert_eq!(normalize("/../etc/passwd").unwrap(), "/etc/passwd");
        assert_eq!(normalize("/").unwrap(), "/");
        assert_eq!(normalize("").unwrap_err().errno, libc::ENOENT);
        assert_eq!(
            normalize(&"x".repeat(256)).unwrap_err().errno,
            libc::ENAMETOOLONG
        );
        assert_eq!(
            normalize(&"/x".repeat(3000)).unwrap_err().errno,
            libc::ENAMETOOLONG
        );
    }

    /// Against the obvious implementation (a stack of components), on
    /// every path of up to five components of "", ".", "..", "a", "bc",
    /// with and without a leading '/'.
    #[test]
    fn normalizes_like_a_stack_of_components() {
        fn reference(path: &str) -> String {
            let mut parts: Vec<&str> = Vec::new();
            for c in path.split('/') {
                match c {
                    "" | "." => {}
                    ".." => {
                        parts.pop();
                    }
                    name => parts.push(name),
                }
            }
            if parts.is_empty() {
                return "/".into();
            }
            parts.iter().map(|p| format!("/{p}")).collect()
        }
        let comps = ["", ".", "..", "a", "bc"];
        let mut paths = vec![String::new()];
        for _ in 0..5 {
            let mut next = Vec::new();
            for p in &paths {
                for c in comps {
                    next.push(if p.is_empty() {
                        c.to_string()
                    } else {
                        format!("{p}/{c}")
                    });
                }
            }
            paths.extend(next.iter().cloned());
            paths.dedup();
            paths = next.into_iter().chain(paths).collect();
            paths.sort();
            paths.dedup();
        }
        let mut n = 0;
        for p in &paths {
            for q in [p.clone(), format!("/{p}")] {
                if q.is_empty() {
                    continue;
                }
                assert_eq!(normalize(&q).unwrap(), reference(&q), "{q:?}");
                n += 1;
            }
        }
        assert!(n > 5000, "{n} paths");
    }

    #[test]
    fn validates() {
        assert!(validate("/a/b").is_ok());
        assert!(validate("/").is_ok());
        for bad in ["a", "/a/", "/a//b", "/a/../b", "/./a", "/.."] {
            assert_eq!(validate(bad).unwrap_err().errno, libc::EINVAL, "{bad}");
        }
    }

    #[test]
    fn parents_and_names() {
        assert_eq!(parent("/a/b"), "/a");
        assert_eq!(parent("/a"), "/");
        assert_eq!(parent("/"), "/");
        assert_eq!(file_name("/a/b"), "b");
        assert_eq!(join("/", "x"), "/x");
        assert_eq!(join("/a", "x"), "/a/x");
        let mut buf = String::from("/left/over/from/before");
        join_into(&mut buf, "/a", "x");
        assert_eq!(buf, "/a/x");
        join_into(&mut buf, "/", "y");
        assert_eq!(buf, "/y");
        assert!(is_within("/a/b", "/a"));
        assert!(!is_within("/ab", "/a"));
        assert!(is_within("/a", "/a"));
    }
}
