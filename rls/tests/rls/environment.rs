//! `keyed-rls` configured as envoyproxy/ratelimit's image is: by the
//! environment and a runtime directory, with its HTTP endpoints, its
//! switches, and the variables it refuses or takes with no effect.

use std::process::Command;

use crate::process::{Rls, free_port};

/// A domain file whose `user` limit is `n` a minute.
fn user_limit(n: u32) -> String {
    format!(
        "domain: edge\ndescriptors:\n  - key: user\n    rate_limit: {{ unit: minute, requests_per_unit: {n} }}\n"
    )
}

/// The `user` limit the service answers with now.
fn limit_of(rt: &tokio::runtime::Runtime, addr: std::net::SocketAddr) -> u32 {
    rt.block_on(async {
        let mut c = crate::client(addr).await;
        let mut d = crate::descriptor(&[("user", "u")]);
        d.hits_addend = Some(0);
        let r = crate::ask(&mut c, vec![d]).await;
        r.statuses[0]
            .current_limit
            .as_ref()
            .map_or(0, |l| l.requests_per_unit)
    })
}

/// Configured as envoyproxy/ratelimit's image is, by the environment and
/// a runtime directory: the rules follow the symlink swap of the root (a
/// ConfigMap's update) and a write in place; `--help` and a setting it
/// does not support say so.
#[test]
fn the_environment_and_a_runtime_directory_configure_it() {
    use std::os::unix::fs::symlink;
    let help = Command::new(env!("CARGO_BIN_EXE_keyed-rls"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    let text = String::from_utf8(help.stdout).unwrap();
    assert!(
        text.contains("RUNTIME_ROOT") && text.contains("GRPC_PORT"),
        "{text}"
    );
    let memcache = Command::new(env!("CARGO_BIN_EXE_keyed-rls"))
        .env("BACKEND_TYPE", "memcache")
        .output()
        .unwrap();
    assert_eq!(memcache.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&memcache.stderr).contains("BACKEND_TYPE"));

    let root = crate::process::temp_file("runtime", "").with_file_name("runtime-root");
    let version = |v: &str, n: u32| {
        let dir = root.join(v).join("ratelimit/config");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("edge.yaml"), user_limit(n)).unwrap();
    };
    version("v1", 3);
    symlink(root.join("v1"), root.join("current")).unwrap();
    let (port, http, debug) = (free_port(), free_port(), free_port());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_keyed-rls"));
    cmd.env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", port.to_string())
        .env("PORT", http.to_string())
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", debug.to_string())
        .env("RUNTIME_ROOT", root.join("current"))
        .env("RUNTIME_SUBDIRECTORY", "ratelimit");
    let mut rls = Rls::spawn(cmd, ([127, 0, 0, 1], port).into());
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert_eq!(limit_of(&rt, rls.addr), 3);
    // The root swapped atomically to a new version.
    version("v2", 5);
    symlink(root.join("v2"), root.join("current.tmp")).unwrap();
    std::fs::rename(root.join("current.tmp"), root.join("current")).unwrap();
    rls.log_until("rate-limit rules file applied");
    assert_eq!(limit_of(&rt, rls.addr), 5);
    // A write in place.
    std::fs::write(root.join("v2/ratelimit/config/edge.yaml"), user_limit(7)).unwrap();
    rls.log_until("rate-limit rules file applied");
    assert_eq!(limit_of(&rt, rls.addr), 7);

    // envoyproxy/ratelimit's HTTP endpoints: health, and the metrics of
    // every limit, as Prometheus scrapes them.
    let get = |path: &str| {
        reqwest::blocking::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(format!("http://127.0.0.1:{http}{path}"))
            .send()
            .unwrap()
    };
    let health = get("/healthcheck");
    assert_eq!(health.status(), 200);
    assert_eq!(health.text().unwrap(), "OK");
    // An edit that does not load: refused, counted, the running rules stay.
    std::fs::write(
        root.join("v2/ratelimit/config/edge.yaml"),
        "domain: edge\nbogus: 1\n",
    )
    .unwrap();
    rls.log_until("rate-limit rules file rejected");
    assert_eq!(limit_of(&rt, rls.addr), 7);
    // `/json`: ShouldRateLimit in protobuf's JSON mapping, as its clients send it.
    crate::minute_edge();
    let json = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .post(format!("http://127.0.0.1:{http}/json"))
        .body(r#"{"domain": "edge", "descriptors": [{"entries": [{"key": "user", "value": "m"}], "hitsAddend": "7"}]}"#)
        .send()
        .unwrap();
    assert_eq!(json.status(), 200);
    let body: serde_json::Value = json.json().unwrap();
    assert_eq!(body["overallCode"], "OK", "{body}");
    assert_eq!(
        body["statuses"][0]["currentLimit"]["requestsPerUnit"], 7,
        "{body}"
    );
    assert_eq!(
        body["statuses"][0]["currentLimit"]["unit"], "MINUTE",
        "{body}"
    );
    assert!(
        body["statuses"][0].get("limitRemaining").is_none(),
        "0 is left out: {body}"
    );
    // `/rlconfig` on the debug port: the limits as they run.
    let rlconfig = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://127.0.0.1:{debug}/rlconfig"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        rlconfig.contains("edge.user") && rlconfig.contains("7/"),
        "{rlconfig}"
    );
    rt.block_on(async {
        let mut c = crate::client(rls.addr).await;
        // `/json` spent the 7: one more is refused.
        let r = crate::ask(&mut c, vec![crate::descriptor(&[("user", "m")])]).await;
        assert_eq!(r.overall_code, crate::OVER);
    });
    let exposition = get("/metrics").text().unwrap();
    for want in [
        r#"rate_limit_decisions_total{rule="edge.user",outcome="allow"} 1"#,
        r#"rate_limit_decisions_total{rule="edge.user",outcome="deny"} 1"#,
        r#"rate_limit_config_reloads_total{outcome="applied"} 2"#,
        r#"rate_limit_config_reloads_total{outcome="rejected"} 1"#,
    ] {
        assert!(exposition.contains(want), "{want} in:\n{exposition}");
    }
    if crate::support::promtool::present() {
        let dir = std::env::temp_dir();
        crate::support::promtool::run(&dir, &["check", "metrics"], &exposition);
        the_shipped_alert_fires_over(&exposition);
    }
}

