//! The source layout: no module names another that (directly or through others) names it
//! back. Every `crate::…` and `super::…` path outside unit tests counts, doc links
//! included; a module and its own submodules are one unit here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`sse::relay`) -> its file's text, unit tests cut off.
fn modules() -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, root, out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(root).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            if parts == ["lib"] || parts == ["main"] {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let text = text
                .split("#[cfg(test)]\nmod tests")
                .next()
                .unwrap()
                .to_owned();
            out.insert(parts.join("::"), text);
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out = BTreeMap::new();
    walk(&root, &root, &mut out);
    out
}

/// The longest known module that `path` (`a::b::c`) starts with.
fn resolve<'a>(mods: &'a BTreeMap<String, String>, path: &str) -> Option<&'a String> {
    let parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
    (1..=parts.len())
        .rev()
        .find_map(|n| mods.get_key_value(&parts[..n].join("::")).map(|(k, _)| k))
}

fn related(a: &str, b: &str) -> bool {
    a == b || a.starts_with(&format!("{b}::")) || b.starts_with(&format!("{a}::"))
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let mods = modules();
    assert!(mods.contains_key("layers::forward") && mods.contains_key("sse::relay"));
    let mut deps: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (m, text) in &mods {
        let parent = m.rsplit_once("::").map_or("", |(p, _)| p);
        for (prefix, base) in [("crate::", ""), ("super::", parent)] {
            for (at, _) in text.match_indices(prefix) {
                let rest = &text[at + prefix.len()..];
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                    .unwrap_or(rest.len());
                let path = if base.is_empty() {
                    rest[..end].to_owned()
                } else {
                    format!("{base}::{}", &rest[..end])
                };
                if let Some(target) = resolve(&mods, &path) {
                    if !related(m, target) {
                        deps.entry(m.as_str()).or_default().insert(target.as_str());
                    }
                }
            }
        }
    }
    let mut cycles = Vec::new();
    for (a, targets) in &deps {
        for b in targets {
            let (mut seen, mut stack) = (BTreeSet::from([*b]), vec![*b]);
            while let Some(x) = stack.pop() {
                if x == *a {
                    cycles.push(format!("{a} -> {b}"));
                    break;
                }
                for y in deps.get(x).into_iter().flatten() {
                    if seen.insert(*y) {
                        stack.push(*y);
                    }
                }
            }
        }
    }
    assert!(cycles.is_empty(), "imports on a cycle: {cycles:?}");
}
