//! The workspace's rule on `unsafe`, checked on its sources with plain string scanning (no
//! burn, no parser): the SAFETY inventory, `SAFETY.md` beside this crate's `Cargo.toml`, lists
//! every `unsafe` site of the workspace with its count, and nothing else; crates with no site
//! inherit the workspace's lints (`unsafe_code = "forbid"`).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// `(file, function)` → how many `unsafe` keywords (`unsafe {`, `unsafe fn`, `unsafe impl`)
/// and the line of the first.
type Sites = BTreeMap<(String, String), (usize, usize)>;

fn kernels_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn workspace_dir() -> PathBuf {
    kernels_dir().join("../..").canonicalize().unwrap()
}

/// `src` with its comments, strings and character literals blanked to spaces (line breaks
/// kept), so that only code is left to scan.
fn code_only(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < c.len() {
        let start = i;
        // `#`s of a raw string starting here (`r"…"`, `r#"…"#`, `br"…"`), if one does.
        let raw_hashes = (c[i] == 'r'
            && (i == 0 || !ident(c[i - 1]) || (c[i - 1] == 'b' && (i < 2 || !ident(c[i - 2])))))
        .then(|| c[i + 1..].iter().take_while(|&&ch| ch == '#').count())
        .filter(|&hashes| at(i + 1 + hashes) == '"');
        if c[i] == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    (depth, i) = (depth + 1, i + 2);
                } else if c[i] == '*' && at(i + 1) == '/' {
                    (depth, i) = (depth - 1, i + 2);
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if let Some(hashes) = raw_hashes {
            i += hashes + 2;
            while i < c.len() && !(c[i] == '"' && (1..=hashes).all(|h| at(i + h) == '#')) {
                i += 1;
            }
            i += 1 + hashes;
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c[i] == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A character literal ('x', '\n', '\'', '\u{…}'); a lifetime or a label stays.
            i += if at(i + 1) == '\\' { 3 } else { 2 };
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            i += 1;
        } else {
            out.push(c[i]);
            i += 1;
            continue;
        }
        i = i.min(c.len());
        out.extend(
            c[start..i]
                .iter()
                .map(|&ch| if ch == '\n' { '\n' } else { ' ' }),
        );
    }
    out
}

/// The words and punctuation marks of code, each with its line.
fn tokens(code: &str) -> Vec<(String, usize)> {
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let mut word = String::new();
        for ch in line.chars().chain([' ']) {
            if ch.is_alphanumeric() || ch == '_' {
                word.push(ch);
                continue;
            }
            if !word.is_empty() {
                out.push((std::mem::take(&mut word), n + 1));
            }
            if !ch.is_whitespace() {
                out.push((ch.to_string(), n + 1));
            }
        }
    }
    out
}

/// The `unsafe` keywords of one source file, counted by site: the function they are in or,
/// for `unsafe fn`, declare (`Type::name` for a method, `name!` for a `macro_rules!`); `impl
/// Trait for Type` for `unsafe impl`; `(module)` outside any function.
fn unsafe_sites(src: &str) -> BTreeMap<String, (usize, usize)> {
    enum Scope {
        Fn(String),
        Impl(String),
        Block,
    }
    let tokens = tokens(&code_only(src));
    let word = |k: usize| tokens.get(k).map_or("", |(t, _)| t.as_str());
    let is_name = |t: &str| t.starts_with(|ch: char| ch.is_alphabetic() || ch == '_');
    // The header of the `impl` block at `k` (`Trait for Type`, generic parameters dropped) and
    // its type's name.
    let impl_header = |k: usize| {
        let (mut j, mut depth, mut header) = (k + 1, 0i32, Vec::new());
        while j < tokens.len() && !(depth == 0 && matches!(word(j), "{" | "where")) {
            match word(j) {
                "<" => depth += 1,
                ">" if word(j - 1) != "-" => depth -= 1,
                w if depth == 0 => header.push(w),
                _ => {}
            }
            j += 1;
        }
        let ty = header.rsplit(|&w| w == "for").next().unwrap_or(&[]);
        let ty = ty.iter().rev().find(|w| is_name(w)).copied().unwrap_or("?");
        (header.join(" ").replace(" : : ", "::"), ty.to_string())
    };
    let mut stack: Vec<Scope> = Vec::new();
    // The scope the next `{` opens, and the depth of brackets where it was declared: a `;` at
    // that depth first cancels it (a declaration without a body; not the `;` of `[u8; 4]`).
    let mut pending: Option<(Scope, i32)> = None;
    let mut brackets = 0;
    let mut sites: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for k in 0..tokens.len() {
        // A function declared here: `Type::name` directly inside `impl Type`.
        let declared = |name: &str| match stack.last() {
            Some(Scope::Impl(ty)) => format!("{ty}::{name}"),
            _ => name.to_string(),
        };
        match word(k) {
            "fn" if is_name(word(k + 1)) => {
                pending = Some((Scope::Fn(declared(word(k + 1))), brackets))
            }
            "macro_rules" if word(k + 1) == "!" => {
                pending = Some((Scope::Fn(format!("{}!", word(k + 2))), brackets))
            }
            // An `impl` block, not `impl Trait` in a signature: after an item or an attribute.
            "impl" if k == 0 || matches!(word(k - 1), "{" | "}" | ";" | "]" | "unsafe") => {
                pending = Some((Scope::Impl(impl_header(k).1), brackets))
            }
            "unsafe" => {
                let site = match word(k + 1) {
                    "fn" => declared(word(k + 2)),
                    "impl" => format!("impl {}", impl_header(k + 1).0),
                    _ => stack
                        .iter()
                        .rev()
                        .find_map(|s| match s {
                            Scope::Fn(name) => Some(name.clone()),
                            _ => None,
                        })
                        .unwrap_or_else(|| "(module)".into()),
                };
                let entry = sites.entry(site).or_insert((0, tokens[k].1));
                entry.0 += 1;
            }
            "{" => stack.push(pending.take().map_or(Scope::Block, |(scope, _)| scope)),
            "}" => {
                stack.pop();
            }
            "(" | "[" => brackets += 1,
            ")" | "]" => brackets -= 1,
            ";" if pending
                .as_ref()
                .is_some_and(|&(_, depth)| depth == brackets) =>
            {
                pending = None
            }
            _ => {}
        }
    }
    sites
}

