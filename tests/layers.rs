//! One floor per layer: every file of `src/` imports only its own layer or
//! the layers below it, and no files import each other in a loop.
//!
//! The order, from the ground up (docs/architecture.md): `error`, `log`, `random`, `kinds`,
//! `sync`, `counters`, `transfer` (the ground), `cuda` (the driver only),
//! `memory`, `control`, `transport`, `engine`, `ffi`. An import is any path
//! that names a module file: `crate::a::b`, `super::x`, `self::x`, or a
//! child module declared in the file (`child::Item`), in `use` lines and in
//! code alike (comments and strings are skipped; test modules count too). A
//! path stops at the deepest module that has a file, so `crate::memory::X`
//! names `memory/mod.rs` even when `X` is re-exported from a child: name the
//! child. Names that `lib.rs` re-exports (`crate::Engine`) resolve to the
//! module they come from. `src/bin` and `lib.rs` itself are not checked.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// The layers, lowest first.
const LAYERS: &[&str] = &[
    "error",
    "log",
    "random",
    "kinds",
    "sync",
    "counters",
    "transfer",
    "cuda",
    "memory",
    "control",
    "transport",
    "discovery",
    "engine",
    "ffi",
];

/// One token of cleaned source.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Path, // `::`
    Open,
    Close,
    Comma,
    Star,
    Other(char),
}

