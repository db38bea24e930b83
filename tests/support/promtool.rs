//! `promtool`, from Debian's `prometheus` package, for the tests of what
//! ships in `deploy/`: the alert rules, the dashboard's queries and a real
//! `/metrics` exposition.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Whether `promtool` can run. Outside CI a missing one skips the test,
/// saying so; CI (`CI` set) must have it, as `.ci/run` installs it.
pub fn present() -> bool {
    let found = Command::new("promtool")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "promtool is missing: .ci/run installs Debian's prometheus package"
        );
        eprintln!("promtool not found (apt-get install prometheus): skipped");
    }
    found
}

/// Runs `promtool args` in `dir` with `stdin`, and asserts it succeeds;
/// returns what it printed.
pub fn run(dir: &Path, args: &[&str], stdin: &str) -> String {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// The metric names a PromQL expression selects: identifiers outside
/// strings, label matchers, ranges and grouping clauses that are not
/// function calls or keywords. promtool has checked the syntax; this only
/// has to find the selectors.
pub fn metric_names(expr: &str) -> Vec<String> {
    // Aggregations stand before `by`/`without` too, not only before `(`.
    const KEYWORDS: [&str; 24] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "offset",
        "bool",
        "and",
        "or",
        "unless",
        "atan2",
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
    ];
    const GROUPING: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let (mut names, mut i) = (Vec::new(), 0);
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    // Past the string that opens at `i`.
    let string_end = |mut i: usize| {
        let q = chars[i];
        i += 1;
        while i < chars.len() && chars[i] != q {
            i += if chars[i] == '\\' { 2 } else { 1 };
        }
        i + 1
    };
    // Past the `close` that matches the `open` at `i`, over strings.
    let skip = |mut i: usize, open: char, close: char| {
        let mut depth = 0;
        while i < chars.len() {
            match chars[i] {
                '"' | '\'' | '`' => {
                    i = string_end(i);
                    continue;
                }
                c if c == open => depth += 1,
                c if c == close => {
                    depth -= 1;
                    if depth == 0 {
                        return i + 1;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        i
    };
    while i < chars.len() {
        let c = chars[i];
        if c == '{' {
            i = skip(i, '{', '}');
        } else if c == '[' {
            i = skip(i, '[', ']');
        } else if c.is_ascii_digit() || c == '.' {
            // A number or a duration (`1h` after `offset`).
            while i < chars.len() && (ident(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if ident(c) {
            let start = i;
            while i < chars.len() && ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let call = chars.get(next) == Some(&'(');
            if GROUPING.contains(&word.as_str()) && call {
                i = skip(next, '(', ')');
            } else if !call
                && !KEYWORDS.contains(&word.as_str())
                && !["inf", "nan"].contains(&word.to_lowercase().as_str())
            {
                names.push(word);
            }
        } else if c == '"' || c == '\'' || c == '`' {
            i = string_end(i);
        } else {
            i += 1;
        }
    }
    names
}

/// Whether `name` is a series of one of the crate's metrics (a
/// histogram's `_bucket`, `_sum` and `_count` too).
pub fn emitted(name: &str) -> bool {
    keyed_rate_limit::observe::METRICS
        .iter()
        .any(|(metric, kind, _)| {
            name == *metric
                || (*kind == "histogram"
                    && ["_bucket", "_sum", "_count"]
                        .iter()
                        .any(|s| name.strip_suffix(s) == Some(metric)))
        })
}
