//! Import cycles between the modules of one crate.
//!
//! A crate's modules are found from its roots (`src/lib.rs`, `src/main.rs`) through their
//! `mod name;` declarations. A module's references are the `crate::…` and `super::…`
//! paths in its code: comments, string literals and test code (`#[cfg(test)]` items and
//! modules) are left out, so a doc link or a test helper does not count. References are
//! taken at the granularity of the crate's top-level modules (`crate::exec::Chain` is an
//! edge to `exec`, whatever file under `exec` it comes from); a name the root re-exports
//! (`pub use exec::Chain;` in lib.rs) counts as its module. References to the root itself
//! and between a module and its own submodules are not edges. A cycle is a strongly
//! connected component of two or more top-level modules.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One reference from a module to another, where it was written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Edge {
    /// The top-level module the reference is in.
    pub from: String,
    /// The top-level module it names.
    pub to: String,
    /// The file and line (relative to the crate's directory).
    pub at: String,
}

/// The module graph of one crate root.
#[derive(Debug, Clone, Default)]
pub struct ModuleGraph {
    /// The root file, relative to the crate's directory (`src/lib.rs`).
    pub root: String,
    /// Every top-level module.
    pub modules: BTreeSet<String>,
    /// Every reference between two different top-level modules.
    pub edges: Vec<Edge>,
}

impl ModuleGraph {
    /// The cycles: each strongly connected component of two or more modules, with the
    /// edges inside it.
    pub fn cycles(&self) -> Vec<(BTreeSet<String>, Vec<Edge>)> {
        let mut adj: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for m in &self.modules {
            adj.entry(m).or_default();
        }
        for e in &self.edges {
            adj.entry(&e.from).or_default().insert(&e.to);
            adj.entry(&e.to).or_default();
        }
        strongly_connected(&adj)
            .into_iter()
            .filter(|c| c.len() > 1)
            .map(|c| {
                let set: BTreeSet<String> = c.iter().map(|s| s.to_string()).collect();
                let inside = self
                    .edges
                    .iter()
                    .filter(|e| set.contains(&e.from) && set.contains(&e.to))
                    .cloned()
                    .collect();
                (set, inside)
            })
            .collect()
    }
}

/// Tarjan's algorithm, iteratively deep enough for any crate.
fn strongly_connected<'a>(adj: &BTreeMap<&'a str, BTreeSet<&'a str>>) -> Vec<Vec<&'a str>> {
    struct State<'a> {
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        out: Vec<Vec<&'a str>>,
    }
    fn visit<'a>(v: &'a str, adj: &BTreeMap<&'a str, BTreeSet<&'a str>>, s: &mut State<'a>) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for &w in &adj[v] {
            if !s.index.contains_key(w) {
                visit(w, adj, s);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(w);
                if w == v {
                    break;
                }
            }
            comp.sort_unstable();
            s.out.push(comp);
        }
    }
    let mut s = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for &v in adj.keys() {
        if !s.index.contains_key(v) {
            visit(v, adj, &mut s);
        }
    }
    s.out
}