/// Every `.rs` file under `dir` (not under `target/` or hidden folders), sorted.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let mut entries: Vec<PathBuf> = entries.map(|e| e.unwrap().path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&path, out);
            }
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

/// The sites of every file under `dirs` (relative to `root`), keyed by the file's path
/// relative to `root` (with `/`).
fn scan(root: &Path, dirs: &[PathBuf], skip: Option<&Path>) -> Sites {
    let mut files = Vec::new();
    for dir in dirs {
        rust_files(dir, &mut files);
    }
    let mut sites = Sites::new();
    for file in files {
        if skip.is_some_and(|skip| file.starts_with(skip)) {
            continue;
        }
        let relative = file
            .strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let src = fs::read_to_string(&file).unwrap();
        for (site, count) in unsafe_sites(&src) {
            sites.insert((relative.clone(), site), count);
        }
    }
    sites
}

/// SAFETY.md's two tables: the rows under `## Sites in xfmr-kernels` (files relative to the
/// crate) and under `## Sites outside xfmr-kernels` (relative to the workspace), each row
/// `| file | function | count | why it is sound |`.
fn inventory() -> [Sites; 2] {
    let text = fs::read_to_string(kernels_dir().join("SAFETY.md")).unwrap();
    let mut tables = [Sites::new(), Sites::new()];
    let mut table = None;
    for (n, line) in text.lines().enumerate() {
        if let Some(heading) = line.strip_prefix("## ") {
            table = match heading {
                h if h.starts_with("Sites in xfmr-kernels") => Some(0),
                h if h.starts_with("Sites outside xfmr-kernels") => Some(1),
                _ => None,
            };
            continue;
        }
        let Some(t) = table.filter(|_| line.starts_with('|')) else {
            continue;
        };
        let cells: Vec<&str> = line
            .splitn(5, '|')
            .map(|c| c.trim().trim_matches('`'))
            .collect();
        assert_eq!(
            cells.len(),
            5,
            "SAFETY.md:{}: not `| file | function | count | why |`",
            n + 1
        );
        if cells[1] == "file" || cells[1].starts_with("---") {
            continue;
        }
        let count: usize = cells[3].parse().unwrap_or_else(|_| {
            panic!(
                "SAFETY.md:{}: the count {:?} is not a number",
                n + 1,
                cells[3]
            )
        });
        assert!(
            count > 0 && cells[4].len() > 1,
            "SAFETY.md:{}: a row needs a count and a reason",
            n + 1
        );
        let key = (cells[1].to_string(), cells[2].to_string());
        let twice = tables[t].insert(key, (count, n + 1));
        assert!(
            twice.is_none(),
            "SAFETY.md:{}: `{}` `{}` is listed twice",
            n + 1,
            cells[1],
            cells[2]
        );
    }
    tables
}

