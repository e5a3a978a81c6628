//! Inode numbers <-> paths: the table the kernel's inode numbers are
//! resolved through (the client names everything by path).

use std::collections::HashMap;

use chfs_proto::path::is_within;

/// One inode known to the kernel.
pub(super) struct Node {
    pub(super) path: String,
    nlookup: u64,
}

/// Inode numbers <-> paths. Inode numbers are the client's `st_ino` (a hash
/// of the path at first lookup), probed on a collision; the root is 1.
pub(super) struct Table {
    pub(super) nodes: HashMap<u64, Node>,
    pub(super) by_path: HashMap<String, u64>,
}

impl Table {
    pub(super) fn new() -> Self {
        let mut t = Table {
            nodes: HashMap::new(),
            by_path: HashMap::new(),
        };
        t.nodes.insert(
            1,
            Node {
                path: "/".into(),
                nlookup: 1,
            },
        );
        t.by_path.insert("/".into(), 1);
        t
    }

    /// The inode of `path` (counting one more kernel lookup).
    pub(super) fn intern(&mut self, path: &str, hint: u64) -> u64 {
        if let Some(&ino) = self.by_path.get(path) {
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.nlookup += 1;
            }
            return ino;
        }
        let mut ino = hint.max(2);
        while self.nodes.contains_key(&ino) {
            ino = ino.wrapping_add(2).max(2);
        }
        self.nodes.insert(
            ino,
            Node {
                path: path.to_string(),
                nlookup: 1,
            },
        );
        self.by_path.insert(path.to_string(), ino);
        ino
    }

    pub(super) fn forget(&mut self, ino: u64, n: u64) {
        if ino == 1 {
            return;
        }
        if let Some(node) = self.nodes.get_mut(&ino) {
            node.nlookup = node.nlookup.saturating_sub(n);
            if node.nlookup == 0 {
                let node = self.nodes.remove(&ino).expect("present");
                if self.by_path.get(&node.path) == Some(&ino) {
                    self.by_path.remove(&node.path);
                }
            }
        }
    }

    /// The name no longer refers to its inode (unlink, rmdir, replaced by
    /// a rename).
    pub(super) fn detach(&mut self, path: &str) {
        self.by_path.remove(path);
    }

    /// Rewrites the paths of `old` and everything below it.
    pub(super) fn rename(&mut self, old: &str, new: &str) -> Vec<u64> {
        self.detach(new);
        let moved: Vec<(String, u64)> = self
            .by_path
            .iter()
            .filter(|(p, _)| is_within(p, old))
            .map(|(p, &i)| (p.clone(), i))
            .collect();
        let mut inos = Vec::new();
        for (p, ino) in moved {
            self.by_path.remove(&p);
            let np = format!("{new}{}", &p[old.len()..]);
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.path = np.clone();
            }
            self.by_path.insert(np, ino);
            inos.push(ino);
        }
        inos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_interns_counts_and_forgets() {
        let mut t = Table::new();
        let a = t.intern("/a", 77);
        assert_eq!(a, 77);
        assert_eq!(t.intern("/a", 77), a);
        // A colliding hint gets another number; the root keeps 1.
        let b = t.intern("/b", 77);
        assert_ne!(b, a);
        assert_ne!(t.intern("/c", 1), 1);
        t.forget(a, 1);
        assert!(t.nodes.contains_key(&a));
        t.forget(a, 1);
        assert!(!t.nodes.contains_key(&a));
        assert!(!t.by_path.contains_key("/a"));
        t.forget(1, 100);
        assert!(t.nodes.contains_key(&1));
    }

    #[test]
    fn table_rename_moves_descendants_only() {
        let mut t = Table::new();
        let d = t.intern("/d", 10);
        let f = t.intern("/d/f", 20);
        let g = t.intern("/d/sub/g", 30);
        let other = t.intern("/dx", 40);
        let victim = t.intern("/e", 50);
        let mut moved = t.rename("/d", "/e");
        moved.sort();
        assert_eq!(moved, vec![d, f, g]);
        assert_eq!(t.nodes[&f].path, "/e/f");
        assert_eq!(t.nodes[&g].path, "/e/sub/g");
        assert_eq!(t.nodes[&other].path, "/dx");
        assert_eq!(t.by_path["/e"], d);
        // The replaced entry keeps its inode (open files) but not its name.
        assert!(t.nodes.contains_key(&victim));
        assert!(!t.by_path.contains_key("/d"));
    }
}
