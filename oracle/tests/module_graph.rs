//! The oracle's top-level modules depend on each other without cycles (DESIGN.md section 2:
//! "no module cycles"; issue 14). The test reads the crate's own source: every `crate::x`
//! path (plain or in a `use crate::{..}` group) and every `super::` path that climbs out of a
//! top-level module is an edge from the module whose file holds it to module `x`; comments,
//! doc links and string literals are not. A cycle fails the test with every edge on it and
//! the files that make each edge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Edges between top-level modules: from -> to -> files (relative to `src/`) making the edge.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Other(char),
}

/// The source with comments, string, byte-string, raw-string and char literals blanked out
/// (newlines kept), so only code is left to scan.
fn code_only(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    // Blank c[from..to], keeping newlines.
    let blank = |out: &mut String, from: usize, to: usize| {
        for &ch in &c[from..to.min(c.len())] {
            out.push(if ch == '\n' { '\n' } else { ' ' });
        }
    };
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            let end = c[i..]
                .iter()
                .position(|&x| x == '\n')
                .map_or(c.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if c[i] == '/' && next == Some('*') {
            // Block comments nest.
            let (mut j, mut depth) = (i + 2, 1);
            while j < c.len() && depth > 0 {
                if c[j] == '/' && c.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if c[j] == '*' && c.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if c[i] == 'r'
            && (i == 0 || !ident(c[i - 1]) || (c[i - 1] == 'b' && (i < 2 || !ident(c[i - 2]))))
            && matches!(next, Some('"') | Some('#'))
            && {
                let hashes = c[i + 1..].iter().take_while(|&&x| x == '#').count();
                c.get(i + 1 + hashes) == Some(&'"')
            }
        {
            // Raw string r"..." / r#"..."#: ends at a quote followed by as many hashes.
            let hashes = c[i + 1..].iter().take_while(|&&x| x == '#').count();
            let mut j = i + 2 + hashes;
            while j < c.len() {
                if c[j] == '"'
                    && c[j + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&x| x == '#')
                        .count()
                        == hashes
                {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            blank(&mut out, i, j);
            i = j;
        } else if c[i] == '"' {
            let mut j = i + 1;
            while j < c.len() && c[j] != '"' {
                j += if c[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if c[i] == '\'' && next == Some('\\') {
            // Escaped char literal: '\n', '\'', '\u{1F600}'.
            let end = c[i + 2..]
                .iter()
                .position(|&x| x == '\'')
                .map_or(c.len(), |p| i + 2 + p + 1);
            blank(&mut out, i, end);
            i = end;
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            blank(&mut out, i, i + 3);
            i += 3;
        } else {
            // Anything else, lifetimes ('a) included.
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

fn tokens(code: &str) -> Vec<Tok> {
    let c: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        if ch.is_alphabetic() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(c[start..i].iter().collect()));
            continue;
        }
        if ch == ':' && c.get(i + 1) == Some(&':') {
            out.push(Tok::PathSep);
            i += 2;
            continue;
        }
        match ch {
            '{' => out.push(Tok::Open),
            '}' => out.push(Tok::Close),
            c if c.is_whitespace() => {}
            c => out.push(Tok::Other(c)),
        }
        i += 1;
    }
    out
}

fn ident(t: Option<&Tok>) -> Option<&str> {
    match t {
        Some(Tok::Ident(s)) => Some(s),
        _ => None,
    }
}

/// The names a path continues with at `toks[i]`: one identifier, or the first identifier of
/// each item of a `{..}` group (`self` and globs left out).
fn path_heads(toks: &[Tok], i: usize) -> Vec<String> {
    match toks.get(i) {
        Some(Tok::Ident(s)) => vec![s.clone()],
        Some(Tok::Open) => {
            let mut heads = Vec::new();
            let mut depth = 0;
            let mut expect_head = true;
            for t in &toks[i..] {
                match t {
                    Tok::Open => {
                        depth += 1;
                        if depth > 1 {
                            expect_head = false;
                        }
                    }
                    Tok::Close => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    Tok::Other(',') if depth == 1 => expect_head = true,
                    Tok::Ident(s) if depth == 1 && expect_head => {
                        if s != "self" {
                            heads.push(s.clone());
                        }
                        expect_head = false;
                    }
                    _ if depth == 1 => expect_head = false,
                    _ => {}
                }
            }
            heads
        }
        _ => Vec::new(),
    }
}

/// Top-level modules referenced by one file whose module path is `module` (e.g.
/// `["tune", "space"]`), as (module, the name that resolved to it). `root_names` maps names
/// at the crate root (modules and lib.rs re-exports) to their module; an unknown one is an
/// error so that no edge goes unseen.
fn references(
    src: &str,
    module: &[String],
    root_names: &BTreeMap<String, String>,
) -> Result<Vec<String>, String> {
    let toks = tokens(&code_only(src));
    let mut out = Vec::new();
    // Inline `mod name { .. }` blocks: (name, brace depth at which it closes).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let resolve_root = |name: &str, out: &mut Vec<String>| -> Result<(), String> {
        match root_names.get(name) {
            Some(m) => {
                out.push(m.clone());
                Ok(())
            }
            None => Err(format!(
                "`crate::{name}` is neither a top-level module nor a re-export in lib.rs"
            )),
        }
    };
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Open => depth += 1,
            Tok::Close => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, d)| *d == depth) {
                    inline.pop();
                }
            }
            Tok::Ident(kw) if kw == "mod" => {
                if let (Some(name), Some(Tok::Open)) = (ident(toks.get(i + 1)), toks.get(i + 2)) {
                    inline.push((name.to_string(), depth));
                }
            }
            Tok::Ident(kw) if kw == "crate" && toks.get(i + 1) == Some(&Tok::PathSep) => {
                for head in path_heads(&toks, i + 2) {
                    resolve_root(&head, &mut out)?;
                }
            }
            Tok::Ident(kw)
                if kw == "super"
                    && toks.get(i + 1) == Some(&Tok::PathSep)
                    && (i == 0 || toks[i - 1] != Tok::PathSep) =>
            {
                let mut up = 0;
                let mut j = i;
                while ident(toks.get(j)) == Some("super") && toks.get(j + 1) == Some(&Tok::PathSep)
                {
                    up += 1;
                    j += 2;
                }
                let here: Vec<String> = module
                    .iter()
                    .cloned()
                    .chain(inline.iter().map(|(n, _)| n.clone()))
                    .collect();
                if up > here.len() {
                    return Err(format!(
                        "`super::` climbs above the crate root in {module:?}"
                    ));
                }
                let base = &here[..here.len() - up];
                match base.first() {
                    Some(top) => out.push(top.clone()),
                    None => {
                        for head in path_heads(&toks, j) {
                            resolve_root(&head, &mut out)?;
                        }
                    }
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(out)
}

/// Top-level modules declared in lib.rs (`mod x;` / `pub mod x;`), and the names lib.rs
/// re-exports from them (`pub use error::{FieldError, PlanError};`).
fn crate_root(lib: &str) -> (Vec<String>, BTreeMap<String, String>) {
    let toks = tokens(&code_only(lib));
    let mut modules = Vec::new();
    let mut names = BTreeMap::new();
    for (i, t) in toks.iter().enumerate() {
        if ident(Some(t)) == Some("mod")
            && let (Some(name), Some(Tok::Other(';'))) = (ident(toks.get(i + 1)), toks.get(i + 2))
        {
            modules.push(name.to_string());
            names.insert(name.to_string(), name.to_string());
        }
    }
    for (i, t) in toks.iter().enumerate() {
        if ident(Some(t)) == Some("use")
            && let Some(m) = ident(toks.get(i + 1))
            && modules.iter().any(|x| x == m)
        {
            for t in toks[i + 2..].iter().take_while(|t| **t != Tok::Other(';')) {
                if let Tok::Ident(n) = t
                    && n != "self"
                    && n != "as"
                {
                    names.entry(n.clone()).or_insert_with(|| m.to_string());
                }
            }
        }
    }
    (modules, names)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The module path of a file under `src/`: `tune/space.rs` -> [tune, space], `bench/mod.rs`
/// -> [bench].
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_string());
    }
    parts
}

/// The graph of the crate under `src`.
fn graph_of(src: &Path) -> Result<(Vec<String>, Graph), String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).map_err(|e| format!("lib.rs: {e}"))?;
    let (modules, root_names) = crate_root(&lib);
    let mut graph = Graph::new();
    for m in &modules {
        let mut files = Vec::new();
        let single = src.join(format!("{m}.rs"));
        if single.is_file() {
            files.push(single);
        }
        rust_files(&src.join(m), &mut files);
        if files.is_empty() {
            return Err(format!(
                "module {m}: no {m}.rs or {m}/ under {}",
                src.display()
            ));
        }
        for f in files {
            let rel = f.strip_prefix(src).unwrap_or(&f).to_path_buf();
            let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
            let refs = references(&text, &module_path(&rel), &root_names)
                .map_err(|e| format!("{}: {e}", rel.display()))?;
            for to in refs {
                if &to != m {
                    graph
                        .entry(m.clone())
                        .or_default()
                        .entry(to)
                        .or_default()
                        .insert(rel.display().to_string());
                }
            }
        }
    }
    Ok((modules, graph))
}

/// Every strongly connected component of more than one module (Tarjan), sorted, with one
/// cycle through it.
fn cycles(modules: &[String], graph: &Graph) -> Vec<(Vec<String>, Vec<String>)> {
    struct State<'a> {
        graph: &'a Graph,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        stack: Vec<String>,
        on_stack: BTreeSet<String>,
        next: usize,
        components: Vec<Vec<String>>,
    }
    fn visit(v: &str, st: &mut State) {
        st.index.insert(v.to_string(), st.next);
        st.low.insert(v.to_string(), st.next);
        st.next += 1;
        st.stack.push(v.to_string());
        st.on_stack.insert(v.to_string());
        let targets: Vec<String> = st
            .graph
            .get(v)
            .map(|t| t.keys().cloned().collect())
            .unwrap_or_default();
        for w in targets {
            if !st.index.contains_key(&w) {
                visit(&w, st);
                let lw = st.low[&w];
                let lv = st.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if st.on_stack.contains(&w) {
                let iw = st.index[&w];
                let lv = st.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if st.low[v] == st.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on_stack.remove(&w);
                let done = w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                st.components.push(comp);
            }
        }
    }
    let mut st = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        components: Vec::new(),
    };
    for m in modules {
        if !st.index.contains_key(m) {
            visit(m, &mut st);
        }
    }
    // One cycle through each component: walk inside it until a module repeats.
    st.components
        .iter()
        .map(|comp| {
            let inside: BTreeSet<&String> = comp.iter().collect();
            let mut path = vec![comp[0].clone()];
            loop {
                let here = path.last().cloned().unwrap_or_default();
                let next = graph[&here]
                    .keys()
                    .find(|t| inside.contains(t))
                    .cloned()
                    .unwrap_or_default();
                if let Some(at) = path.iter().position(|p| *p == next) {
                    let mut cycle = path[at..].to_vec();
                    cycle.push(next);
                    break (comp.clone(), cycle);
                }
                path.push(next);
            }
        })
        .collect()
}

