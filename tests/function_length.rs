//! Functions stay small enough to read at once: none in `src/` is over 60 lines (80 in test
//! code: a `tests.rs` file or a `tests/` folder, or what follows a file's `#[cfg(test)]`), and no Pingora hook (the
//! `ProxyHttp` impl, where policy must not grow back) is over 40. Lines are counted
//! from the `fn` line to the closing brace of rustfmt-formatted code (`cargo fmt --check` runs
//! in CI), so the closing brace sits at the indentation of the `fn` line.
//!
//! And per-limit data is never joined by position with `zip` (which stops at the shorter side,
//! so a length slip would silently drop a limit): outside test code, `.zip(` appears only in
//! the files listed in [`ZIPS`], each for a reason that is not two per-limit sequences.

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 60;
const MAX_TEST_LINES: usize = 80;
const MAX_HOOK_LINES: usize = 40;

/// The files whose non-test code may call `.zip(`, and why.
const ZIPS: [(&str, &str); 6] = [
    (
        "limiter/pairs.rs",
        "the one join of per-limit sequences, which refuses unequal lengths",
    ),
    (
        "limiter/record.rs",
        "a reply's statuses into the records, once their lengths are checked equal",
    ),
    ("limiter/key.rs", "hex digits and the bytes they spell"),
    (
        "caller/api_keys.rs",
        "bytes and the hex digits that spell them",
    ),
    (
        "config/redis.rs",
        "Option::zip of a certificate and its key",
    ),
    (
        "edge/proxy/forwarding.rs",
        "a fixed table of header spellings and their values",
    ),
];