/// Source text with comments, string and char literals blanked out.
fn clean(src: &str) -> String {
    let b: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r' && (next == Some('"') || (next == Some('#') && !prev_is_ident(&b, i))) {
            // Raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            'raw: while j < b.len() {
                if b[j] == '"' && (0..hashes).all(|h| b.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break 'raw;
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A char literal ('x', '\n', '\''), or a lifetime ('a).
            if next == Some('\\') {
                i += 2;
                while i < b.len() && b[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if b.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn prev_is_ident(b: &[char], i: usize) -> bool {
    i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_')
}

fn tokens(clean: &str) -> Vec<Tok> {
    let b: Vec<char> = clean.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_alphabetic() || c == '_' {
            let s = i;
            while i < b.len() && (b[i].is_alphanumeric() || b[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(b[s..i].iter().collect()));
            continue;
        }
        if c == ':' && b.get(i + 1) == Some(&':') {
            out.push(Tok::Path);
            i += 2;
            continue;
        }
        match c {
            '{' => out.push(Tok::Open),
            '}' => out.push(Tok::Close),
            ',' => out.push(Tok::Comma),
            '*' => out.push(Tok::Star),
            c if c.is_whitespace() => {}
            c => out.push(Tok::Other(c)),
        }
        i += 1;
    }
    out
}

/// Parses a use-tree (or an inline path) at `toks[*i]` under `prefix`,
/// pushing every full path it names.
fn use_tree(toks: &[Tok], i: &mut usize, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    match toks.get(*i) {
        Some(Tok::Open) => {
            *i += 1;
            loop {
                match toks.get(*i) {
                    Some(Tok::Close) => {
                        *i += 1;
                        return;
                    }
                    Some(Tok::Comma) => *i += 1,
                    None => return,
                    _ => {
                        let before = *i;
                        use_tree(toks, i, prefix.clone(), out);
                        if *i == before {
                            *i += 1;
                        }
                    }
                }
            }
        }
        Some(Tok::Star) => {
            *i += 1;
            out.push(prefix);
        }
        Some(Tok::Ident(id)) => {
            *i += 1;
            let mut p = prefix;
            if id != "self" {
                p.push(id.clone());
            }
            if toks.get(*i) == Some(&Tok::Path) {
                *i += 1;
                use_tree(toks, i, p, out);
            } else {
                out.push(p);
            }
        }
        _ => out.push(prefix),
    }
}

/// A module file of `src/`.
struct ModFile {
    rel: String,
    module: Vec<String>,
    toks: Vec<Tok>,
    /// Child modules declared with `mod name;` (files).
    children: BTreeSet<String>,
}

fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs").to_string();
    if stem != "mod" && stem != "lib" {
        parts.push(stem);
    }
    parts
}

fn declared_children(toks: &[Tok]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for w in toks.windows(3) {
        if let [Tok::Ident(m), Tok::Ident(name), Tok::Other(';')] = w {
            if m == "mod" {
                out.insert(name.clone());
            }
        }
    }
    out
}

fn walk(dir: &Path, root: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir).expect("read src").map(|e| e.expect("entry").path()).collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n == "bin") && dir == root {
                continue;
            }
            walk(&p, root, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// What the check found: imports that go up a layer, and loops.
#[derive(Debug, Default)]
struct Findings {
    upward: Vec<String>,
    loops: Vec<Vec<String>>,
    unplaced: Vec<String>,
    /// Files of one transport (`transport/tcp/`, `transport/ipc/`) that
    /// reach a file of the other through imports, directly or through
    /// files of neither: what both need lives below them.
    across: Vec<String>,
    edges: usize,
}

/// The transport a module belongs to (`tcp` or `ipc`), if any.
fn transport_of(module: &[String]) -> Option<&str> {
    match module {
        [t, k, ..] if t == "transport" && (k == "tcp" || k == "ipc") => Some(k.as_str()),
        _ => None,
    }
}

fn check(src: &Path) -> Findings {
    let mut paths = Vec::new();
    walk(src, src, &mut paths);
    let mut files: Vec<ModFile> = Vec::new();
    for p in &paths {
        let rel = p.strip_prefix(src).expect("under src");
        let text = std::fs::read_to_string(p).expect("read a source file");
        let toks = tokens(&clean(&text));
        let children = declared_children(&toks);
        files.push(ModFile { rel: rel.to_string_lossy().into_owned(), module: module_of(rel), toks, children });
    }
    // Only files some parent declares are modules (an `include!`d table is not).
    let declared: BTreeSet<Vec<String>> = files
        .iter()
        .flat_map(|f| {
            f.children.iter().map(move |c| {
                let mut m = f.module.clone();
                m.push(c.clone());
                m
            })
        })
        .chain(std::iter::once(Vec::new()))
        .collect();
    files.retain(|f| declared.contains(&f.module));
    let by_module: HashMap<Vec<String>, usize> = files.iter().enumerate().map(|(i, f)| (f.module.clone(), i)).collect();
    let deepest = |path: &[String]| -> (usize, usize) {
        (0..=path.len()).rev().find_map(|n| by_module.get(&path[..n]).map(|i| (*i, n))).expect("the root exists")
    };
    // Names lib.rs re-exports, and where they come from.
    let root = by_module[&Vec::new()];
    let mut reexports: HashMap<String, usize> = HashMap::new();
    {
        let t = &files[root].toks;
        let mut i = 0;
        while i + 1 < t.len() {
            if t[i] == Tok::Ident("pub".into()) && t[i + 1] == Tok::Ident("use".into()) {
                i += 2;
                let mut found = Vec::new();
                use_tree(t, &mut i, Vec::new(), &mut found);
                for p in found {
                    if let Some(name) = p.last() {
                        reexports.insert(name.clone(), deepest(&p[..p.len() - 1]).0);
                    }
                }
            } else {
                i += 1;
            }
        }
    }
    let mut findings = Findings::default();
    let mut graph: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    let layer = |m: &[String]| m.first().and_then(|s| LAYERS.iter().position(|l| l == s));
    for (fi, f) in files.iter().enumerate() {
        if fi == root {
            continue;
        }
        if layer(&f.module).is_none() {
            findings.unplaced.push(f.rel.clone());
            continue;
        }
        // Inline modules (`mod tests { .. }`) change what `super` means.
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0usize;
        let t = &f.toks;
        let mut i = 0;
        while i < t.len() {
            match &t[i] {
                Tok::Open => {
                    depth += 1;
                    i += 1;
                    continue;
                }
                Tok::Close => {
                    if inline.last().is_some_and(|(_, d)| *d == depth) {
                        inline.pop();
                    }
                    depth = depth.saturating_sub(1);
                    i += 1;
                    continue;
                }
                Tok::Ident(m) if m == "mod" => {
                    if let (Some(Tok::Ident(name)), Some(Tok::Open)) = (t.get(i + 1), t.get(i + 2)) {
                        inline.push((name.clone(), depth + 1));
                    }
                    i += 1;
                    continue;
                }
                _ => {}
            }
            let starts_path = i == 0 || t[i - 1] != Tok::Path;
            let here: Vec<String> = f.module.iter().cloned().chain(inline.iter().map(|(n, _)| n.clone())).collect();
            // Where the path starts resolving, and its first segment's token.
            let start: Option<(Vec<String>, usize)> = match (&t[i], t.get(i + 1)) {
                (Tok::Ident(w), Some(Tok::Path)) if starts_path && w == "crate" => Some((Vec::new(), i + 2)),
                (Tok::Ident(w), Some(Tok::Path)) if starts_path && w == "self" => Some((here.clone(), i + 2)),
                (Tok::Ident(w), Some(Tok::Path)) if starts_path && w == "super" => {
                    let mut b = here.clone();
                    let mut j = i;
                    while t.get(j) == Some(&Tok::Ident("super".into())) && t.get(j + 1) == Some(&Tok::Path) {
                        b.pop();
                        j += 2;
                    }
                    Some((b, j))
                }
                (Tok::Ident(w), Some(Tok::Path)) if starts_path && inline.is_empty() && f.children.contains(w) => {
                    Some((here.clone(), i))
                }
                _ => None,
            };
            let Some((base, first)) = start else {
                i += 1;
                continue;
            };
            i = first;
            let mut found = Vec::new();
            use_tree(t, &mut i, base, &mut found);
            for p in found {
                let (mut target, n) = deepest(&p);
                if target == root {
                    match p.get(n).and_then(|name| reexports.get(name)) {
                        Some(t) => target = *t,
                        None => continue,
                    }
                }
                if target == fi {
                    continue;
                }
                graph.entry(fi).or_default().insert(target);
                let (from, to) = (layer(&f.module), layer(&files[target].module));
                if let (Some(a), Some(b)) = (from, to) {
                    if b > a {
                        findings.upward.push(format!(
                            "src/{} ({}) imports src/{} ({}) through `{}`",
                            f.rel,
                            LAYERS[a],
                            files[target].rel,
                            LAYERS[b],
                            p.join("::")
                        ));
                    }
                }
            }
        }
    }
    findings.edges = graph.values().map(|s| s.len()).sum();
    // Each transport's files, and what they reach (breadth first, the
    // shortest chain named).
    for (from, f) in files.iter().enumerate() {
        let Some(a) = transport_of(&f.module) else { continue };
        let mut came: HashMap<usize, usize> = HashMap::from([(from, from)]);
        let mut queue = std::collections::VecDeque::from([from]);
        while let Some(v) = queue.pop_front() {
            for &w in graph.get(&v).into_iter().flatten() {
                if came.contains_key(&w) {
                    continue;
                }
                came.insert(w, v);
                match transport_of(&files[w].module) {
                    Some(b) if b != a => {
                        let mut chain = vec![format!("src/{}", files[w].rel)];
                        let mut at = v;
                        while at != from {
                            chain.push(format!("src/{}", files[at].rel));
                            at = came[&at];
                        }
                        chain.push(format!("src/{}", f.rel));
                        chain.reverse();
                        findings.across.push(format!("{a} reaches {b}: {}", chain.join(" -> ")));
                    }
                    _ => queue.push_back(w),
                }
            }
        }
    }
    findings.upward.sort();
    findings.upward.dedup();
    findings.across.sort();
    findings.across.dedup();
    // Loops: strongly connected components of more than one file (Tarjan).
    struct Tarjan<'a> {
        g: &'a BTreeMap<usize, BTreeSet<usize>>,
        index: HashMap<usize, usize>,
        low: HashMap<usize, usize>,
        stack: Vec<usize>,
        on: BTreeSet<usize>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    impl Tarjan<'_> {
        fn visit(&mut self, v: usize) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on.insert(v);
            for &w in self.g.get(&v).into_iter().flatten() {
                if !self.index.contains_key(&w) {
                    self.visit(w);
                    let l = self.low[&v].min(self.low[&w]);
                    self.low.insert(v, l);
                } else if self.on.contains(&w) {
                    let l = self.low[&v].min(self.index[&w]);
                    self.low.insert(v, l);
                }
            }
            if self.low[&v] == self.index[&v] {
                let mut comp = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on.remove(&w);
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    self.out.push(comp);
                }
            }
        }
    }
    let mut tj = Tarjan {
        g: &graph,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in 0..files.len() {
        if !tj.index.contains_key(&v) {
            tj.visit(v);
        }
    }
    for comp in tj.out {
        let mut names: Vec<String> = comp.iter().map(|i| format!("src/{}", files[*i].rel)).collect();
        names.sort();
        findings.loops.push(names);
    }
    findings
}

#[test]
fn every_file_imports_only_its_layer_or_below_and_nothing_loops() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let f = check(&src);
    assert!(f.edges > 100, "the check saw only {} imports in src/: it is not reading the code", f.edges);
    assert!(f.unplaced.is_empty(), "files outside every layer (add the module to LAYERS): {:?}", f.unplaced);
    assert!(f.upward.is_empty(), "imports from a lower layer to a higher one:\n{}", f.upward.join("\n"));
    assert!(f.loops.is_empty(), "files that import each other in a loop:\n{:#?}", f.loops);
}

/// The TCP and IPC transports share what they both need from below them
/// (`control/wire.rs`, `control/pipe.rs`, `transport/reactor.rs`), never
/// from each other, directly or through a shared file: a fault in one is
/// not chased into the other's files (the IPC channel once reached the TCP
/// driver's pipe and the TCP source core through `transport/wire.rs`).
#[test]
fn the_two_transports_import_nothing_of_each_other() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let f = check(&src);
    assert!(f.edges > 100, "the check saw only {} imports in src/: it is not reading the code", f.edges);
    assert!(f.across.is_empty(), "files of one transport that reach the other's:\n{}", f.across.join("\n"));
}

