//! The `/metrics` of `examples/prometheus.rs`, run as a process on a
//! private `redis-server`, after traffic and a Redis outage: what
//! Prometheus would scrape, linted by `promtool check metrics`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use crate::support::client;
use crate::support::promtool::{present, run};
use keyed_rate_limit_testing::{RedisServer, free_port};

/// The example's process, killed when dropped.
struct Example(Child);

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Builds the example (a no-op after `cargo test --all-features`, which
/// builds it) and starts it on `port`, against `redis`.
fn start(port: u16, redis: &str) -> Example {
    let mut cargo = Command::new(env!("CARGO"));
    // What cargo set for this test run: build scripts that watch these
    // (ring's watches CARGO_MANIFEST_DIR) would rebuild the whole tree.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_for_tests = [
            "CARGO_PKG_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_BIN_",
        ]
        .iter()
        .any(|p| name.starts_with(p))
            || [
                "CARGO_PRIMARY_PACKAGE",
                "CARGO_TARGET_TMPDIR",
                "CARGO_RUSTC_CURRENT_DIR",
            ]
            .contains(&&*name);
        if set_for_tests {
            cargo.env_remove(&*name);
        }
    }
    let example = [
        "build",
        "--quiet",
        "--example",
        "prometheus",
        "--all-features",
    ];
    let status = cargo
        .args(example)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("run cargo");
    assert!(status.success(), "cargo build --example prometheus");
    // target/<profile>/deps/<this test> → target/<profile>/examples/prometheus
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("examples/prometheus");
    let mut child = Example(
        Command::new(bin)
            .env("PORT", port.to_string())
            .env("REDIS_URL", redis)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start the example"),
    );
    let stdout = child.0.stdout.take().unwrap();
    for line in BufReader::new(stdout).lines() {
        if line.unwrap().starts_with("listening on") {
            return child;
        }
    }
    panic!("the example exited before listening");
}

/// The value of the series `name{labels}` exactly as exposed (0 if absent).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn the_prometheus_examples_exposition_passes_promtool_check_metrics() {
    let mut server = RedisServer::start();
    let port = free_port();
    let _example = tokio::task::spawn_blocking({
        let url = server.url();
        move || start(port, &url)
    })
    .await
    .unwrap();
    let c = client();
    let base = format!("http://127.0.0.1:{port}");
    for _ in 0..7 {
        let status = c.get(&base).send().await.unwrap().status();
        assert!(status == 200 || status == 429, "{status}");
    }
    server.kill(); // SIGKILL: the next answers come from the failure mode
    // From another address: a new key, which no cached deny answers.
    let other = reqwest::Client::builder()
        .no_proxy()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap();
    for _ in 0..3 {
        let status = other.get(&base).send().await.unwrap().status();
        assert!(status == 200 || status == 429, "{status}");
    }
    let text = c
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let decisions = |outcome: &str| {
        value(
            &text,
            &format!(r#"rate_limit_decisions_total{{rule="per-ip",outcome="{outcome}"}}"#),
        )
    };
    assert_eq!(decisions("allow") + decisions("deny"), 10.0, "{text}");
    let fallback: f64 = text
        .lines()
        .filter(|l| l.contains(r#"outcome="local_fallback""#))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(fallback >= 3.0, "the outage's answers: {text}");
    for series in [
        "# HELP rate_limit_decisions_total ",
        "# TYPE rate_limit_backend_seconds histogram",
        r#"rate_limit_redis_timeout_seconds{rule="per-ip"} 0.02"#,
        "rate_limit_breaker_state{rule=\"per-ip\"}",
    ] {
        assert!(text.contains(series), "{series} missing:\n{text}");
    }
    if present() {
        run(std::path::Path::new("."), &["check", "metrics"], &text);
    }
}