fn describe((component, cycle): &(Vec<String>, Vec<String>), graph: &Graph) -> String {
    let mut s = format!(
        "{} (all of {component:?} depend on each other)",
        cycle.join(" -> ")
    );
    for pair in cycle.windows(2) {
        let files: Vec<&String> = graph[&pair[0]][&pair[1]].iter().collect();
        s.push_str(&format!("\n    {} -> {}: {files:?}", pair[0], pair[1]));
    }
    s
}

#[test]
fn oracle_top_level_modules_form_a_dag() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let (modules, graph) = graph_of(&src).expect("the oracle's source reads");
    // The scan sees the crate: known edges are there (a scanner that reads nothing would
    // find no cycle either).
    assert!(modules.len() >= 15, "top-level modules found: {modules:?}");
    for (from, to) in [
        ("projection", "schedule"),
        ("plan", "scenario"),
        ("tune", "projection"),
    ] {
        assert!(
            graph.get(from).is_some_and(|t| t.contains_key(to)),
            "expected edge {from} -> {to} not found; graph: {graph:#?}"
        );
    }
    let found = cycles(&modules, &graph);
    let text: Vec<String> = found.iter().map(|c| describe(c, &graph)).collect();
    assert!(
        found.is_empty(),
        "module cycles in oracle/src:\n  {}",
        text.join("\n  ")
    );
}