/// The check itself finds what it must: an upward import through a
/// grouped `use`, one in code, one through a root re-export, and a loop
/// through a child module and `super`; test modules' `super::*` is no loop.
#[test]
fn the_check_finds_upward_imports_and_loops() {
    let dir = std::env::temp_dir().join(format!("orbite-layers-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let write = |rel: &str, text: &str| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write(
        "lib.rs",
        "pub mod error;\npub mod cuda;\npub mod memory;\npub mod transport;\npub mod engine;\npub use engine::Engine;\n",
    );
    write("transport/mod.rs", "pub mod ipc;\npub mod tcp;\npub mod reactor;\npub mod wire;\n");
    write("transport/reactor.rs", "pub struct R;\n");
    write("transport/wire.rs", "pub struct W;\nuse crate::transport::tcp::pipe::P;\n");
    write("transport/tcp/mod.rs", "pub mod pipe;\npub struct T;\nuse crate::transport::reactor::R;\n");
    write("transport/tcp/pipe.rs", "pub struct P;\n");
    write("transport/ipc/mod.rs", "pub mod channel;\nuse crate::transport::reactor::R;\n");
    write("transport/ipc/channel.rs", "use crate::transport::wire::W;\n");
    write(
        "error.rs",
        "// crate::engine::Engine in a comment is no import\npub struct E;\nconst S: &str = \"crate::engine\";\n",
    );
    write("cuda/mod.rs", "pub mod raw;\nuse crate::{error::E, engine::{self, Engine}};\n");
    write(
        "cuda/raw.rs",
        "fn f() { let _ = crate::memory::owners::g(); }\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
    );
    write("memory/mod.rs", "pub mod owners;\nfn h() -> crate::Engine { todo() }\n");
    write("memory/owners.rs", "pub fn g() {}\n");
    write("engine/mod.rs", "mod a;\nmod b;\npub struct Engine;\nuse a::X;\n");
    write("engine/a.rs", "pub struct X;\nuse super::b::Y;\n");
    write("engine/b.rs", "pub struct Y;\nuse crate::engine::a::X;\n");
    let f = check(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        f.upward,
        [
            "src/cuda/mod.rs (cuda) imports src/engine/mod.rs (engine) through `engine::Engine`",
            "src/cuda/mod.rs (cuda) imports src/engine/mod.rs (engine) through `engine`",
            "src/cuda/raw.rs (cuda) imports src/memory/owners.rs (memory) through `memory::owners::g`",
            "src/memory/mod.rs (memory) imports src/engine/mod.rs (engine) through `Engine`",
        ]
    );
    assert_eq!(f.loops, [vec!["src/engine/a.rs".to_string(), "src/engine/b.rs".to_string()]]);
    assert!(f.unplaced.is_empty());
    assert_eq!(
        f.across,
        ["ipc reaches tcp: src/transport/ipc/channel.rs -> src/transport/wire.rs -> src/transport/tcp/pipe.rs"]
    );
}

/// The layer's row of docs/architecture.md a file of `src/` belongs in,
/// and the file's path as the row names it (below the layer's folder; from
/// `src/` for the ground's files).
fn row_and_name(rel: &Path) -> (String, String) {
    let parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let floors = ["cuda", "memory", "control", "transport", "discovery", "engine", "ffi"];
    match parts.first() {
        Some(first) if parts.len() > 1 && floors.contains(&first.as_str()) => (first.clone(), parts[1..].join("/")),
        _ => ("ground".to_string(), parts.join("/")),
    }
}

/// Of `names` (files as their row names them), those the row does not:
/// a file is named by a backticked path that ends its own on a folder
/// boundary (`exports.rs`, `proto/exports.rs`); `mod.rs` files are their
/// folder's, and need no name of their own.
fn unnamed(row: &str, names: &[String]) -> Vec<String> {
    let code: Vec<&str> = row.split('`').skip(1).step_by(2).filter(|t| t.ends_with(".rs")).collect();
    names
        .iter()
        .filter(|n| !n.ends_with("mod.rs"))
        .filter(|n| !code.iter().any(|t| n.as_str() == *t || n.ends_with(&format!("/{t}"))))
        .cloned()
        .collect()
}

/// docs/architecture.md names every file of `src/` in the row of its layer
/// (the programs of `src/bin/` in theirs), and `lib.rs`: a file added
/// without its line fails here.
#[test]
fn the_architecture_doc_names_every_file_in_its_layer_row() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("docs/architecture.md");
    let mut files = Vec::new();
    walk(&root.join("src"), &root.join("src"), &mut files);
    let mut by_row: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in &files {
        let rel = f.strip_prefix(root.join("src")).expect("below src");
        if rel == Path::new("lib.rs") {
            continue;
        }
        let (row, name) = row_and_name(rel);
        by_row.entry(row).or_default().push(name);
    }
    // The programs (src/bin/, outside the layers) have a row of their own.
    let mut programs = Vec::new();
    walk(&root.join("src/bin"), &root.join("src"), &mut programs);
    let bin = root.join("src/bin");
    for f in &programs {
        let name = f.strip_prefix(&bin).expect("below src/bin").to_string_lossy().into_owned();
        by_row.entry("programs".to_string()).or_default().push(name);
    }
    assert!(programs.len() >= 4, "only {} files of the programs read", programs.len());
    assert!(files.len() > 100, "only {} files read", files.len());
    assert!(doc.contains("`lib.rs`"), "docs/architecture.md does not name lib.rs");
    let mut missing = Vec::new();
    for (row, names) in &by_row {
        let line = doc.lines().find(|l| l.starts_with(&format!("| {row} |")));
        let Some(line) = line else {
            missing.push(format!("no row for the {row} layer"));
            continue;
        };
        missing.extend(unnamed(line, names).into_iter().map(|n| format!("{row}: {n}")));
    }
    assert!(
        missing.is_empty(),
        "files docs/architecture.md does not name in their layer's row:\n{}",
        missing.join("\n")
    );
}

