//! Extracts the Rust blocks of README.md and docs/*.md into modules. A
//! block that defines `fn main` is a program and is kept whole; any other
//! is a list of statements, put in a function body. A hidden doctest line
//! (`# …`) fails the build: it would show on GitHub and crates.io and break
//! a paste.
//!
//! README.md and every guide that needs no feature compile with the
//! crate's default features; a guide about a feature (`docs/redis*.md`,
//! `docs/config.md`, …) compiles when this crate's feature of that name is
//! on, as it would in an app that turned it on. CI builds both ways.

use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Fence infos that are not Rust.
const OTHER: [&str; 7] = [
    "text",
    "toml",
    "yaml",
    "sh",
    "mermaid",
    "json",
    "compile_fail",
];

/// The features a guide's blocks need, by file stem; the rest need none.
fn features(stem: &str) -> &'static [&'static str] {
    match stem {
        "config" => &["config"],
        "config_redis" => &["config", "redis"],
        "concurrency_redis" | "describe_redis" | "failure" | "front_redis" | "redis" => &["redis"],
        "redis_cluster" => &["redis-cluster"],
        "redis_tls" => &["redis-tls"],
        "redis_sentinel" => &["redis-sentinel"],
        "grpc" => &["tonic"],
        _ => &[],
    }
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("..");
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut out = String::new();
    let mut problems = Vec::new();
    for file in &files {
        println!("cargo:rerun-if-changed={}", file.display());
        let text = std::fs::read_to_string(file).unwrap();
        for (n, (line, block)) in blocks(&text).into_iter().enumerate() {
            let name = module_name(file, n);
            for (i, l) in block.lines().enumerate() {
                if l == "#" || l.starts_with("# ") {
                    problems.push(format!(
                        "{}:{}: hidden doctest line `{l}`",
                        file.display(),
                        line + 1 + i
                    ));
                }
            }
            let body = if block.contains("fn main(") {
                block.clone()
            } else {
                format!("pub fn snippet() {{\n{block}\n}}")
            };
            let stem = file.file_stem().unwrap().to_string_lossy();
            let cfg: Vec<String> = features(&stem)
                .iter()
                .map(|f| format!("feature = \"{f}\""))
                .collect();
            let gate = if cfg.is_empty() {
                String::new()
            } else {
                format!("#[cfg(all({}))]\n", cfg.join(", "))
            };
            writeln!(
                out,
                "// {}:{}\n{gate}#[rustfmt::skip]\nmod {name} {{\n{body}\n}}\n",
                file.display(),
                line
            )
            .unwrap();
        }
    }
    if !problems.is_empty() {
        panic!(
            "blocks a user cannot paste as shown:\n{}",
            problems.join("\n")
        );
    }
    let dest = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("snippets.rs");
    std::fs::write(dest, out).unwrap();
}

/// The Rust blocks of `text`: the line of each opening fence, and its code.
fn blocks(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut open: Option<(usize, bool, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let Some(info) = line.strip_prefix("```") else {
            if let Some((_, _, code)) = &mut open {
                code.push_str(line);
                code.push('\n');
            }
            continue;
        };
        match open.take() {
            Some((at, rust, code)) => {
                if rust {
                    out.push((at, code));
                }
            }
            None => {
                let rust = !info.split(',').any(|w| OTHER.contains(&w.trim()));
                open = Some((i + 1, rust, String::new()));
            }
        }
    }
    out
}

fn module_name(file: &Path, n: usize) -> String {
    let stem = file.file_stem().unwrap().to_string_lossy().to_lowercase();
    format!(
        "{}_{n}",
        stem.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    )
}