/// `src` with comments, string and character literals blanked out (newlines kept, so
/// line numbers stay).
pub fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let blank = |out: &mut Vec<u8>, bytes: &[u8]| {
        out.extend(bytes.iter().map(|&c| if c == b'\n' { b'\n' } else { b' ' }))
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        let prev_ident = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            let mut j = 0;
            while j < rest.len() {
                if rest[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, &rest[..j]);
            i += j;
        } else if !prev_ident
            && (rest.starts_with(b"r\"")
                || rest.starts_with(b"r#")
                || rest.starts_with(b"br\"")
                || rest.starts_with(b"br#"))
        {
            // Raw string: r##"…"##.
            let start = if rest[0] == b'b' { 2 } else { 1 };
            let hashes = rest[start..].iter().take_while(|&&c| c == b'#').count();
            if rest.get(start + hashes) != Some(&b'"') {
                out.push(b[i]);
                i += 1;
                continue;
            }
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let body = start + hashes + 1;
            let end = rest[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(rest.len(), |p| body + p + close.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'"' || (!prev_ident && rest.starts_with(b"b\"")) {
            let start = if rest[0] == b'b' { 2 } else { 1 };
            let mut j = start;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'\'' {
            // A character literal ('x', '\n', '\u{1F600}'), or a lifetime ('a).
            let len = if rest.get(1) == Some(&b'\\') {
                rest.get(3..)
                    .and_then(|r| r.iter().position(|&c| c == b'\''))
                    .map(|p| p + 4)
            } else {
                let width = match rest.get(1) {
                    Some(&c) if c < 0x80 => 1,
                    Some(&c) if c < 0xe0 => 2,
                    Some(&c) if c < 0xf0 => 3,
                    Some(_) => 4,
                    None => 0,
                };
                (width > 0 && rest.get(1 + width) == Some(&b'\'')).then_some(width + 2)
            };
            match len {
                Some(n) => {
                    blank(&mut out, &rest[..n]);
                    i += n;
                }
                None => {
                    out.push(b'\'');
                    i += 1;
                }
            }
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// The end (exclusive) of the item starting at `from` in code: its first `;` at brace
/// depth 0, or its closing brace.
fn item_end(code: &[u8], from: usize) -> usize {
    let mut depth = 0usize;
    for (j, &c) in code.iter().enumerate().skip(from) {
        match c {
            b'{' => depth += 1,
            b'}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return j + 1;
                }
            }
            b';' if depth == 0 => return j + 1,
            _ => {}
        }
    }
    code.len()
}

/// `code` (already [`code_only`]) with every `#[cfg(test)]` item blanked, and the names of
/// the `mod x;` declarations that are test-only.
fn without_test_items(code: &str) -> (String, BTreeSet<String>) {
    let mut b = code.as_bytes().to_vec();
    let mut test_mods = BTreeSet::new();
    let mut search = 0;
    while let Some(at) = find(&b, b"#[cfg(test)]", search) {
        let item = at + b"#[cfg(test)]".len();
        let end = item_end(&b, item);
        let text = String::from_utf8_lossy(&b[item..end]).to_string();
        let words: Vec<&str> = text
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ';'))
            .filter(|w| !w.is_empty())
            .collect();
        if let Some(p) = words.iter().position(|w| *w == "mod") {
            if let Some(name) = words.get(p + 1) {
                test_mods.insert(name.trim_end_matches(';').to_string());
            }
        }
        for c in &mut b[at..end] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        search = end;
    }
    (String::from_utf8(b).unwrap_or_default(), test_mods)
}

fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    hay.get(from..)?
        .windows(needle.len())
        .position(|w| w == needle)
        .map(|p| p + from)
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The `mod name;` declarations (not inline modules) in code.
fn declared_modules(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let mut from = 0;
    while let Some(at) = find(b, b"mod ", from) {
        from = at + 4;
        if at > 0 && is_ident(b[at - 1]) {
            continue;
        }
        let name: String = code[at + 4..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        let after = code[at + 4..].trim_start()[name.len()..].trim_start();
        if !name.is_empty() && after.starts_with(';') {
            out.push(name);
        }
    }
    out
}

/// An inline `mod name {` block: where its body starts and ends.
fn inline_modules(code: &str) -> Vec<(String, usize, usize)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = find(b, b"mod ", from) {
        from = at + 4;
        if at > 0 && is_ident(b[at - 1]) {
            continue;
        }
        let rest = code[at + 4..].trim_start();
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() || !rest[name.len()..].trim_start().starts_with('{') {
            continue;
        }
        let open = at + 4 + code[at + 4..].find('{').unwrap_or(0);
        let end = item_end(b, open);
        out.push((name, open, end));
    }
    out
}

/// The paths named right after each `crate::` and `super::…` in `code`, as (byte offset,
/// module path relative to the crate root). `module` is the module the code is in;
/// inline modules deepen it where they start.
fn references(code: &str, module: &[String]) -> Vec<(usize, Vec<String>)> {
    let b = code.as_bytes();
    let inline = inline_modules(code);
    let module_at = |pos: usize| -> Vec<String> {
        let mut m = module.to_vec();
        for (name, open, end) in &inline {
            if *open < pos && pos < *end {
                m.push(name.clone());
            }
        }
        m
    };
    let mut out = Vec::new();
    for prefix in ["crate::", "super::"] {
        let mut from = 0;
        while let Some(at) = find(b, prefix.as_bytes(), from) {
            from = at + prefix.len();
            if at > 0 && (is_ident(b[at - 1]) || b[at - 1] == b'$' || b[at - 1] == b':') {
                continue;
            }
            let mut base = if prefix == "crate::" {
                Vec::new()
            } else {
                let mut m = module_at(at);
                m.pop();
                m
            };
            let mut rest = &code[at + prefix.len()..];
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
            for path in use_paths(rest) {
                let mut full = base.clone();
                full.extend(path);
                out.push((at, full));
            }
        }
    }
    out
}

/// The paths a `use`-style tail names: `a::b::C` → `[a, b, C]`; `{a::X, b}` → `[a, X]`,
/// `[b]`; `self` items are dropped.
fn use_paths(rest: &str) -> Vec<Vec<String>> {
    let rest = rest.trim_start();
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 0;
        let mut items = Vec::new();
        let mut current = String::new();
        for c in group.chars() {
            match c {
                '{' => {
                    depth += 1;
                    current.push(c);
                }
                '}' if depth == 0 => break,
                '}' => {
                    depth -= 1;
                    current.push(c);
                }
                ',' if depth == 0 => items.push(std::mem::take(&mut current)),
                c => current.push(c),
            }
        }
        items.push(current);
        return items
            .iter()
            .flat_map(|i| use_paths(i))
            .filter(|p| p.first().is_some_and(|s| s != "self"))
            .collect();
    }
    let mut path = Vec::new();
    let mut r = rest;
    loop {
        let seg: String = r
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if seg.is_empty() {
            if let Some(g) = r.strip_prefix('{') {
                let mut nested = use_paths(&format!("{{{g}"));
                if nested.is_empty() {
                    return vec![path];
                }
                for n in &mut nested {
                    let mut p = path.clone();
                    p.append(n);
                    *n = p;
                }
                return nested;
            }
            break;
        }
        r = &r[seg.len()..];
        path.push(seg);
        match r.strip_prefix("::") {
            Some(next) => r = next,
            None => break,
        }
    }
    if path.is_empty() {
        Vec::new()
    } else {
        vec![path]
    }
}

/// The module file for `name` declared in a module whose own files' directory is `dir`.
fn module_file(dir: &Path, name: &str) -> Option<PathBuf> {
    [
        dir.join(format!("{name}.rs")),
        dir.join(name).join("mod.rs"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// The directory a module's submodules live in: `src/` for a root, `src/x/` for
/// `src/x.rs` or `src/x/mod.rs`.
fn child_dir(file: &Path, is_root: bool) -> PathBuf {
    let parent = file.parent().unwrap_or(Path::new("")).to_path_buf();
    if is_root || file.file_name().is_some_and(|n| n == "mod.rs") {
        parent
    } else {
        parent.join(file.file_stem().unwrap_or_default())
    }
}

/// What `pub use module::{A, B}` lines in the root make available at the crate root:
/// name → the top-level module it comes from.
fn root_reexports(code: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for stmt in code.split(';') {
        let s = stmt.trim();
        let Some(tail) = s
            .strip_prefix("pub use ")
            .or_else(|| s.strip_prefix("pub(crate) use "))
        else {
            continue;
        };
        let tail = tail
            .trim_start_matches("crate::")
            .trim_start_matches("self::");
        for path in use_paths(tail) {
            if let (Some(first), Some(last)) = (path.first(), path.last()) {
                if modules.contains(first) && path.len() > 1 {
                    out.insert(last.clone(), first.clone());
                }
            }
        }
    }
    out
}

/// The module graph of the crate rooted at `root` (a file under `crate_dir`).
pub fn module_graph(crate_dir: &Path, root: &Path) -> std::io::Result<ModuleGraph> {
    // Walk the `mod x;` declarations from the root.
    let mut files: Vec<(PathBuf, Vec<String>)> = Vec::new();
    let mut queue = vec![(root.to_path_buf(), Vec::<String>::new())];
    while let Some((file, path)) = queue.pop() {
        let text = std::fs::read_to_string(&file)?;
        let (code, test_mods) = without_test_items(&code_only(&text));
        let dir = child_dir(&file, path.is_empty());
        for name in declared_modules(&code) {
            if test_mods.contains(&name) {
                continue;
            }
            if let Some(child) = module_file(&dir, &name) {
                let mut p = path.clone();
                p.push(name);
                queue.push((child, p));
            }
        }
        files.push((file, path));
    }
    let modules: BTreeSet<String> = files
        .iter()
        .filter_map(|(_, p)| p.first().cloned())
        .collect();
    let root_code = without_test_items(&code_only(&std::fs::read_to_string(root)?)).0;
    let reexports = root_reexports(&root_code, &modules);

    let mut edges = BTreeSet::new();
    for (file, path) in &files {
        let Some(from) = path.first() else {
            continue; // the root: it declares and re-exports everything
        };
        let text = std::fs::read_to_string(file)?;
        let (code, _) = without_test_items(&code_only(&text));
        for (offset, target) in references(&code, path) {
            let to = match target.first() {
                Some(first) if modules.contains(first) => first.clone(),
                Some(name) => match reexports.get(name) {
                    Some(m) => m.clone(),
                    None => continue, // an item of the root itself
                },
                None => continue,
            };
            if &to != from {
                let line = code[..offset].matches('\n').count() + 1;
                let rel = file.strip_prefix(crate_dir).unwrap_or(file);
                edges.insert(Edge {
                    from: from.clone(),
                    to,
                    at: format!("{}:{line}", rel.display()),
                });
            }
        }
    }
    Ok(ModuleGraph {
        root: root
            .strip_prefix(crate_dir)
            .unwrap_or(root)
            .display()
            .to_string(),
        modules,
        edges: edges.into_iter().collect(),
    })
}

/// The module graphs of every root of the crate in `crate_dir` (`src/lib.rs`,
/// `src/main.rs`).
pub fn crate_graphs(crate_dir: &Path) -> std::io::Result<Vec<ModuleGraph>> {
    ["src/lib.rs", "src/main.rs"]
        .iter()
        .map(|r| crate_dir.join(r))
        .filter(|r| r.is_file())
        .map(|r| module_graph(crate_dir, &r))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comments_strings_and_chars_are_blanked() {
        let src =
            "let a = \"crate::x\"; // crate::y\n/* crate::z /* n */ */ let c = '\"'; let e = '€'; \
                   let r = r#\"crate::w\"#; fn f<'a>(x: &'a str) { crate::v::f() }";
        let code = code_only(src);
        assert_eq!(code.len(), src.len());
        assert_eq!(code.matches("crate::").count(), 1, "{code}");
        assert!(code.contains("crate::v::f()"));
        assert!(code.contains("fn f<'a>(x: &'a str)"));
    }

    #[test]
    fn paths_groups_and_super() {
        assert_eq!(use_paths("a::b::C;"), [vec!["a", "b", "C"]]);
        assert_eq!(
            use_paths("{a::X, b::{Y, Z}, self};"),
            [vec!["a", "X"], vec!["b", "Y"], vec!["b", "Z"]]
        );
        let m = vec!["x".to_string(), "y".to_string()];
        let refs: Vec<_> = references(
            "use super::super::z::W; mod t { fn f() { super::q(); } }",
            &m,
        )
        .into_iter()
        .map(|(_, p)| p.join("::"))
        .collect();
        assert_eq!(refs, ["z::W", "x::y::q"]);
    }

    fn scratch(files: &[(&str, &str)]) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "repo-checks-imports-{}-{}",
            std::process::id(),
            files.len()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in files {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        dir
    }

    #[test]
    fn a_cycle_is_found_and_comments_tests_and_the_root_do_not_make_one() {
        let dir = scratch(&[
            (
                "src/lib.rs",
                "pub mod a;\npub mod b;\nmod c;\npub use b::Thing;\n#[cfg(test)]\nmod t;\n",
            ),
            ("src/a.rs", "use crate::b::x;\npub fn y() {}\n"),
            (
                "src/b.rs",
                "pub fn x() { super::a::y() }\npub struct Thing;\n",
            ),
            (
                "src/c.rs",
                "//! [`crate::a`]\nuse crate::Thing;\n#[cfg(test)]\nmod tests { use crate::d; }\n",
            ),
            ("src/t.rs", "use crate::c;\n"),
        ]);
        let g = &crate_graphs(&dir).unwrap()[0];
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(g.modules, ["a", "b", "c"].map(String::from).into());
        let edges: Vec<_> = g
            .edges
            .iter()
            .map(|e| format!("{}->{} {}", e.from, e.to, e.at))
            .collect();
        assert_eq!(
            edges,
            ["a->b src/a.rs:1", "b->a src/b.rs:1", "c->b src/c.rs:2"]
        );
        let cycles = g.cycles();
        assert_eq!(cycles.len(), 1);
        assert_eq!(cycles[0].0, ["a", "b"].map(String::from).into());
    }

    #[test]
    fn submodules_and_inline_modules_resolve_super() {
        let dir = scratch(&[
            ("src/lib.rs", "mod p;\nmod q;\n"),
            ("src/p.rs", "mod inner;\n"),
            (
                "src/p/inner.rs",
                "use super::super::q::Z;\nmod m { use super::super::super::q::W; }\n",
            ),
            ("src/q.rs", "pub struct Z;\npub struct W;\n"),
        ]);
        let g = &crate_graphs(&dir).unwrap()[0];
        std::fs::remove_dir_all(&dir).unwrap();
        let edges: Vec<_> = g.edges.iter().map(|e| e.at.clone()).collect();
        assert_eq!(
            edges,
            ["src/p/inner.rs:1", "src/p/inner.rs:2"],
            "{:?}",
            g.edges
        );
        assert!(g.cycles().is_empty());
    }
}