/// The doc check itself: a file is named by its tail on a folder boundary
/// only, and mod.rs needs no name.
#[test]
fn the_doc_check_matches_names_on_folder_boundaries() {
    let row = "| transport | `transport/` | `proto/exports.rs` the table; `receive.rs` answers |";
    let names = ["ipc/proto/exports.rs", "tcp/proto/source/receive.rs", "ipc/mod.rs", "ipc/xexports.rs", "tcp/wire.rs"];
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    assert_eq!(unnamed(row, &names), vec!["ipc/xexports.rs".to_string(), "tcp/wire.rs".to_string()]);
    assert_eq!(row_and_name(Path::new("sync/fork.rs")), ("ground".into(), "sync/fork.rs".into()));
    assert_eq!(row_and_name(Path::new("ffi/types.rs")), ("ffi".into(), "types.rs".into()));
}

/// The attribute that keeps a simulator's bug switch out of the library
/// as shipped: compiled for the unit tests and with the `sim` feature.
const SIM_ONLY: &str = "#[cfg(any(test, feature = \"sim\"))]";

/// Whether `name` is a bug switch's: a `mutations` field or a
/// `...Mutations` type.
fn is_switch(name: &str) -> bool {
    name == "mutations" || name.ends_with("Mutations")
}

/// Where `text` (a file of `src/`) names a simulator's bug switch outside
/// the test builds and the `sim` feature: a `mutations` or `...Mutations`
/// neither read through `mutated!(..)` (false unless the switches are
/// compiled) nor declared under [`SIM_ONLY`] (among the attributes and
/// doc comments right above it). Unit-test modules are not read.
fn unguarded_switches(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let t = line.trim();
        if t == "#[cfg(test)]" && lines.get(n + 1).is_some_and(|l| l.trim_start().starts_with("mod ")) {
            break;
        }
        let code = if t.starts_with("//") { "" } else { line.split(" //").next().unwrap_or("") };
        let c: Vec<char> = code.chars().collect();
        let mut i = 0;
        while i < c.len() {
            if !(c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
                continue;
            }
            let s = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            let word: String = c[s..i].iter().collect();
            if !is_switch(&word) {
                continue;
            }
            // Read through the macro: inside an unclosed `mutated!(`.
            let before: String = c[..s].iter().collect();
            let read = before.rfind("mutated!(").is_some_and(|at| {
                let inside = &before[at..];
                inside.matches('(').count() > inside.matches(')').count()
            });
            let declared = lines[..n]
                .iter()
                .rev()
                .map(|l| l.trim())
                .take_while(|l| l.starts_with("#[") || l.starts_with("//"))
                .any(|l| l == SIM_ONLY);
            if !read && !declared {
                out.push(format!("line {}: `{word}` in `{}`", n + 1, t));
            }
        }
    }
    out
}

