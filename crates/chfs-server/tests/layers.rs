//! The server's modules form layers without cycles (see the crate
//! documentation, `src/lib.rs`): a module's code names (`crate::...`,
//! `super::...`) only modules of a lower layer. Reads the sources; a new
//! module must be given its layer here.

use std::path::{Path, PathBuf};

/// Modules by layer, lowest first.
const LAYERS: &[&[&str]] = &[
    &["backend", "fabric_ep", "local_io", "metrics", "net", "shm"],
    &["cache"],
    &["config"],
    &["limits", "park", "peer"],
    &["relay"],
    &["state"],
    &["heap"],
    &["handler::common"],
    &["handler::namespace", "handler::pool", "handler::rebalance"],
    &["handler"],
    &["connection::cma"],
    &["connection"],
    &["fabric"],
    &["listener::lanes"],
    &["listener"],
    &["server"],
];

/// `text` without its `#[cfg(test)] mod ... { ... }` blocks (wherever they
/// stand: code after one is still checked).
fn without_test_modules(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("#[cfg(test)]\nmod ") {
        out.push_str(&rest[..i]);
        let block = &rest[i..];
        let open = block.find('{').expect("a test module's body");
        let mut depth = 0;
        let mut end = block.len();
        for (j, c) in block[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + j + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &block[end..];
    }
    out.push_str(rest);
    out
}

#[test]
fn test_modules_are_cut_out_and_what_follows_is_kept() {
    let t = "a\n#[cfg(test)]\nmod tests {\n fn f() { crate::x; }\n}\nb crate::y\n#[cfg(test)]\nfield: u8,\n";
    let c = without_test_modules(t);
    assert!(!c.contains("crate::x"), "{c}");
    assert!(c.contains("b crate::y"), "{c}");
    assert!(c.contains("field: u8"), "{c}");
}

fn layer(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The module a source file defines (`handler/mod.rs`: `handler`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts.join("::")
}

/// The known module a path names (its longest known prefix), if any.
fn named(path: &str) -> Option<String> {
    let parts: Vec<&str> = path.split("::").collect();
    (1..=parts.len())
        .rev()
        .map(|n| parts[..n].join("::"))
        .find(|m| layer(m).is_some())
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            if p.file_name().unwrap() != "bin" {
                sources(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The module paths a line of code names after `prefix` (`crate::` or
/// `super::`), e.g. `handler::handle` in `crate::handler::handle(..)`.
fn paths_after<'a>(line: &'a str, prefix: &str) -> Vec<&'a str> {
    line.match_indices(prefix)
        .filter(|(i, _)| {
            // Not the tail of a longer identifier (`my_crate::`).
            !line[..*i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
        .map(|(i, _)| {
            let rest = &line[i + prefix.len()..];
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            rest[..end].trim_end_matches(':')
        })
        .filter(|p| !p.is_empty())
        .collect()
}

#[test]
fn modules_use_only_lower_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    let mut problems = Vec::new();
    for f in &files {
        let module = module_of(&src, f);
        if module == "lib" {
            continue;
        }
        let Some(mine) = layer(&module) else {
            problems.push(format!(
                "{}: module {module} has no layer in tests/layers.rs",
                f.display()
            ));
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap();
        // Unit tests are not part of the graph.
        let code = without_test_modules(&text);
        let parent = module.rsplit_once("::").map(|(p, _)| p);
        for (n, line) in code.lines().enumerate() {
            let t = line.trim_start();
            if t.starts_with("//") {
                continue;
            }
            let mut used: Vec<String> = paths_after(line, "crate::")
                .into_iter()
                .map(str::to_string)
                .collect();
            if let Some(parent) = parent {
                used.extend(
                    paths_after(line, "super::")
                        .into_iter()
                        .map(|p| format!("{parent}::{p}")),
                );
            }
            for u in used {
                let Some(target) = named(&u) else {
                    continue;
                };
                let theirs = layer(&target).unwrap();
                if target != module && theirs >= mine {
                    problems.push(format!(
                        "{}:{}: {module} (layer {mine}) uses {target} (layer {theirs}): {}",
                        f.display(),
                        n + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The check sees a use up the layers.
#[test]
fn an_upward_use_is_seen() {
    assert_eq!(
        paths_after("    crate::handler::handle(sh, req).await", "crate::"),
        ["handler::handle"]
    );
    assert_eq!(named("handler::handle").as_deref(), Some("handler"));
    assert_eq!(
        named("connection::cma::peer_pid").as_deref(),
        Some("connection::cma")
    );
    assert!(paths_after("my_crate::x", "crate::").is_empty());
    assert!(layer("state") < layer("handler"));
}
