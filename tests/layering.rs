//! The module structure of `src/`, read from its own `use` lines and `crate::`/`super::` paths:
//! no file imports a file that imports it back (directly or through others), no top-level module
//! imports one that imports it back, and every import points down the layers of `LAYERS`.
//!
//! A `mod.rs` (or `lib.rs`) may name its children; a child reaches its siblings directly
//! (`super::decision::Decision`), never through its parent's re-exports (`super::Decision`),
//! which would make the parent and the child import each other.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The layers of `src/`, top to bottom: a module imports only modules of its own folder or of
/// folders below; every top-level module is on a line, and folders on one line do not import
/// each other.
const LAYERS: &[&[&str]] = &[
    &["edge"],
    &["runtime"],
    &["exchange"],
    &["upstream", "observe"],
    &["config"],
    &["route"],
    &["caller"],
    &["limiter"],
];

type ModulePath = Vec<String>;

/// Every module of the library crate and its file.
fn modules(src: &Path) -> BTreeMap<ModulePath, PathBuf> {
    fn walk(dir: &Path, prefix: &ModulePath, out: &mut BTreeMap<ModulePath, PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("read src")
            .map(|e| e.expect("dir entry").path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_stem().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                if name == "bin" && prefix.is_empty() {
                    continue; // separate binaries, not modules of the library
                }
                let mut module = prefix.clone();
                module.push(name);
                walk(&path, &module, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                match name.as_str() {
                    "main" if prefix.is_empty() => {}
                    "lib" if prefix.is_empty() => {
                        out.insert(Vec::new(), path);
                    }
                    "mod" => {
                        out.insert(prefix.clone(), path);
                    }
                    _ => {
                        let mut module = prefix.clone();
                        module.push(name);
                        out.insert(module, path);
                    }
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, &Vec::new(), &mut out);
    out
}

/// The source without comments (line comments, doc comments) and string literals, so that
/// only code is read.
fn code_only(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let bytes = source.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            b'"' => {
                // Raw strings (r"…", r#"…"#) are rare here and never hold paths we follow.
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    if bytes[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
                out.push_str("\"\"");
            }
            b'\'' if bytes.get(i + 2) == Some(&b'\'') || bytes.get(i + 1) == Some(&b'\\') => {
                // A char literal such as '"' or '\n'; lifetimes ('a) are left alone.
                i += 1;
                while i < bytes.len() && bytes[i] != b'\'' {
                    if bytes[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            b => {
                out.push(b as char);
                i += 1;
            }
        }
    }
    out
}

/// Expands a `use` tree (`a::{b, c::{d as e}}`) into whole paths.
fn expand_use_tree(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        // `a::b as c` names `a::b`.
        let path = tree.split_whitespace().next().unwrap_or("");
        return vec![path.trim_end_matches("::").to_string()];
    };
    let prefix: String = tree[..open].split_whitespace().collect();
    let inner = &tree[open + 1..tree.rfind('}').expect("balanced use tree")];
    let mut items = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(inner[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(inner[start..].trim());
    items
        .into_iter()
        .filter(|item| !item.is_empty())
        .flat_map(|item| {
            let prefix = prefix.clone();
            expand_use_tree(item).into_iter().map(move |rest| {
                if rest == "self" {
                    prefix.trim_end_matches("::").to_string()
                } else {
                    format!("{prefix}{rest}")
                }
            })
        })
        .collect()
}

/// Splits a file's code into the text of each module it holds: the file's own module, and
/// inline `mod name { … }` blocks (whose `super` is the file's module), recursively.
fn scopes(code: &str, module: &ModulePath) -> Vec<(ModulePath, String)> {
    let mut own = String::with_capacity(code.len());
    let mut inner = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("mod ") {
        let before = rest[..at].chars().last();
        let after = &rest[at + 4..];
        let ident_len = after
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(after.len());
        let brace = after[ident_len..].trim_start();
        let word_start = !before.is_some_and(|c| c.is_alphanumeric() || c == '_');
        if !(word_start && ident_len > 0 && brace.starts_with('{')) {
            own.push_str(&rest[..at + 4]);
            rest = &rest[at + 4..];
            continue;
        }
        own.push_str(&rest[..at]);
        let body_start = at + 4 + ident_len + (after[ident_len..].len() - brace.len()) + 1;
        let mut depth = 1;
        let mut end = body_start;
        for (i, c) in rest[body_start..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                end = body_start + i;
                break;
            }
        }
        let mut child = module.clone();
        child.push(after[..ident_len].to_string());
        inner.extend(scopes(&rest[body_start..end], &child));
        rest = &rest[(end + 1).min(rest.len())..];
    }
    own.push_str(rest);
    let mut all = vec![(module.clone(), own)];
    all.extend(inner);
    all
}

/// Every path a file names through `crate`, `super` or `self`: `use` items (expanded) and
/// paths written inline in the code.
fn named_paths(code: &str) -> Vec<String> {
    let mut paths = Vec::new();
    let mut rest = code;
    // `use` items, which may group paths in braces and span lines.
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        rest = &rest[at + 4..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let Some(end) = rest.find(';') else { break };
        let tree = rest[..end].trim();
        if tree.starts_with("crate::") || tree.starts_with("super::") || tree.starts_with("self::")
        {
            paths.extend(expand_use_tree(tree));
        }
    }
    // Inline paths: `crate::a::b`, `super::a`.
    for root in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(root) {
            let before = rest[..at].chars().last();
            let tail = &rest[at..];
            let len = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            if !before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                paths.push(tail[..len].trim_end_matches(':').to_string());
            }
            rest = &rest[at + root.len()..];
        }
    }
    paths
}

/// The module a path names: its longest prefix that is a module of the crate.
fn resolve(
    from: &ModulePath,
    path: &str,
    modules: &BTreeMap<ModulePath, PathBuf>,
) -> Option<ModulePath> {
    let mut segments = path.split("::").filter(|s| !s.is_empty());
    let mut module: ModulePath = match segments.next()? {
        "crate" => Vec::new(),
        "self" => from.clone(),
        "super" => {
            let mut parent = from.clone();
            parent.pop();
            parent
        }
        _ => return None,
    };
    let mut found = modules.contains_key(&module).then(|| module.clone());
    for segment in segments {
        if segment == "super" {
            module.pop();
        } else {
            module.push(segment.to_string());
        }
        if modules.contains_key(&module) {
            found = Some(module.clone());
        }
    }
    found
}

fn name(module: &ModulePath) -> String {
    if module.is_empty() {
        "crate".to_string()
    } else {
        module.join("::")
    }
}

/// A cycle in `graph`, if any, as the modules along it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        marks: &mut BTreeMap<String, Mark>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = stack.iter().position(|n| n == node).unwrap_or(0);
                let mut cycle = stack[start..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Open);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

/// File → files it imports (children named by a `mod.rs` through re-exports included).
fn import_graph() -> BTreeMap<ModulePath, BTreeSet<ModulePath>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let mut graph = BTreeMap::new();
    for (module, file) in &modules {
        let source = std::fs::read_to_string(file).expect("read source");
        let targets: BTreeSet<ModulePath> = scopes(&code_only(&source), module)
            .iter()
            .flat_map(|(scope, code)| {
                named_paths(code)
                    .into_iter()
                    .filter_map(|path| resolve(scope, &path, &modules))
                    .collect::<Vec<_>>()
            })
            .filter(|target| target != module)
            .collect();
        graph.insert(module.clone(), targets);
    }
    graph
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let graph: BTreeMap<String, BTreeSet<String>> = import_graph()
        .iter()
        .map(|(from, to)| (name(from), to.iter().map(name).collect()))
        .collect();
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle between files of src/: {}", cycle.join(" -> "));
    }
}

#[test]
fn no_top_level_module_imports_one_that_imports_it_back() {
    let top = |m: &ModulePath| m.first().cloned().unwrap_or_else(|| "crate".to_string());
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (from, targets) in import_graph() {
        let entry = graph.entry(top(&from)).or_default();
        for target in targets {
            if top(&target) != top(&from) && !target.is_empty() {
                entry.insert(top(&target));
            }
        }
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import cycle between modules of src/: {}",
            cycle.join(" -> ")
        );
    }
}