/// The simulators' bug switches (the cores' `mutations`) compile only for
/// tests and with the `sim` feature: every declaration is under
/// `#[cfg(any(test, feature = "sim"))]` and every read goes through
/// `mutated!`, which is `false` in the library as shipped (ctest
/// `no_test_switches` checks liborbite.so's symbols).
#[test]
fn bug_switches_compile_only_for_tests_and_the_sim_feature() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &src, &mut files);
    let mut found = Vec::new();
    let mut switches = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).expect("below src").to_string_lossy().into_owned();
        let name = f.file_name().expect("a file").to_string_lossy();
        if rel == "lib.rs" || name == "tests.rs" || name.ends_with("_tests.rs") || rel.contains("/tests/") {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("read a source file");
        switches += text.matches("mutations").count();
        found.extend(unguarded_switches(&text).into_iter().map(|w| format!("src/{rel} {w}")));
    }
    assert!(switches >= 10, "only {switches} mentions of `mutations` read: the check is not reading the cores");
    assert!(found.is_empty(), "bug switches compiled into the library as shipped:\n{}", found.join("\n"));
}

/// The switch check itself: a declaration without the attribute, and a
/// read outside the macro, are found; guarded ones and test modules not.
#[test]
fn the_switch_check_finds_unguarded_switches() {
    let text = r#"
/// Doc.
#[cfg(any(test, feature = "sim"))]
#[derive(Default)]
pub struct Mutations {
    pub a: bool,
}
pub struct Core {
    /// Switches.
    #[cfg(any(test, feature = "sim"))]
    pub mutations: Mutations,
    /// Unguarded.
    pub more: LoudMutations,
}
fn f(c: &Core) -> bool {
    mutated!(c.mutations.a) || c.mutations.a
}
#[cfg(test)]
mod tests {
    fn g(c: &mut Core) { c.mutations.a = true; }
}
"#;
    assert_eq!(
        unguarded_switches(text),
        [
            "line 13: `LoudMutations` in `pub more: LoudMutations,`",
            "line 16: `mutations` in `mutated!(c.mutations.a) || c.mutations.a`",
        ]
    );
}