/// Where the sources and the inventory disagree, one line each.
fn differences(what: &str, found: &Sites, listed: &Sites) -> Vec<String> {
    let mut out = Vec::new();
    for ((file, site), &(count, line)) in found {
        match listed.get(&(file.clone(), site.clone())) {
            None => out.push(format!(
                "{what}{file}:{line}: `{site}` has {count} `unsafe`, which SAFETY.md does not list \
                 (add a row: why it is sound)"
            )),
            Some(&(listed, row)) if listed != count => out.push(format!(
                "{what}{file}:{line}: `{site}` has {count} `unsafe`; SAFETY.md:{row} says {listed}"
            )),
            Some(_) => {}
        }
    }
    for ((file, site), &(count, row)) in listed {
        if !found.contains_key(&(file.clone(), site.clone())) {
            out.push(format!(
                "SAFETY.md:{row}: lists `{file}` `{site}` ({count}), which has no `unsafe` \
                 (moved, renamed or gone: update the row)"
            ));
        }
    }
    out
}

/// Every `unsafe` in xfmr-kernels (`src/`, `tests/`) and in the rest of the workspace (its
/// crates, the fuzz targets, the benches and examples) is a row of SAFETY.md with its count,
/// and every row is an `unsafe` site; each crate with no site inherits the workspace's lints,
/// which forbid `unsafe_code`, and each crate with sites denies it (allowed per item).
#[test]
fn architecture_safety_inventory_lists_every_unsafe_site() {
    let kernels = kernels_dir();
    let workspace = workspace_dir();
    let [listed_kernels, listed_outside] = inventory();
    let found_kernels = scan(
        &kernels,
        &[kernels.join("src"), kernels.join("tests")],
        None,
    );
    let outside_dirs = ["crates", "fuzz", "benches", "examples"].map(|d| workspace.join(d));
    let found_outside = scan(
        &workspace,
        &outside_dirs,
        Some(&workspace.join("crates/xfmr-kernels")),
    );
    assert!(
        found_kernels
            .keys()
            .any(|(file, _)| file == "src/quant/dot.rs"),
        "the scan found none of the known sites: {found_kernels:?}"
    );
    let mut problems = differences("crates/xfmr-kernels/", &found_kernels, &listed_kernels);
    problems.extend(differences("", &found_outside, &listed_outside));

    // The lints of each crate: `[lints] workspace = true` (forbid) where it has no site,
    // `unsafe_code = "deny"` where it has.
    let mut crates: Vec<PathBuf> = fs::read_dir(workspace.join("crates"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    crates.push(workspace.join("fuzz"));
    for dir in crates {
        let relative = dir
            .strip_prefix(&workspace)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let manifest = fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let manifest: String = manifest
            .lines()
            .filter(|l| !l.trim_start().starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        let has_sites = relative == "crates/xfmr-kernels"
            || found_outside
                .keys()
                .any(|(file, _)| file.starts_with(&format!("{relative}/")));
        let inherits = manifest.contains("[lints]\nworkspace = true");
        let denies = manifest.contains("unsafe_code = \"deny\"")
            || manifest.contains("unsafe_code = \"forbid\"");
        if has_sites && !manifest.contains("unsafe_code = \"deny\"") {
            problems.push(format!(
                "{relative}/Cargo.toml: has `unsafe` sites but does not deny `unsafe_code`"
            ));
        } else if !has_sites && !inherits && !denies {
            problems.push(format!(
                "{relative}/Cargo.toml: neither inherits the workspace's lints (`[lints] workspace = true`) \
                 nor forbids `unsafe_code`"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "the SAFETY inventory (crates/xfmr-kernels/SAFETY.md) and the sources disagree:\n{}",
        problems.join("\n")
    );
}

/// The scanner itself: comments, strings (raw ones too), character literals and `impl Trait`
/// arguments are not code; sites are named as the inventory names them.
#[test]
fn architecture_scanner_finds_what_it_should() {
    let src = r####"
        // unsafe { in a comment }
        /* unsafe /* nested */ unsafe */
        const S: &str = "unsafe { \" }";
        const R: &str = r#"unsafe " { "#;
        const C: char = '{';
        fn free<'a>(x: &'a u8, f: impl Fn() -> u8) -> u8 { unsafe { g() }; unsafe { g() } }
        fn array() -> [u8; 4] { let _ = ('\'', '\\', b'"'); unsafe { g() } }
        trait T { unsafe fn declared(); fn after(); }
        struct Task;
        impl<'a> Task {
            unsafe fn product() {}
            fn run(&self) { let _ = |x: u8| unsafe { g() }; }
        }
        macro_rules! on_path { ($x:expr) => { unsafe { $x } }; }
        unsafe impl Send for Task {}
        #[cfg(test)]
        mod tests { fn t() { unsafe { g() } } }
    "####;
    let sites = unsafe_sites(src);
    let expected: Vec<(&str, usize)> = vec![
        ("Task::product", 1),
        ("Task::run", 1),
        ("array", 1),
        ("declared", 1),
        ("free", 2),
        ("impl Send for Task", 1),
        ("on_path!", 1),
        ("t", 1),
    ];
    let got: Vec<(&str, usize)> = sites.iter().map(|(s, &(n, _))| (s.as_str(), n)).collect();
    assert_eq!(got, expected);
}