/// The line of `LAYERS` a module's folder is on.
fn layer(module: &ModulePath) -> Option<usize> {
    let top = module.first()?;
    LAYERS.iter().position(|line| line.contains(&top.as_str()))
}

#[test]
fn every_import_points_down_the_layers() {
    let mut offenders = Vec::new();
    for (from, targets) in import_graph() {
        if from.is_empty() {
            continue; // lib.rs names every folder
        }
        let Some(at) = layer(&from) else {
            offenders.push(format!("{} is on no layer", name(&from)));
            continue;
        };
        for target in targets.iter().filter(|t| !t.is_empty()) {
            let same_folder = target.first() == from.first();
            if !same_folder && layer(target).is_none_or(|to| to <= at) {
                offenders.push(format!("{} imports {}", name(&from), name(target)));
            }
        }
    }
    offenders.sort();
    offenders.dedup();
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

/// The folder graph as docs/architecture.md writes it: per folder, each folder it imports (in
/// layer order) with the number of file-to-file imports behind the arrow.
fn folder_graph_text() -> String {
    let folders: Vec<&str> = LAYERS
        .iter()
        .flat_map(|line| line.iter().copied())
        .collect();
    let mut counts: BTreeMap<(usize, usize), usize> = BTreeMap::new();
    for (from, targets) in import_graph() {
        let folder = |m: &ModulePath| {
            let top = m.first()?;
            folders.iter().position(|f| f == top)
        };
        let Some(at) = folder(&from) else { continue };
        for target in &targets {
            match folder(target) {
                Some(to) if to != at => *counts.entry((at, to)).or_default() += 1,
                _ => {}
            }
        }
    }
    let width = folders.iter().map(|f| f.len()).max().unwrap_or(0);
    let mut text = String::new();
    for (at, folder) in folders.iter().enumerate() {
        let arrows: Vec<String> = counts
            .iter()
            .filter(|((from, _), _)| *from == at)
            .map(|((_, to), n)| format!("{}({n})", folders[*to]))
            .collect();
        let arrows = if arrows.is_empty() {
            "(nothing)".to_string()
        } else {
            arrows.join(" ")
        };
        text.push_str(&format!("{folder:width$} -> {arrows}\n"));
    }
    let (edges, imports) = (counts.len(), counts.values().sum::<usize>());
    text.push_str(&format!(
        "{edges} folder-to-folder edges, {imports} file-to-file imports\n"
    ));
    text
}

#[test]
fn the_documented_folder_graph_is_the_code_s() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md"))
            .expect("read docs/architecture.md");
    let graph = folder_graph_text();
    assert!(
        doc.contains(&graph),
        "docs/architecture.md's folder graph (\"The same as text\") is not the code's; it is:\n{graph}"
    );
}