/// What a protocol core (a file under a `proto/` folder of `src/`) may
/// import besides its own `proto/` folder: the control frames it parses
/// and builds (the IPC protocol's included), the error and transfer types
/// it reports in.
const PROTO_MAY_IMPORT: &[&str] = &[
    "control::frame",
    "control::message",
    "control::notify_frame",
    "control::identity",
    "transport::ipc::messages",
    "error",
    "transfer",
];

/// Of std, a core may use the collections and time, and the language's
/// types and helpers that do no I/O and take no lock.
const PROTO_STD: &[&str] =
    &["collections", "time", "mem", "cmp", "fmt", "hash", "iter", "ops", "cell", "convert", "num", "result", "option"];

/// Exceptions to the core rules: (file below `src/`, what it uses, why).
const PROTO_EXCEPTIONS: &[(&str, &str, &str)] = &[(
    "transport/tcp/proto/requester/mod.rs",
    "std::sync::Arc",
    "the peer's Describe, handed to submitters as an immutable snapshot: a reference count, no lock and no I/O",
)];

/// The crates a core must not reach (I/O, locks, the event loop).
const OUTSIDE_CRATES: &[&str] = &[
    "libc",
    "parking_lot",
    "mio",
    "once_cell",
    "serde",
    "serde_json",
    "thiserror",
    "blake3",
    "aes_gcm",
    "hmac",
    "sha2",
    "cudarc",
    "shuttle",
    "tokio",
    "etcd_client",
];

