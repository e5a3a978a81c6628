//! Property test against a reference model of a file system: random
//! sequences of operations give the same results and errors in a `BTreeMap`
//! model and in a real pool of chfsd servers.

mod common;

use std::collections::BTreeMap;

use chfs_client::flags::*;
use chfs_client::Client;
use common::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Create(usize),
    Write(usize, u64, usize, u8),
    Read(usize, u64, usize),
    Truncate(usize, u64),
    Unlink(usize),
    Mkdir(usize),
    Rmdir(usize),
    Rename(usize, usize),
    Readdir(usize),
    Stat(usize),
}

/// Paths of a case, relative to its root directory.
const PATHS: &[&str] = &["/a", "/b", "/d", "/d/a", "/d/e", "/d/e/f", "/a/x"];

fn path_idx() -> impl Strategy<Value = usize> {
    // Mostly the top-level names, so data operations meet each other often.
    prop_oneof![4 => 0usize..2, 1 => 0..PATHS.len()]
}

fn op() -> impl Strategy<Value = Op> {
    let p = path_idx;
    prop_oneof![
        3 => p().prop_map(Op::Create),
        4 => (p(), 0u64..3000, 0usize..2500, any::<u8>()).prop_map(|(a, o, l, s)| Op::Write(a, o, l, s)),
        4 => (p(), 0u64..3500, 0usize..3000).prop_map(|(a, o, l)| Op::Read(a, o, l)),
        3 => (p(), 0u64..3000).prop_map(|(a, l)| Op::Truncate(a, l)),
        1 => p().prop_map(Op::Unlink),
        1 => p().prop_map(Op::Mkdir),
        1 => p().prop_map(Op::Rmdir),
        2 => (p(), p()).prop_map(|(a, b)| Op::Rename(a, b)),
        1 => p().prop_map(Op::Readdir),
        2 => p().prop_map(Op::Stat),
    ]
}

#[derive(Debug, Clone, PartialEq)]
enum Node {
    Dir,
    File(Vec<u8>),
}

/// The reference model: relative path -> node ("" is the root).
#[derive(Default)]
struct Model {
    nodes: BTreeMap<String, Node>,
}

#[derive(Debug, PartialEq)]
enum Out {
    Unit,
    Bytes(Vec<u8>),
    Names(Vec<String>),
    Size(u64, bool),
    Err(i32),
}

fn parent(p: &str) -> &str {
    &p[..p.rfind('/').unwrap_or(0)]
}

impl Model {
    fn new() -> Self {
        let mut m = Model::default();
        m.nodes.insert(String::new(), Node::Dir);
        m
    }

    /// Errno for creating an entry at `p` (parent checks).
    fn parent_err(&self, p: &str) -> Option<i32> {
        let mut d = parent(p);
        match self.nodes.get(d) {
            Some(Node::Dir) => return None,
            Some(Node::File(_)) => return Some(libc::ENOTDIR),
            None => {}
        }
        while !d.is_empty() {
            d = parent(d);
            match self.nodes.get(d) {
                Some(Node::Dir) => return Some(libc::ENOENT),
                Some(Node::File(_)) => return Some(libc::ENOTDIR),
                None => {}
            }
        }
        Some(libc::ENOENT)
    }

    fn children(&self, d: &str) -> Vec<String> {
        let prefix = format!("{d}/");
        self.nodes
            .keys()
            .filter(|k| k.starts_with(&prefix) && !k[prefix.len()..].contains('/'))
            .map(|k| k[prefix.len()..].to_string())
            .collect()
    }

