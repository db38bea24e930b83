//! What `cargo add keyed-rate-limit` links: none of the rate-limit
//! service's dependencies (the service is its own crate, `keyed-rls`), and
//! as many crates as before the service moved out.

use std::collections::BTreeSet;
use std::process::Command;

/// The crates of the library's default build, itself included, as
/// `cargo tree -e normal` counted them when the service moved out.
const DEFAULT_CRATES: usize = 79;

#[test]
fn the_default_build_links_none_of_the_services_dependencies() {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "--offline", "-e", "normal", "--prefix", "none"])
        .args(["-p", "keyed-rate-limit", "--manifest-path"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "cargo tree: {stderr}");
    let text = String::from_utf8(out.stdout).unwrap();
    let crates: BTreeSet<&str> = text.lines().map(|l| l.trim_end_matches(" (*)")).collect();
    let names: BTreeSet<&str> = crates.iter().filter_map(|c| c.split(' ').next()).collect();
    for service in [
        "keyed-rls",
        "prost-types",
        "tonic-prost",
        "prost",
        "tonic",
        "tonic-health",
        "tracing-subscriber",
        "metrics-exporter-prometheus",
    ] {
        assert!(!names.contains(service), "{service} in the default build");
    }
    assert_eq!(crates.len(), DEFAULT_CRATES, "{crates:#?}");
}