/// Names of locks.
const LOCKS: &[&str] = &["Mutex", "RwLock", "Condvar", "MutexGuard", "RwLockReadGuard", "RwLockWriteGuard"];

/// `toks` without the unit-test modules (`#[cfg(test)] mod x { .. }`).
fn without_test_modules(toks: &[Tok]) -> Vec<Tok> {
    let head = [
        Tok::Other('#'),
        Tok::Other('['),
        Tok::Ident("cfg".into()),
        Tok::Other('('),
        Tok::Ident("test".into()),
        Tok::Other(')'),
        Tok::Other(']'),
        Tok::Ident("mod".into()),
    ];
    let mut out = Vec::with_capacity(toks.len());
    let mut i = 0;
    while i < toks.len() {
        let is_test_mod = toks[i..].starts_with(&head)
            && matches!(toks.get(i + head.len()), Some(Tok::Ident(_)))
            && toks.get(i + head.len() + 1) == Some(&Tok::Open);
        if !is_test_mod {
            out.push(toks[i].clone());
            i += 1;
            continue;
        }
        i += head.len() + 2;
        let mut depth = 1;
        while i < toks.len() && depth > 0 {
            match toks[i] {
                Tok::Open => depth += 1,
                Tok::Close => depth -= 1,
                _ => {}
            }
            i += 1;
        }
    }
    out
}