    fn apply(&mut self, op: &Op) -> Out {
        match *op {
            Op::Create(a) => {
                let p = PATHS[a];
                match self.nodes.get(p) {
                    Some(Node::Dir) => Out::Err(libc::EISDIR),
                    Some(Node::File(_)) => Out::Unit,
                    None => match self.parent_err(p) {
                        Some(e) => Out::Err(e),
                        None => {
                            self.nodes.insert(p.into(), Node::File(Vec::new()));
                            Out::Unit
                        }
                    },
                }
            }
            Op::Write(a, off, len, seed) => match self.nodes.get_mut(PATHS[a]) {
                None => Out::Err(libc::ENOENT),
                Some(Node::Dir) => Out::Err(libc::EISDIR),
                Some(Node::File(d)) => {
                    if len > 0 {
                        let end = off as usize + len;
                        if d.len() < end {
                            d.resize(end, 0);
                        }
                        d[off as usize..end].copy_from_slice(&pattern(len, seed as u64));
                    }
                    Out::Unit
                }
            },
            Op::Read(a, off, len) => match self.nodes.get(PATHS[a]) {
                None => Out::Err(libc::ENOENT),
                Some(Node::Dir) => Out::Err(libc::EISDIR),
                Some(Node::File(d)) => {
                    let s = (off as usize).min(d.len());
                    let e = (off as usize + len).min(d.len());
                    Out::Bytes(d[s..e].to_vec())
                }
            },
            Op::Truncate(a, len) => match self.nodes.get_mut(PATHS[a]) {
                None => Out::Err(libc::ENOENT),
                Some(Node::Dir) => Out::Err(libc::EISDIR),
                Some(Node::File(d)) => {
                    d.resize(len as usize, 0);
                    Out::Unit
                }
            },
            Op::Unlink(a) => match self.nodes.get(PATHS[a]) {
                None => Out::Err(libc::ENOENT),
                Some(Node::Dir) => Out::Err(libc::EISDIR),
                Some(Node::File(_)) => {
                    self.nodes.remove(PATHS[a]);
                    Out::Unit
                }
            },
            Op::Mkdir(a) => {
                let p = PATHS[a];
                if self.nodes.contains_key(p) {
                    return Out::Err(libc::EEXIST);
                }
                match self.parent_err(p) {
                    Some(e) => Out::Err(e),
                    None => {
                        self.nodes.insert(p.into(), Node::Dir);
                        Out::Unit
                    }
                }
            }
            Op::Rmdir(a) => {
                let p = PATHS[a];
                match self.nodes.get(p) {
                    None => Out::Err(libc::ENOENT),
                    Some(Node::File(_)) => Out::Err(libc::ENOTDIR),
                    Some(Node::Dir) if !self.children(p).is_empty() => Out::Err(libc::ENOTEMPTY),
                    Some(Node::Dir) => {
                        self.nodes.remove(p);
                        Out::Unit
                    }
                }
            }
            Op::Rename(a, b) => {
                let (old, new) = (PATHS[a], PATHS[b]);
                let Some(src) = self.nodes.get(old).cloned() else {
                    return Out::Err(libc::ENOENT);
                };
                if old == new {
                    return Out::Unit;
                }
                if src == Node::Dir && new.starts_with(&format!("{old}/")) {
                    return Out::Err(libc::EINVAL);
                }
                if let Some(e) = self.parent_err(new) {
                    return Out::Err(e);
                }
                match (self.nodes.get(new), &src) {
                    (Some(Node::File(_)), Node::Dir) => return Out::Err(libc::ENOTDIR),
                    (Some(Node::Dir), Node::File(_)) => return Out::Err(libc::EISDIR),
                    (Some(Node::Dir), Node::Dir) if !self.children(new).is_empty() => {
                        return Out::Err(libc::ENOTEMPTY)
                    }
                    _ => {}
                }
                self.nodes.remove(new);
                let prefix = format!("{old}/");
                let moved: Vec<String> = self
                    .nodes
                    .keys()
                    .filter(|k| *k == old || k.starts_with(&prefix))
                    .cloned()
                    .collect();
                for k in moved {
                    let v = self.nodes.remove(&k).unwrap();
                    self.nodes.insert(format!("{new}{}", &k[old.len()..]), v);
                }
                Out::Unit
            }
            Op::Readdir(a) => match self.nodes.get(PATHS[a]) {
                None => Out::Err(libc::ENOENT),
                Some(Node::File(_)) => Out::Err(libc::ENOTDIR),
                Some(Node::Dir) => Out::Names(self.children(PATHS[a])),
            },
            Op::Stat(a) => match self.nodes.get(PATHS[a]) {
                None => Out::Err(libc::ENOENT),
                Some(Node::Dir) => Out::Size(0, true),
                Some(Node::File(d)) => Out::Size(d.len() as u64, false),
            },
        }
    }
}

