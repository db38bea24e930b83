//! Reads criterion's own estimates back, so a bench can print ratios
//! measured in the same run.

use std::path::PathBuf;

/// Median time per iteration (ns) criterion recorded for `group/function`.
pub fn median_ns(group: &str, function: &str) -> Option<f64> {
    let dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let path = dir
        .join("criterion")
        .join(group.replace('/', "_"))
        .join(function.replace('/', "_"))
        .join("new")
        .join("estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["median"]["point_estimate"].as_f64()
}

/// Prints `name: a / b = ratio` for each pair that was measured.
pub fn print_ratios(group: &str, pairs: &[(&str, &str)]) {
    println!("\nratios in {group} (median time per op, this run):");
    for (a, b) in pairs {
        match (median_ns(group, a), median_ns(group, b)) {
            (Some(x), Some(y)) => println!("  {a} / {b} = {:.2}  ({x:.0} ns vs {y:.0} ns)", x / y),
            _ => println!("  {a} / {b}: not measured"),
        }
    }
}