/// What breaks the core rules in `text`, the file `rel` (below `src/`) of
/// a protocol core: an import from outside its `proto/` folder and
/// [`PROTO_MAY_IMPORT`], of std beyond [`PROTO_STD`], of an outside crate;
/// a clock call; a lock; `unsafe`. Unit-test modules are not read;
/// [`PROTO_EXCEPTIONS`] are left out.
fn core_rule_findings(rel: &str, text: &str) -> Vec<String> {
    let module = module_of(Path::new(rel));
    let Some(at) = module.iter().position(|m| m == "proto") else { return vec![format!("{rel} is no core")] };
    let root = &module[..=at];
    let toks = without_test_modules(&tokens(&clean(text)));
    let excepted = |what: &str| PROTO_EXCEPTIONS.iter().any(|(f, w, _)| *f == rel && what.starts_with(w));
    let mut out = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        let Tok::Ident(w) = &toks[i] else {
            i += 1;
            continue;
        };
        let starts_path = (i == 0 || toks[i - 1] != Tok::Path) && toks.get(i + 1) == Some(&Tok::Path);
        if w == "unsafe" {
            out.push(format!("{rel}: `unsafe`"));
        } else if LOCKS.contains(&w.as_str()) {
            out.push(format!("{rel}: a lock, `{w}`"));
        } else if (w == "Instant" || w == "SystemTime") && toks.get(i + 2) == Some(&Tok::Ident("now".into())) {
            out.push(format!("{rel}: a clock call, `{w}::now`"));
        }
        if !starts_path {
            i += 1;
            continue;
        }
        // Where the path starts resolving (crate-relative), and its first
        // segment's token; std and outside crates by name.
        let (base, first): (Option<Vec<String>>, usize) = match w.as_str() {
            "crate" => (Some(Vec::new()), i + 2),
            "self" => (Some(module.clone()), i + 2),
            "super" => {
                let mut b = module.clone();
                let mut j = i;
                while toks.get(j) == Some(&Tok::Ident("super".into())) && toks.get(j + 1) == Some(&Tok::Path) {
                    b.pop();
                    j += 2;
                }
                (Some(b), j)
            }
            _ => (None, i),
        };
        let mut j = first;
        let mut found = Vec::new();
        use_tree(&toks, &mut j, base.clone().unwrap_or_default(), &mut found);
        // Each token is read again: a clock call or a lock inside the path.
        i += 1;
        for p in found {
            let what = p.join("::");
            if base.is_some() {
                let allowed = p.starts_with(root)
                    || PROTO_MAY_IMPORT.iter().any(|m| {
                        let m: Vec<&str> = m.split("::").collect();
                        p.len() >= m.len() && p.iter().zip(&m).all(|(a, b)| a == b)
                    });
                if !allowed && !excepted(&format!("crate::{what}")) {
                    out.push(format!("{rel}: imports `crate::{what}`"));
                }
            } else if matches!(p[0].as_str(), "std" | "core" | "alloc") {
                if !p.get(1).is_some_and(|m| PROTO_STD.contains(&m.as_str())) && !excepted(&what) {
                    out.push(format!("{rel}: imports `{what}`"));
                }
            } else if OUTSIDE_CRATES.contains(&p[0].as_str()) {
                out.push(format!("{rel}: imports `{what}`"));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// The protocol cores stay pure: a file under a `proto/` folder imports
/// only its own folder, the control frames, error, transfer and std's
/// collections and time; it reads no clock, takes no lock and holds no
/// `unsafe` (its tests may read the clock: they are not read).
#[test]
fn the_protocol_cores_import_only_frames_errors_and_std_and_hold_no_clock_lock_or_unsafe() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &src, &mut files);
    let mut found = Vec::new();
    let mut cores = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).expect("below src").to_string_lossy().into_owned();
        let name = f.file_name().expect("a file").to_string_lossy();
        if !rel.contains("/proto/") || name == "tests.rs" || name.ends_with("_tests.rs") || rel.contains("/tests/") {
            continue;
        }
        cores += 1;
        found.extend(core_rule_findings(&rel, &std::fs::read_to_string(f).expect("read a core")));
    }
    assert!(cores >= 10, "only {cores} files of the cores read");
    for (f, _, _) in PROTO_EXCEPTIONS {
        assert!(src.join(f).exists(), "an exception names {f}, which is gone: drop it");
    }
    assert!(found.is_empty(), "the protocol cores break their rules:\n{}", found.join("\n"));
}

/// The core check itself: each kind of breach is found, in `use` lines
/// and in code; its own folder, frames, std collections and test modules
/// pass.
#[test]
fn the_core_check_finds_imports_clocks_locks_and_unsafe() {
    let text = r#"
use super::super::messages::Offer;
use super::holders::Holders;
use crate::control::frame::{FrameHeader, MsgKind};
use crate::error::Result;
use crate::memory::RegionTable;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
fn f() -> u64 {
    let t = std::time::Instant::now();
    let _ = crate::transport::reactor::SCRATCH;
    let _ = std::fs::read("x");
    let g: parking_lot::RwLock<u8> = todo!();
    unsafe { 0 }
}
#[cfg(test)]
mod tests {
    use crate::engine::Engine;
    fn t() { let _ = Instant::now(); }
}
"#;
    assert_eq!(
        core_rule_findings("transport/ipc/proto/exports.rs", text),
        [
            "transport/ipc/proto/exports.rs: `unsafe`",
            "transport/ipc/proto/exports.rs: a clock call, `Instant::now`",
            "transport/ipc/proto/exports.rs: a lock, `Mutex`",
            "transport/ipc/proto/exports.rs: a lock, `RwLock`",
            "transport/ipc/proto/exports.rs: imports `crate::memory::RegionTable`",
            "transport/ipc/proto/exports.rs: imports `crate::transport::reactor::SCRATCH`",
            "transport/ipc/proto/exports.rs: imports `parking_lot::RwLock`",
            "transport/ipc/proto/exports.rs: imports `std::fs::read`",
            "transport/ipc/proto/exports.rs: imports `std::sync::Arc`",
            "transport/ipc/proto/exports.rs: imports `std::sync::Mutex`",
        ]
    );
    // The same Arc, in the file excepted for it, passes.
    let arc = "use std::sync::Arc;\n";
    assert!(core_rule_findings("transport/tcp/proto/requester/mod.rs", arc).is_empty());
}