#[test]
fn src_has_at_most_twelve_entries() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let entries = std::fs::read_dir(src).expect("read src").count();
    assert!(entries <= 12, "{entries} entries directly under src/");
}

/// Whether `code` names the external crate `krate` (`krate::...` not preceded by another path
/// segment or identifier).
fn names_crate(code: &str, krate: &str) -> bool {
    let pattern = format!("{krate}::");
    code.match_indices(&pattern).any(|(at, _)| {
        code[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':'))
    })
}

/// The modules under `top` whose code (tests included) names `krate`.
fn naming(top: &str, krate: &str) -> Vec<String> {
    modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
        .iter()
        .filter(|(module, _)| module.first().is_some_and(|m| m == top))
        .filter(|(_, file)| {
            let source = std::fs::read_to_string(file).expect("read source");
            names_crate(&code_only(&source), krate)
        })
        .map(|(module, _)| name(module))
        .collect()
}

#[test]
fn the_exchange_knows_no_pingora_and_the_limiter_no_http() {
    assert!(names_crate("use pingora::proxy::Session;", "pingora"));
    assert!(names_crate("fn f(h: &http::HeaderMap) {}", "http"));
    assert!(!names_crate(
        "use crate::exchange::http::X; use opentelemetry_http::Y;",
        "http"
    ));
    let mut offenders = Vec::new();
    for (top, krate) in [
        ("exchange", "pingora"),
        ("limiter", "pingora"),
        ("limiter", "http"),
        ("limiter", "tonic"),
    ] {
        for module in naming(top, krate) {
            offenders.push(format!("{module} names {krate}"));
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

/// The crates of the glue: what only the edge, the runtime and the upstream pools may reach.
const GLUE_CRATES: &[&str] = &[
    "pingora",
    "pingora_core",
    "pingora_proxy",
    "pingora_load_balancing",
    "pingora_prometheus",
    "tonic",
    "envoy_types",
];

#[test]
fn the_exchange_reaches_no_pingora_through_what_it_imports() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let files = modules(&src);
    let graph = import_graph();
    // Every module the exchange's files (tests included) reach, with the chain that reaches it.
    let mut reached: BTreeMap<ModulePath, Vec<String>> = BTreeMap::new();
    let mut stack: Vec<ModulePath> = graph
        .keys()
        .filter(|m| m.first().is_some_and(|top| top == "exchange"))
        .cloned()
        .collect();
    for module in &stack {
        reached.insert(module.clone(), vec![name(module)]);
    }
    while let Some(module) = stack.pop() {
        let chain = reached[&module].clone();
        let code = code_only(&std::fs::read_to_string(&files[&module]).expect("read source"));
        // A folder's file re-exports its children (`pub use child::Item;`): those count too.
        let reexported = files.keys().filter(|child| {
            child.len() == module.len() + 1
                && child.starts_with(&module)
                && code.contains(&format!("use {}::", child[module.len()]))
        });
        let targets: Vec<ModulePath> = graph
            .get(&module)
            .into_iter()
            .flatten()
            .chain(reexported)
            .cloned()
            .collect();
        for target in targets {
            if !reached.contains_key(&target) {
                let mut longer = chain.clone();
                longer.push(name(&target));
                reached.insert(target.clone(), longer);
                stack.push(target);
            }
        }
    }
    let names: Vec<String> = reached.keys().map(name).collect();
    for expected in ["limiter::policy", "upstream::servers", "route::tiers"] {
        assert!(
            names.iter().any(|n| n == expected),
            "the closure follows imports and re-exports to {expected}: {names:?}"
        );
    }
    let mut offenders = Vec::new();
    for (module, chain) in &reached {
        let code = code_only(&std::fs::read_to_string(&files[module]).expect("read source"));
        for krate in GLUE_CRATES {
            if names_crate(&code, krate) {
                offenders.push(format!("{} names {krate}", chain.join(" -> ")));
            }
        }
    }
    assert!(offenders.is_empty(), "\n{}", offenders.join("\n"));
}

#[test]
fn the_exchange_reads_time_only_from_its_clock() {
    let mut offenders = Vec::new();
    for (module, file) in modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")) {
        if module.first().is_none_or(|top| top != "exchange") {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(&file).expect("read source"));
        for reading in ["Instant::now", "SystemTime::now", "thread::sleep"] {
            if code.contains(reading) {
                offenders.push(format!("{} reads {reading}", name(&module)));
            }
        }
        // `Instant::elapsed` reads the system clock; the exchange's own `elapsed` reads its clock.
        if code.matches(".elapsed()").count() > code.matches("self.elapsed()").count() {
            offenders.push(format!("{} reads Instant::elapsed", name(&module)));
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

/// What a compiled configuration may not hold: state that changes while it runs.
const LIVE_STATE: &[&str] = &[
    "Mutex",
    "RwLock",
    "Atomic",
    "ArcSwap",
    "DashMap",
    "OnceLock",
    "OnceCell",
    "Cell<",
    "Notify",
    // The limiter's per-thread slots, made as requests are served.
    "PerThread",
    "ThreadCopies",
    "ThreadHandles",
];

/// The modules of config/, route/ and caller/ that hold live state, and why it is not the
/// compiled configuration's.
const LIVE_STATE_HOMES: &[(&str, &str)] = &[
    (
        "caller::jwt::verify",
        "the verifier's keys: each site builds its own (exchange::site), compiling never does",
    ),
    (
        "caller::jwt::cache",
        "the tokens a site's verifier verified",
    ),
    ("caller::jwt::testing", "test support"),
    (
        "route::keys",
        "Rotation: held by the route's runtime (exchange::site), never by the compiled keys",
    ),
    (
        "config::paths",
        "the start directory: fixed once per process, before anything is read",
    ),
];

#[test]
fn the_compiled_configuration_holds_no_live_state() {
    let mut offenders = Vec::new();
    let modules = modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    for (home, _) in LIVE_STATE_HOMES {
        if !modules.keys().any(|module| name(module) == *home) {
            offenders.push(format!("{home} is allowed live state but is no module"));
        }
    }
    for (module, file) in modules {
        let folder = module.first().map(String::as_str);
        let home = LIVE_STATE_HOMES.iter().any(|(m, _)| *m == name(&module));
        if !matches!(folder, Some("config" | "route" | "caller")) || home {
            continue;
        }
        let source = std::fs::read_to_string(&file).expect("read source");
        // Test code may hold what it likes.
        let tests_from = source.find("#[cfg(test)]").unwrap_or(source.len());
        if file.file_name().is_some_and(|f| f == "tests.rs") {
            continue;
        }
        let code = code_only(&source[..tests_from]);
        for state in LIVE_STATE.iter().filter(|state| code.contains(*state)) {
            offenders.push(format!("{} holds {state}", name(&module)));
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

#[test]
fn files_are_read_only_through_sources() {
    // A file read any other way is not followed by `watch` (config/sources.rs). Writing
    // (the access log) and test code are not reading a configuration.
    let mut offenders = Vec::new();
    for (module, file) in modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")) {
        if name(&module) == "config::sources" || file.file_name().is_some_and(|f| f == "tests.rs") {
            continue;
        }
        let source = std::fs::read_to_string(&file).expect("read source");
        let tests_from = source.find("#[cfg(test)]").unwrap_or(source.len());
        let code = code_only(&source[..tests_from]);
        for reading in [
            "fs::read(",
            "fs::read_to_string(",
            "fs::read_dir(",
            "File::open(",
            "load_certs_and_key_files",
        ] {
            if code.contains(reading) {
                offenders.push(format!("{} reads with {reading}", name(&module)));
            }
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

#[test]
fn the_reader_sees_grouped_uses_inline_paths_and_parents() {
    let code = code_only(
        "use crate::limiter::{decision::{Decision, LimitStatus}, key::Key as K, self};\n\
         // use crate::commented::Out;\n\
         let s = \"crate::in_a_string\";\n\
         fn f() { crate::metrics::init(); super::sibling::g(); }\n",
    );
    let paths = named_paths(&code);
    for expected in [
        "crate::limiter::decision::Decision",
        "crate::limiter::decision::LimitStatus",
        "crate::limiter::key::Key",
        "crate::limiter",
        "crate::metrics::init",
        "super::sibling::g",
    ] {
        assert!(
            paths.iter().any(|p| p == expected),
            "{expected} in {paths:?}"
        );
    }
    assert!(!paths
        .iter()
        .any(|p| p.contains("commented") || p.contains("in_a_string")));
    let nested = scopes(
        "use super::x; mod tests { use super::y; }",
        &vec!["m".to_string()],
    );
    assert_eq!(nested[1].0, vec!["m".to_string(), "tests".to_string()]);
    assert!(nested[0].1.contains("super::x") && !nested[0].1.contains("super::y"));
    let mut graph = BTreeMap::new();
    graph.insert("a".to_string(), BTreeSet::from(["b".to_string()]));
    graph.insert("b".to_string(), BTreeSet::from(["a".to_string()]));
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "a".into()])
    );
}

/// What makes a `static` state that changes while the process runs.
const MUTABLE: &[&str] = &[
    "Mutex", "RwLock", "Atomic", "OnceLock", "OnceCell", "LazyLock", "Cell<", "ArcSwap",
];

/// The statics docs/architecture.md's "Statics that stay" lists, each as (file, name): every
/// static that may change while the process runs must be there, with its reason, and nothing
/// else. The metric families' row names `observe/metrics.rs`, the registry, whole.
fn statics_that_stay() -> Vec<(String, String)> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/architecture.md"))
            .expect("read docs/architecture.md");
    let section = doc
        .split("## Statics that stay")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .expect("docs/architecture.md has a section \"Statics that stay\"");
    let mut listed = Vec::new();
    for row in section.lines().filter(|line| line.starts_with("| ")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let (Some(names), Some(file)) = (cells.get(1), cells.get(2)) else {
            continue;
        };
        let file = file.trim_matches('`');
        for name in names.split('`').skip(1).step_by(2) {
            if name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit())
            {
                listed.push((file.to_string(), name.to_string()));
            }
        }
    }
    listed
}

/// The statics declared in `code`: each one's name and its type.
fn statics(code: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("static ") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "static ".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '\'') {
            continue; // `'static` or a longer word
        }
        let declared = rest.trim_start_matches("mut ");
        let Some((name, after)) = declared.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit())
        {
            continue;
        }
        let ty = after.split('=').next().unwrap_or_default().trim();
        found.push((name.to_string(), ty.to_string()));
    }
    found
}

#[test]
fn no_state_lives_in_statics_but_those_the_docs_list() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let listed = statics_that_stay();
    assert!(listed.len() >= 5, "the list was not read: {listed:?}");
    let mut found = Vec::new();
    let mut offenders = Vec::new();
    for file in rust_files(&src) {
        let at = file
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .to_string();
        if at == "observe/metrics.rs" || file.file_name().is_some_and(|f| f == "tests.rs") {
            continue;
        }
        let source = std::fs::read_to_string(&file).expect("read source");
        let tests_from = source.find("#[cfg(test)]").unwrap_or(source.len());
        for (name, ty) in statics(&code_only(&source[..tests_from])) {
            let is_listed = listed.iter().any(|(f, n)| *f == at && *n == name);
            if !is_listed && MUTABLE.iter().any(|state| ty.contains(state)) {
                offenders.push(format!(
                    "src/{at}: static {name}: {ty} is not in \"Statics that stay\""
                ));
            }
            found.push((at.clone(), name));
        }
    }
    for (file, name) in &listed {
        if file != "observe/metrics.rs" && !found.iter().any(|(f, n)| f == file && n == name) {
            offenders.push(format!(
                "\"Statics that stay\" lists {name} in {file}, which has none"
            ));
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read src").flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
    files
}

#[test]
fn the_statics_reader_sees_names_and_types() {
    let code = code_only(
        "static A: AtomicBool = AtomicBool::new(false);\n\
         pub static B_2: LazyLock<X> = LazyLock::new(X::default);\n\
         fn f(s: &'static str) {}\n\
         thread_local! { static LINE: RefCell<Vec<u8>> = RefCell::new(Vec::new()); }\n",
    );
    let found = statics(&code);
    let names: Vec<&str> = found.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, ["A", "B_2", "LINE"]);
    assert_eq!(found[0].1, "AtomicBool");
    assert_eq!(found[2].1, "RefCell<Vec<u8>>");
}

/// How code reads an error's words to choose what to do.
const MATCHED_BY_TEXT: &[&str] = &[
    "to_string().contains(",
    "to_string().starts_with(",
    "to_string().ends_with(",
    "to_string().as_str()",
    "to_string() ==",
];

#[test]
fn no_error_is_chosen_by_its_text() {
    let mut offenders = Vec::new();
    for (module, file) in modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src")) {
        if file.file_name().is_some_and(|f| f == "tests.rs") {
            continue;
        }
        let source = std::fs::read_to_string(&file).expect("read source");
        let tests_from = source.find("#[cfg(test)]").unwrap_or(source.len());
        let code: String = code_only(&source[..tests_from])
            .chars()
            .filter(|c| !c.is_whitespace() || *c == ' ')
            .collect();
        for reading in MATCHED_BY_TEXT {
            let reading: String = reading.chars().filter(|c| !c.is_whitespace()).collect();
            if code.replace(' ', "").contains(&reading) {
                offenders.push(format!("{} reads {reading}", name(&module)));
            }
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}
/// The operator's surface: the admin listener's APIs and pages. They reach the limits only
/// through the policy (its admin operations, `Policy::sharing`), never its engine.
const ADMIN_MODULES: &[&str] = &[
    "edge::admin",
    "edge::usage",
    "edge::explain",
    "edge::quota_admin",
    "edge::dashboard",
];

#[test]
fn no_admin_module_reaches_the_engine() {
    let mut offenders = Vec::new();
    for (module, imports) in import_graph() {
        let module_name = name(&module);
        let admin = ADMIN_MODULES
            .iter()
            .any(|admin| module_name == *admin || module_name.starts_with(&format!("{admin}::")));
        if !admin {
            continue;
        }
        for imported in imports.iter().map(name) {
            if imported == "limiter::engine" {
                offenders.push(format!("{module_name} imports {imported}"));
            }
        }
    }
    let files = modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    for (module, file) in &files {
        let module_name = name(module);
        if !ADMIN_MODULES
            .iter()
            .any(|admin| module_name == *admin || module_name.starts_with(&format!("{admin}::")))
        {
            continue;
        }
        let code = code_only(&std::fs::read_to_string(file).expect("read source"));
        if code.contains(".engine()") {
            offenders.push(format!("{module_name} calls Policy::engine"));
        }
    }
    assert!(offenders.is_empty(), "{}", offenders.join("\n"));
}