/// The shipped `RateLimitConfigReloadRejected` alert, over the service's
/// own exposition as a Prometheus scraping it since minute 4 would see it.
fn the_shipped_alert_fires_over(exposition: &str) {
    let mut series = String::new();
    for line in exposition.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let name = match name.split_once('{') {
            Some((metric, labels)) => format!("{metric}{{instance=\"rls\",{labels}"),
            None => format!("{name}{{instance=\"rls\"}}"),
        };
        series.push_str(&format!(
            "      - series: '{name}'\n        values: '_x4 {value}x10'\n"
        ));
    }
    let rules = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/prometheus/rate-limit.rules.yml"
    );
    let test = format!(
        "rule_files: ['{rules}']
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
{series}    alert_rule_test:
      - eval_time: 6m
        alertname: RateLimitConfigReloadRejected
        exp_alerts:
          - exp_labels:
              severity: warning
              outcome: rejected
              instance: rls
            exp_annotations:
              summary: \"A rate-limit rules file edit was rejected on rls\"
              description: \"The running rules stay; the file on disk is not what runs.\"
"
    );
    let dir = crate::process::temp_file("alerts.test.yml", &test);
    let out = crate::support::promtool::run(
        dir.parent().unwrap(),
        &["test", "rules", dir.to_str().unwrap()],
        "",
    );
    assert!(out.contains("SUCCESS"), "{out}");
}