/// One function of the source tree.
#[derive(Debug)]
struct Function {
    file: PathBuf,
    line: usize,
    name: String,
    lines: usize,
    /// A method of `impl ProxyHttp for ...`.
    hook: bool,
    /// Test code.
    test: bool,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("read the source directory")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The name of the function a line declares, if it declares one (`pub`, `pub(crate)`,
/// `async`, `const`, `unsafe` allowed before `fn`).
fn declared_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    if let Some(after) = rest.strip_prefix("pub") {
        rest = match after.strip_prefix('(') {
            Some(scoped) => scoped.split_once(')')?.1,
            None => after,
        }
        .trim_start();
    }
    for qualifier in ["async ", "const ", "unsafe "] {
        rest = rest.strip_prefix(qualifier).unwrap_or(rest);
    }
    let name = rest.strip_prefix("fn ")?;
    let end = name
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(name.len());
    (end > 0).then(|| &name[..end])
}

fn indentation(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// Every function with a body in `file`, with its length in lines.
fn functions(file: &Path) -> Vec<Function> {
    let source = std::fs::read_to_string(file).expect("read a source file");
    let lines: Vec<&str> = source.lines().collect();
    let mut found = Vec::new();
    let mut hook_impl: Option<String> = None;
    let in_tests = file
        .components()
        .any(|part| part.as_os_str() == "tests" || part.as_os_str() == "tests.rs");
    let tests_from = if in_tests {
        0
    } else {
        lines
            .iter()
            .position(|line| *line == "#[cfg(test)]")
            .unwrap_or(lines.len())
    };
    for (at, line) in lines.iter().enumerate() {
        if line.trim_start().starts_with("impl ProxyHttp for ") {
            hook_impl = Some(format!("{}}}", indentation(line)));
        } else if hook_impl.as_deref() == Some(*line) {
            hook_impl = None;
        }
        let Some(name) = declared_fn(line) else {
            continue;
        };
        let Some(opens) = (at..lines.len()).find(|&i| {
            let code = lines[i].trim_end();
            code.ends_with('{') || code.ends_with(';') || code.ends_with('}')
        }) else {
            continue;
        };
        if !lines[opens].trim_end().ends_with('{') {
            continue; // a declaration without a body, or a body on one line
        }
        let closing = format!("{}}}", indentation(line));
        let Some(closes) = (opens..lines.len()).find(|&i| lines[i] == closing) else {
            continue;
        };
        found.push(Function {
            file: file.to_path_buf(),
            line: at + 1,
            name: name.to_string(),
            lines: closes - at + 1,
            hook: hook_impl.is_some(),
            test: at >= tests_from,
        });
    }
    found
}

/// Where the non-test code of `file` calls `.zip(`: line numbers.
fn zips(file: &Path) -> Vec<usize> {
    let source = std::fs::read_to_string(file).expect("read a source file");
    if file
        .components()
        .any(|part| part.as_os_str() == "tests" || part.as_os_str() == "tests.rs")
    {
        return Vec::new();
    }
    source
        .lines()
        .take_while(|line| *line != "#[cfg(test)]")
        .enumerate()
        .filter(|(_, line)| line.contains(".zip(") && !line.trim_start().starts_with("//"))
        .map(|(at, _)| at + 1)
        .collect()
}

fn all_functions() -> Vec<Function> {
    let mut files = Vec::new();
    rust_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &mut files,
    );
    files.iter().flat_map(|file| functions(file)).collect()
}

fn describe(functions: &[&Function], max: usize) -> String {
    functions
        .iter()
        .map(|f| {
            format!(
                "{}:{} {} has {} lines (at most {max})",
                f.file.display(),
                f.line,
                f.name,
                f.lines
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn no_function_is_over_60_lines() {
    let all = all_functions();
    assert!(all.len() > 500, "the scan found the source's functions");
    assert!(
        all.iter().filter(|f| f.test).count() > 100,
        "the scan found the tests"
    );
    let long: Vec<&Function> = all
        .iter()
        .filter(|f| !f.test && f.lines > MAX_LINES)
        .collect();
    assert!(long.is_empty(), "\n{}", describe(&long, MAX_LINES));
    let long: Vec<&Function> = all
        .iter()
        .filter(|f| f.test && f.lines > MAX_TEST_LINES)
        .collect();
    assert!(long.is_empty(), "\n{}", describe(&long, MAX_TEST_LINES));
}

#[test]
fn per_limit_sequences_are_never_zipped() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut unexplained = Vec::new();
    let mut explained = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).expect("under src/");
        let lines = zips(file);
        let allowed = ZIPS.iter().any(|(path, _)| relative == Path::new(path));
        match (lines.is_empty(), allowed) {
            (false, false) => unexplained.extend(
                lines
                    .iter()
                    .map(|line| format!("src/{}:{line}", relative.display())),
            ),
            (false, true) => explained.push(relative.to_path_buf()),
            (true, _) => {}
        }
    }
    assert!(
        unexplained.is_empty(),
        "zip outside the files that may (use limiter::pairs, or one record per limit):\n{}",
        unexplained.join("\n")
    );
    for (path, why) in ZIPS {
        assert!(
            explained.iter().any(|p| p == Path::new(path)),
            "src/{path} is allowed a zip ({why}) but has none: take it off the list"
        );
    }
}

#[test]
fn no_pingora_hook_is_over_40_lines() {
    let all = all_functions();
    let hooks: Vec<&Function> = all.iter().filter(|f| f.hook).collect();
    for expected in [
        "request_filter",
        "upstream_peer",
        "fail_to_proxy",
        "logging",
    ] {
        assert!(
            hooks.iter().any(|f| f.name == expected),
            "the scan found the hook {expected}"
        );
    }
    let long: Vec<&Function> = hooks
        .into_iter()
        .filter(|f| f.lines > MAX_HOOK_LINES)
        .collect();
    assert!(long.is_empty(), "\n{}", describe(&long, MAX_HOOK_LINES));
}

#[test]
fn the_scan_measures_what_it_should() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("sample.rs");
    std::fs::write(
        &file,
        "pub(crate) async fn short() {\n    one();\n}\n\
         trait T {\n    fn declared(&self);\n}\n\
         impl ProxyHttp for G {\n    fn hook(\n        &self,\n    ) -> u8 {\n        1\n    }\n}\n\
         fn after() {}\n",
    )
    .expect("write the sample");
    let found: Vec<(String, usize, bool)> = functions(&file)
        .into_iter()
        .map(|f| (f.name, f.lines, f.hook))
        .collect();
    assert_eq!(
        found,
        [
            ("short".to_string(), 3, false),
            ("hook".to_string(), 5, true),
        ]
    );
}