fn real(c: &Client, root: &str, op: &Op) -> Out {
    let p = |a: usize| format!("{root}{}", PATHS[a]);
    let r: chfs_client::Result<Out> = (|| match *op {
        Op::Create(a) => {
            let fd = c.open(&p(a), O_CREAT | O_WRONLY, 0o644)?;
            c.close(fd)?;
            Ok(Out::Unit)
        }
        Op::Write(a, off, len, seed) => {
            let fd = c.open(&p(a), O_WRONLY, 0)?;
            let r = c.pwrite(fd, &pattern(len, seed as u64), off);
            c.close(fd)?;
            r?;
            Ok(Out::Unit)
        }
        Op::Read(a, off, len) => {
            let fd = c.open(&p(a), O_RDONLY, 0)?;
            let mut b = vec![0u8; len];
            let r = c.pread(fd, &mut b, off);
            c.close(fd)?;
            b.truncate(r?);
            Ok(Out::Bytes(b))
        }
        Op::Truncate(a, len) => c.truncate(&p(a), len).map(|_| Out::Unit),
        Op::Unlink(a) => c.unlink(&p(a)).map(|_| Out::Unit),
        Op::Mkdir(a) => c.mkdir(&p(a), 0o755).map(|_| Out::Unit),
        Op::Rmdir(a) => c.rmdir(&p(a)).map(|_| Out::Unit),
        Op::Rename(a, b) => c.rename(&p(a), &p(b)).map(|_| Out::Unit),
        Op::Readdir(a) => Ok(Out::Names(
            c.readdir(&p(a))?.into_iter().map(|e| e.name).collect(),
        )),
        Op::Stat(a) => {
            let s = c.stat(&p(a))?;
            Ok(Out::Size(if s.is_dir() { 0 } else { s.size }, s.is_dir()))
        }
    })();
    r.unwrap_or_else(|e| Out::Err(e.errno()))
}

struct Shared {
    _pool: LocalPool,
    client: Client,
}

fn new_shared() -> Shared {
    let pool = LocalPool::start(3).expect("pool");
    // A small chunk size so files of a few KB span several servers; no
    // directory cache so other cases' removals are always seen.
    let client = client(&pool, |c| {
        c.chunk_size = 700;
        c.dir_cache = std::time::Duration::ZERO;
    });
    Shared {
        _pool: pool,
        client,
    }
}

thread_local! {
    // One pool per test thread, stopped when the thread ends.
    static SHARED: Shared = new_shared();
}

fn run_case(ops: &[Op]) -> Result<(), TestCaseError> {
    SHARED.with(|s| run_case_on(s, ops))
}

fn run_case_on(s: &Shared, ops: &[Op]) -> Result<(), TestCaseError> {
    static CASE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let root = format!(
        "/case{}",
        CASE.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    s.client
        .mkdir(&root, 0o755)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut model = Model::new();
    for (i, op) in ops.iter().enumerate() {
        let want = model.apply(op);
        let got = real(&s.client, &root, op);
        prop_assert_eq!(
            &got,
            &want,
            "step {} {:?} (ops so far: {:?})",
            i,
            op,
            &ops[..=i]
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, max_shrink_iters: 2000, ..ProptestConfig::default() })]
    #[test]
    fn matches_reference_model(ops in proptest::collection::vec(op(), 1..60)) {
        run_case(&ops)?;
    }
}

// Shrunk failures found by the property test are kept here as regression
// tests (alongside proptest-regressions/model.txt).

#[test]
fn regression_rename_dir_over_file_is_enotdir() {
    run_case(&[Op::Mkdir(2), Op::Create(0), Op::Rename(2, 0)]).unwrap();
}

#[test]
fn regression_create_below_file_is_enotdir() {
    run_case(&[Op::Create(0), Op::Create(6), Op::Mkdir(6)]).unwrap();
}