/// envoyproxy/ratelimit's switches: no rules file at start
/// (`FORCE_START_WITHOUT_INITIAL_CONFIG`) and not healthy until one loads
/// (`HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`), two files of one domain
/// merged (`MERGE_DOMAIN_CONFIG`), every limit in shadow mode
/// (`SHADOW_MODE`); a tuning setting with no effect here is said at start,
/// and one this server does not do stops it, named.
#[test]
fn its_switches_are_honoured_and_the_rest_said() {
    let refused = Command::new(env!("CARGO_BIN_EXE_keyed-rls"))
        .env("LIMIT_RESPONSE_HEADERS_ENABLED", "true")
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("LIMIT_RESPONSE_HEADERS_ENABLED"));

    let dir = crate::process::temp_file("runtime", "").with_file_name("config");
    std::fs::create_dir_all(&dir).unwrap();
    let (port, http) = (free_port(), free_port());
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_keyed-rls"));
    cmd.env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", port.to_string())
        .env("PORT", http.to_string())
        .env("RUNTIME_ROOT", dir.parent().unwrap())
        .env("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")
        .env("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "true")
        .env("MERGE_DOMAIN_CONFIG", "true")
        .env("SHADOW_MODE", "true")
        .env("NEAR_LIMIT_RATIO", "0.5")
        .env("REDIS_POOL_SIZE", "20");
    let mut rls = Rls::spawn(cmd, ([127, 0, 0, 1], port).into());
    rls.log_until("REDIS_POOL_SIZE has no effect here");
    let health = || {
        reqwest::blocking::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .get(format!("http://127.0.0.1:{http}/healthcheck"))
            .send()
            .unwrap()
            .status()
    };
    assert_eq!(health(), 500, "no rules yet");
    // One domain in two files: merged. A dotfile is read too (by default).
    std::fs::write(dir.join("a.yaml"), user_limit(1)).unwrap();
    std::fs::write(
        dir.join("b.yaml"),
        "domain: edge\ndescriptors:\n  - key: path\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n",
    )
    .unwrap();
    rls.log_until("rate-limit rules file applied");
    assert_eq!(health(), 200);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = crate::client(rls.addr).await;
        crate::minute_edge();
        for entries in [[("user", "s")], [("path", "/")]] {
            let mut left = Vec::new();
            for _ in 0..3 {
                let r = crate::ask(&mut c, vec![crate::descriptor(&entries)]).await;
                // Shadow mode: over the limit, and still OK.
                assert_eq!(r.overall_code, crate::OK, "{entries:?}");
                left.push(r.statuses[0].limit_remaining);
            }
            assert_eq!(left, [0, 0, 0], "{entries:?}: a limit of 1, counted");
        }
    });
    // Per limit: the shadow refusals and the near-limit allows, counted.
    let exposition = reqwest::blocking::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://127.0.0.1:{http}/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    for limit in ["edge.user", "edge.path"] {
        for want in [
            format!(r#"rate_limit_decisions_total{{rule="{limit}",outcome="shadow_deny"}} 2"#),
            format!(r#"rate_limit_decisions_total{{rule="{limit}",outcome="near_limit"}} 1"#),
        ] {
            assert!(exposition.contains(&want), "{want} in:\n{exposition}");
        }
    }
}

/// `REDIS_TLS` and envoyproxy/ratelimit's certificate variables: two
/// processes count one limit together over a TLS Redis that asks for a
/// client certificate, trusting a private CA.
#[test]
fn redis_tls_and_its_certificates_are_honoured() {
    let redis = keyed_rate_limit_testing::RedisServer::start_tls();
    let config = crate::process::temp_file("edge.yaml", &user_limit(3));
    let dir = config.parent().unwrap().to_owned();
    for name in ["ca.pem", "cert.pem", "key.pem"] {
        std::fs::write(dir.join(name), redis.pem(name)).unwrap();
    }
    let start = |client_cert: bool| {
        let port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_keyed-rls"));
        cmd.args(["--listen", &format!("127.0.0.1:{port}"), "--config"])
            .arg(&config)
            .env("REDIS_URL", format!("127.0.0.1:{}", redis.port()))
            .env("REDIS_TLS", "true")
            .env("REDIS_TLS_CACERT", dir.join("ca.pem"));
        for (name, value) in [("PORT", "0"), ("HOST", "127.0.0.1")] {
            cmd.env(name, value).env(format!("DEBUG_{name}"), value);
        }
        if client_cert {
            cmd.env("REDIS_TLS_CLIENT_CERT", dir.join("cert.pem"))
                .env("REDIS_TLS_CLIENT_KEY", dir.join("key.pem"));
        }
        (cmd, port)
    };
    // Without its certificate the server refuses the handshake: no start.
    let (mut refused, _) = start(false);
    let mut child = refused.stderr(std::process::Stdio::null()).spawn().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("started without a client certificate");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(!status.success());
    // One of the pair alone: refused by name.
    let half = Command::new(env!("CARGO_BIN_EXE_keyed-rls"))
        .env("REDIS_TLS_CLIENT_CERT", dir.join("cert.pem"))
        .output()
        .unwrap();
    assert_eq!(half.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&half.stderr).contains("REDIS_TLS_CLIENT_KEY"));

    let spawn = || {
        let (cmd, port) = start(true);
        Rls::spawn(cmd, ([127, 0, 0, 1], port).into())
    };
    let (a, b) = (spawn(), spawn());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = [crate::client(a.addr).await, crate::client(b.addr).await];
        crate::minute_edge();
        let mut ok = 0;
        for i in 0..6 {
            let r = crate::ask(&mut c[i % 2], vec![crate::descriptor(&[("user", "t")])]).await;
            ok += usize::from(r.overall_code == crate::OK);
        }
        assert_eq!(
            ok, 3,
            "a minute's 3 across both processes, counted in Redis over TLS"
        );
    });
}