/// The scanner and the cycle finder on a small crate written here: a cycle through a
/// `use crate::{..}` group and a `super::super::` path is found; comments, strings and a
/// test module's `use super::*` make no edge.
#[test]
fn a_cycle_is_found_and_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let src = dir.path();
    let write = |p: &str, text: &str| {
        let path = src.join(p);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    };
    write(
        "lib.rs",
        "pub mod a;\npub mod b;\npub mod c;\npub use c::Thing;\n",
    );
    write(
        "a.rs",
        "//! See [`crate::c`].\nuse crate::{b::X, Thing};\nconst S: &str = \"crate::c\";\n",
    );
    write("b/mod.rs", "mod inner;\n");
    write(
        "b/inner.rs",
        "pub fn f() -> char { let _ = super::super::a::g; '\"' }\n#[cfg(test)]\nmod tests { use super::*; }\n",
    );
    write("c.rs", "pub struct Thing<'a>(&'a str);\n");
    let (modules, graph) = graph_of(src).expect("reads");
    assert_eq!(modules, ["a", "b", "c"]);
    let edges: Vec<(String, Vec<String>)> = graph
        .iter()
        .map(|(k, v)| (k.clone(), v.keys().cloned().collect()))
        .collect();
    assert_eq!(
        edges,
        [
            ("a".to_string(), vec!["b".to_string(), "c".to_string()]),
            ("b".to_string(), vec!["a".to_string()]),
        ]
    );
    let found = cycles(&modules, &graph);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0, ["a", "b"]);
    assert_eq!(found[0].1, ["a", "b", "a"]);
    assert_eq!(
        describe(&found[0], &graph),
        "a -> b -> a (all of [\"a\", \"b\"] depend on each other)\n    a -> b: [\"a.rs\"]\n    b -> a: [\"b/inner.rs\"]"
    );
    // An unknown name at the crate root is an error, not a missed edge.
    write("c.rs", "fn f() { crate::nowhere::g() }\n");
    assert!(graph_of(src).unwrap_err().contains("crate::nowhere"));
}
