//! What the documentation shows is what it documents: no visible example
//! or sentence names an item the docs hide (`#[doc(hidden)]`), and nothing
//! the package ships cites a file it leaves out (`docs/adr/` is not in
//! Cargo.toml's `include`).

use std::path::{Path, PathBuf};

use crate::architecture::rust_files;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn sources() -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|f| {
            let text = std::fs::read_to_string(&f).unwrap();
            (f, text)
        })
        .collect()
}

/// Every line a reader of the docs sees: the guides and README whole, and
/// the doc comments of the source but for hidden doctest lines (`# …`).
fn visible_lines() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut guides = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            guides.push(path);
        }
    }
    for path in guides {
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, line) in text.lines().enumerate() {
            out.push((format!("{}:{}", path.display(), i + 1), line.to_owned()));
        }
    }
    for (path, text) in sources() {
        for (i, line) in text.lines().enumerate() {
            let t = line.trim_start();
            let Some(doc) = t.strip_prefix("///").or_else(|| t.strip_prefix("//!")) else {
                continue;
            };
            let doc = doc.strip_prefix(' ').unwrap_or(doc);
            if doc == "#" || doc.starts_with("# ") {
                continue;
            }
            out.push((format!("{}:{}", path.display(), i + 1), doc.to_owned()));
        }
    }
    out
}

/// The names of `pub` items under `#[doc(hidden)]`, and whether each is a
/// function; names that a visible `pub fn` also has are left out (a reader
/// cannot tell `layer.rules()` from a hidden `rules()` by the name).
fn hidden_items() -> Vec<(String, bool)> {
    let mut hidden = Vec::new();
    let mut visible = Vec::new();
    for (_, text) in sources() {
        let lines: Vec<&str> = text.lines().map(str::trim_start).collect();
        for (i, line) in lines.iter().enumerate() {
            let item = ["pub const fn ", "pub fn ", "pub const ", "pub struct "]
                .iter()
                .find_map(|p| line.strip_prefix(p).map(|rest| (rest, p.ends_with("fn "))));
            let Some((rest, is_fn)) = item else {
                continue;
            };
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            let attrs = lines[..i]
                .iter()
                .rev()
                .take_while(|l| l.starts_with("#[") || l.starts_with("///"));
            if attrs.into_iter().any(|l| *l == "#[doc(hidden)]") {
                hidden.push((name, is_fn));
            } else if is_fn {
                visible.push(name);
            }
        }
    }
    hidden.retain(|(name, _)| !visible.contains(name));
    hidden.sort();
    hidden.dedup();
    hidden
}

#[test]
fn no_visible_doc_names_a_hidden_item() {
    let hidden = hidden_items();
    let names: Vec<&str> = hidden.iter().map(|(n, _)| n.as_str()).collect();
    // Those this test was written for; it finds them by itself.
    for want in ["emission_interval", "DescribedRule", "METRICS"] {
        assert!(names.contains(&want), "{want} not found hidden: {names:?}");
    }
    let mut found = Vec::new();
    for (at, line) in visible_lines() {
        for (name, is_fn) in &hidden {
            let uses = if *is_fn {
                [
                    format!(".{name}("),
                    format!("::{name}("),
                    format!("::{name})"),
                ]
                .iter()
                .any(|p| line.contains(p.as_str()))
            } else {
                line.contains(&format!("::{name}"))
            };
            if uses {
                found.push(format!("{at}: {name}: {line}"));
            }
        }
        // `Description::rules()` is hidden but shares its name with
        // `RateLimitLayer::rules()`: its rows are read by field, not getter.
        if let Some((_, after)) = line.split_once(".rules()[") {
            let field = after.split_once("].").map(|(_, f)| f);
            let is_field = field.is_some_and(|f| {
                let name_len = f
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .count();
                !f[name_len..].starts_with('(')
            });
            if is_field {
                found.push(format!("{at}: a described rule's field: {line}"));
            }
        }
    }
    assert!(
        found.is_empty(),
        "hidden items in the docs:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_shipped_docs_cite_no_file_left_out_of_the_package() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    assert!(
        !manifest.contains("\"/docs/adr"),
        "docs/adr ships now: this test can go"
    );
    let cites: Vec<String> = visible_lines()
        .into_iter()
        .filter(|(_, line)| cites_a_left_out_file(line))
        .map(|(at, line)| format!("{at}: {line}"))
        .collect();
    assert!(
        cites.is_empty(),
        "paths docs.rs readers cannot open:\n{}",
        cites.join("\n")
    );
}

/// Whether `line` names a path under `docs/adr` other than in a link to
/// the repository (a URL, or the text of a Markdown link to one).
fn cites_a_left_out_file(line: &str) -> bool {
    // Without its URLs.
    let mut rest = line;
    let mut text = String::new();
    while let Some(at) = rest.find("https://") {
        text.push_str(&rest[..at]);
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || c == ')')
            .map_or(rest.len(), |e| at + e);
        rest = &rest[end..];
    }
    text.push_str(rest);
    text.match_indices("docs/adr").any(|(at, _)| {
        let word = text[at..].split(char::is_whitespace).next().unwrap_or("");
        // `[docs/adr/](…)`: the text of a link whose URL was just removed.
        !word.contains("](")
    })
}

#[test]
fn a_citation_is_told_from_a_link() {
    assert!(cites_a_left_out_file(
        "Getters, named after their setters (`docs/adr/0017`)."
    ));
    assert!(!cites_a_left_out_file(
        "and [docs/adr/](https://github.com/o/r/tree/main/docs/adr) the design decisions."
    ));
    assert!(!cites_a_left_out_file(
        "[ADR 19](https://github.com/o/r/blob/main/docs/adr/0019-x.md))."
    ));
}

/// A per-request quota in the guides and examples is `Rule::computed`:
/// `Rule::new(.., quota).quota_fn(..)` shows a static quota that is never
/// used (the auth guide's "anonymous requests" quota was such a one).
#[test]
fn the_guides_write_a_computed_quota_as_rule_computed() {
    let mut files = vec![root().join("README.md")];
    for dir in ["docs", "examples"] {
        for entry in std::fs::read_dir(root().join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md" || e == "rs") {
                files.push(path);
            }
        }
    }
    let mut found = Vec::new();
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, line) in text.lines().enumerate() {
            // `Registry::quota_fn("name", ..)` names a closure for rule files.
            if line.contains(".quota_fn(|") {
                found.push(format!("{}:{}: {line}", path.display(), i + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "use Rule::computed:\n{}",
        found.join("\n")
    );
}
