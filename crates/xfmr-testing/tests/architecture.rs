//! The workspace's architecture, checked (rust-analyzer's `tidy` tests in spirit): what
//! `docs/ARCHITECTURE.md` says of the crates is read from the files themselves, so that the
//! document and the code cannot drift apart silently.
//!
//! - the layer diagram equals the workspace crates' `[dependencies]` (parsed from each
//!   `Cargo.toml`), and every arrow points to a lower layer;
//! - no source file under `crates/*/src` is over 500 lines;
//! - no `#[path]` include reaches into another crate (nor from `benches/` or `examples/`,
//!   which belong to no crate's directory);
//! - no library crate turns on a burn backend feature unconditionally: a backend is the
//!   choice of the application, or of a feature of the crate (the facade's default `ndarray`
//!   among them, which a user turns off with `default-features = false`);
//! - every public error enum is `#[non_exhaustive]`.
//!
//! The checks read files only (no cargo, no network) and name the file and line at fault.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// Lines a source file under `crates/*/src` may have (the house rule).
const MAX_LINES: usize = 500;

/// burn's features that select or wrap a backend (burn 0.21's `Cargo.toml`).
const BURN_BACKEND_FEATURES: &[&str] = &[
    "accelerate",
    "apple-amx",
    "autodiff",
    "candle",
    "candle-cuda",
    "candle-metal",
    "cpu",
    "cuda",
    "dispatch",
    "flex",
    "fusion",
    "metal",
    "ndarray",
    "remote",
    "rocm",
    "router",
    "tch",
    "vulkan",
    "webgpu",
    "wgpu",
    "x86-v4",
];

/// burn's backend crates, which a library crate must not depend on unconditionally either.
const BURN_BACKEND_CRATES: &[&str] = &[
    "burn-autodiff",
    "burn-candle",
    "burn-cpu",
    "burn-cubecl",
    "burn-cuda",
    "burn-dispatch",
    "burn-flex",
    "burn-fusion",
    "burn-ndarray",
    "burn-remote",
    "burn-rocm",
    "burn-router",
    "burn-tch",
    "burn-wgpu",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("the repository root")
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn parse_toml(path: &Path) -> toml::Table {
    read(path)
        .parse::<toml::Table>()
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One workspace member: its package name, directory, and parsed manifest.
struct Member {
    name: String,
    dir: PathBuf,
    manifest: toml::Table,
}

impl Member {
    /// The normal dependencies (`[dependencies]` and every `[target.*.dependencies]`), as
    /// (package name, the dependency's table or version string).
    fn dependencies(&self) -> Vec<(String, toml::Value)> {
        let mut tables = Vec::new();
        if let Some(t) = self.manifest.get("dependencies").and_then(|d| d.as_table()) {
            tables.push(t);
        }
        if let Some(targets) = self.manifest.get("target").and_then(|t| t.as_table()) {
            for target in targets.values() {
                if let Some(t) = target.get("dependencies").and_then(|d| d.as_table()) {
                    tables.push(t);
                }
            }
        }
        tables
            .into_iter()
            .flat_map(|t| t.iter())
            .map(|(key, value)| {
                // A renamed dependency names its package.
                let package = value.get("package").and_then(|p| p.as_str()).unwrap_or(key);
                (package.to_string(), value.clone())
            })
            .collect()
    }

    /// A crate that would be published: every member but the test, tool and program crates,
    /// which say `publish = false`.
    fn is_library(&self) -> bool {
        self.manifest
            .get("package")
            .and_then(|p| p.get("publish"))
            .and_then(|p| p.as_bool())
            != Some(false)
    }
}

fn members() -> Vec<Member> {
    let root = root();
    let workspace = parse_toml(&root.join("Cargo.toml"));
    let members = workspace["workspace"]["members"]
        .as_array()
        .expect("workspace.members");
    members
        .iter()
        .map(|m| {
            let dir = root.join(m.as_str().expect("a member path"));
            let manifest = parse_toml(&dir.join("Cargo.toml"));
            let name = manifest["package"]["name"]
                .as_str()
                .expect("package.name")
                .to_string();
            Member {
                name,
                dir,
                manifest,
            }
        })
        .collect()
}

/// Removes every parenthesised aside (nested ones too) from `text`.
fn without_asides(text: &str) -> String {
    let mut depth = 0usize;
    let mut out = String::new();
    for c in text.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

/// The xfmr crate names in `text` (`xfmr` and `xfmr-*`), in order.
fn crate_names(text: &str) -> Vec<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        .filter(|w| *w == "xfmr" || w.starts_with("xfmr-"))
        .map(|w| w.trim_end_matches('-').to_string())
        .collect()
}

/// One crate's line in the diagram: its layer (`tools` above every numbered layer) and the
/// crates its arrow points to.
#[derive(Debug)]
struct DiagramEntry {
    layer: u32,
    line: usize,
    deps: BTreeSet<String>,
}

/// The layer diagram: the first fenced block of `docs/ARCHITECTURE.md`, one crate per arrow
/// (`name ──► dep, dep (aside), ...`), continued on indented lines without an arrow, a layer
/// label (`layer N` or `tools`) at the start of a line applying until the next label.
fn diagram() -> BTreeMap<String, DiagramEntry> {
    let path = root().join("docs/ARCHITECTURE.md");
    let text = read(&path);
    let mut lines = text.lines().enumerate();
    lines
        .by_ref()
        .find(|(_, l)| l.trim_start().starts_with("```"))
        .expect("docs/ARCHITECTURE.md has a fenced layer diagram");
    // (crate, layer, first line, the text of its arrow's right side)
    let mut entries: Vec<(String, u32, usize, String)> = Vec::new();
    let mut layer = None;
    for (i, line) in lines {
        if line.trim_start().starts_with("```") {
            break;
        }
        if let Some((left, right)) = line.split_once('►') {
            let left = left.trim_end_matches(['─', ' ']);
            let label_end = if let Some(rest) = left.strip_prefix("layer ") {
                let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
                layer =
                    Some(digits.parse::<u32>().unwrap_or_else(|_| {
                        panic!("docs/ARCHITECTURE.md:{}: a layer number", i + 1)
                    }));
                "layer ".len() + digits.len()
            } else if left.starts_with("tools") {
                layer = Some(u32::MAX);
                "tools".len()
            } else {
                0
            };
            let names = crate_names(&without_asides(&left[label_end..]));
            assert_eq!(
                names.len(),
                1,
                "docs/ARCHITECTURE.md:{}: one crate left of the arrow, found {names:?}",
                i + 1
            );
            let layer =
                layer.unwrap_or_else(|| panic!("docs/ARCHITECTURE.md:{}: no layer label", i + 1));
            entries.push((names[0].clone(), layer, i + 1, right.to_string()));
        } else if let Some(last) = entries.last_mut() {
            if !line.trim().is_empty() {
                last.3.push(' ');
                last.3.push_str(line.trim());
            }
        }
    }
    let mut out = BTreeMap::new();
    for (name, layer, line, right) in entries {
        let deps = crate_names(&without_asides(&right)).into_iter().collect();
        let previous = out.insert(name.clone(), DiagramEntry { layer, line, deps });
        assert!(
            previous.is_none(),
            "docs/ARCHITECTURE.md:{line}: {name} has two lines in the diagram"
        );
    }
    out
}

#[test]
fn architecture_layer_diagram_equals_the_manifests() {
    let members = members();
    let names: BTreeSet<String> = members.iter().map(|m| m.name.clone()).collect();
    let diagram = diagram();
    let mut errors = Vec::new();
    for member in &members {
        let Some(entry) = diagram.get(&member.name) else {
            errors.push(format!(
                "{} is a workspace member but has no line in docs/ARCHITECTURE.md's diagram",
                member.name
            ));
            continue;
        };
        let actual: BTreeSet<String> = member
            .dependencies()
            .into_iter()
            .map(|(name, _)| name)
            .filter(|name| names.contains(name))
            .collect();
        for missing in actual.difference(&entry.deps) {
            errors.push(format!(
                "docs/ARCHITECTURE.md:{}: {} depends on {missing} ({}/Cargo.toml), the diagram does not say so",
                entry.line,
                member.name,
                relative(&member.dir)
            ));
        }
        for extra in entry.deps.difference(&actual) {
            errors.push(format!(
                "docs/ARCHITECTURE.md:{}: the diagram has {} → {extra}, which {}/Cargo.toml does not have",
                entry.line,
                member.name,
                relative(&member.dir)
            ));
        }
        for dep in &entry.deps {
            if let Some(lower) = diagram.get(dep) {
                if lower.layer >= entry.layer
                    && !(entry.layer == u32::MAX
                        && lower.layer == u32::MAX
                        && lower.line > entry.line)
                {
                    errors.push(format!(
                        "docs/ARCHITECTURE.md:{}: {} → {dep} does not point to a lower layer",
                        entry.line, member.name
                    ));
                }
            }
        }
    }
    for (name, entry) in &diagram {
        if !names.contains(name) {
            errors.push(format!(
                "docs/ARCHITECTURE.md:{}: {name} is in the diagram but is no workspace member",
                entry.line
            ));
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// Every `.rs` file under `dir`, recursively (skipping `target` directories).
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n == "target") {
                continue;
            }
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn architecture_no_source_file_over_500_lines() {
    let mut files = Vec::new();
    for member in members() {
        if member.dir.starts_with(root().join("crates")) {
            rust_files(&member.dir.join("src"), &mut files);
        }
    }
    assert!(files.len() > 50, "found only {} source files", files.len());
    let long: Vec<String> = files
        .iter()
        .filter_map(|f| {
            let lines = read(f).lines().count();
            (lines > MAX_LINES).then(|| format!("{}: {lines} lines", relative(f)))
        })
        .collect();
    assert!(
        long.is_empty(),
        "source files over {MAX_LINES} lines (split them by what they do):\n{}",
        long.join("\n")
    );
}

/// A library or binary built without its test harness (`test = false`, which keeps CI's
/// build short) has no unit tests: they would never run. Its tests belong in `tests/`.
#[test]
fn architecture_no_unit_tests_in_targets_built_without_tests() {
    let mut checked = 0;
    // The vendored burn crates (vendor/PATCHED.md) keep their authors' unit tests as released:
    // they need burn's GPU backends, and xfmr's data-parallel tests exercise those crates instead.
    let vendored = root().join("vendor");
    for member in members()
        .into_iter()
        .filter(|m| !m.dir.starts_with(&vendored))
    {
        let untested =
            |target: &toml::Value| target.get("test").and_then(|t| t.as_bool()) == Some(false);
        let mut roots = Vec::new();
        if member.manifest.get("lib").is_some_and(untested) {
            roots.push(member.dir.join("src/lib.rs"));
        }
        let bins = member.manifest.get("bin").and_then(|b| b.as_array());
        roots.extend(
            bins.into_iter()
                .flatten()
                .filter(|bin| untested(bin))
                .filter_map(|bin| bin.get("path")?.as_str())
                .map(|path| member.dir.join(path)),
        );
        // A library's (or `src/main.rs` binary's) modules: every file under `src/`, so an
        // untested library beside a tested `src/main.rs` would be flagged too (none is); any
        // other binary: its one file.
        for root_file in roots {
            let mut files = Vec::new();
            match root_file.file_name().and_then(|n| n.to_str()) {
                Some("lib.rs") | Some("main.rs")
                    if root_file.parent() == Some(&member.dir.join("src")) =>
                {
                    rust_files(&member.dir.join("src"), &mut files)
                }
                _ => files.push(root_file.clone()),
            }
            for file in files {
                checked += 1;
                let text = read(&file);
                assert!(
                    !text.contains("#[cfg(test)]") && !text.contains("#[test]"),
                    "{} has unit tests, but {}'s target {} is built with `test = false`: they \
                     would never run; move them to {}/tests/",
                    relative(&file),
                    member.name,
                    relative(&root_file),
                    relative(&member.dir),
                );
            }
        }
    }
    assert!(checked > 20, "checked only {checked} files");
}

/// `path` with `.` and `..` resolved lexically.
fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// The crate directory a file lies in (`crates/<name>` or `fuzz`), if any.
fn crate_dir_of(file: &Path) -> Option<PathBuf> {
    let rel = file.strip_prefix(root()).ok()?;
    let mut parts = rel.components();
    match parts.next()?.as_os_str().to_str()? {
        "crates" => Some(root().join("crates").join(parts.next()?)),
        "fuzz" => Some(root().join("fuzz")),
        _ => None,
    }
}

#[test]
fn architecture_no_path_include_across_crates() {
    let root = root();
    let mut files = Vec::new();
    for dir in ["crates", "fuzz", "benches", "examples"] {
        rust_files(&root.join(dir), &mut files);
    }
    assert!(files.len() > 50, "found only {} Rust files", files.len());
    let mut errors = Vec::new();
    for file in &files {
        for (i, line) in read(file).lines().enumerate() {
            let Some(rest) = line.trim_start().strip_prefix("#[path") else {
                continue;
            };
            let target = rest.split('"').nth(1).unwrap_or_else(|| {
                panic!("{}:{}: a #[path] without a string", relative(file), i + 1)
            });
            let resolved = normalise(&file.parent().expect("a directory").join(target));
            let at = format!("{}:{}", relative(file), i + 1);
            match crate_dir_of(file) {
                Some(dir) if resolved.starts_with(&dir) => {}
                Some(dir) => errors.push(format!(
                    "{at}: #[path = {target:?}] reaches out of {} (share the code through a crate: xfmr-testing's features for test helpers)",
                    relative(&dir)
                )),
                None => errors.push(format!(
                    "{at}: #[path = {target:?}] in a file that belongs to no crate directory"
                )),
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn architecture_no_library_crate_turns_on_a_burn_backend_unconditionally() {
    let members = members();
    let libraries: Vec<&Member> = members.iter().filter(|m| m.is_library()).collect();
    assert!(
        libraries.iter().any(|m| m.name == "xfmr-models"),
        "the library crates are found"
    );
    let workspace = parse_toml(&root().join("Cargo.toml"));
    let workspace_deps = workspace["workspace"]["dependencies"]
        .as_table()
        .expect("workspace.dependencies");
    let mut errors = Vec::new();
    for member in libraries {
        for (package, spec) in member.dependencies() {
            let optional = spec
                .get("optional")
                .and_then(|o| o.as_bool())
                .unwrap_or(false);
            if optional {
                continue;
            }
            let at = format!("{}/Cargo.toml", relative(&member.dir));
            if BURN_BACKEND_CRATES.contains(&package.as_str()) {
                errors.push(format!(
                    "{at}: depends on the backend crate {package} unconditionally"
                ));
            }
            if package != "burn" {
                continue;
            }
            let mut features: Vec<&toml::Value> = spec
                .get("features")
                .and_then(|f| f.as_array())
                .map(|f| f.iter().collect())
                .unwrap_or_default();
            // `workspace = true` adds the workspace's own features.
            if spec.get("workspace").and_then(|w| w.as_bool()) == Some(true) {
                if let Some(f) = workspace_deps
                    .get("burn")
                    .and_then(|b| b.get("features"))
                    .and_then(|f| f.as_array())
                {
                    features.extend(f.iter());
                }
            }
            for feature in features.iter().filter_map(|f| f.as_str()) {
                if BURN_BACKEND_FEATURES.contains(&feature) {
                    errors.push(format!(
                        "{at}: burn's backend feature `{feature}` on unconditionally (put it behind a feature of the crate, or in [dev-dependencies])"
                    ));
                }
            }
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// One error vocabulary: every public error enum of a crate may gain variants without breaking
/// its users, so each is `#[non_exhaustive]` (callers match with a wildcard arm).
#[test]
fn architecture_every_public_error_enum_is_non_exhaustive() {
    let mut files = Vec::new();
    for member in members() {
        if member.dir.starts_with(root().join("crates")) {
            rust_files(&member.dir.join("src"), &mut files);
        }
    }
    let mut seen = 0;
    let mut errors = Vec::new();
    for file in &files {
        let text = read(file);
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some(rest) = line.strip_prefix("pub enum ") else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.ends_with("Error") {
                continue;
            }
            seen += 1;
            // The attributes (and doc lines) directly above the item.
            let marked = lines[..i]
                .iter()
                .rev()
                .take_while(|l| l.starts_with("#[") || l.starts_with("///"))
                .any(|l| l.trim() == "#[non_exhaustive]");
            if !marked {
                errors.push(format!(
                    "{}:{}: {name} is not #[non_exhaustive]",
                    relative(file),
                    i + 1
                ));
            }
        }
    }
    assert!(seen >= 10, "found only {seen} error enums");
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}
