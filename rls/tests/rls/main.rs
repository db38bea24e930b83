//! The rate-limit service over real gRPC: a tonic server on 127.0.0.1 and
//! Envoy's generated client (`keyed_rls::pb`), a private `redis-server` for
//! global limits; the `keyed-rls` binary as a process, driven by clients
//! this project did not write: grpcio's stubs from `xds-protos`
//! (`binary.rs`) and Envoy 1.40 (`envoy.rs`).

mod support;

mod binary;
mod environment;
mod envoy;
mod envoyproxy;
mod process;
mod service;

use std::net::SocketAddr;

use keyed_rate_limit_testing::RedisServer;
use keyed_rls::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use keyed_rls::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use keyed_rls::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use keyed_rls::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use keyed_rls::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use keyed_rls::{RateLimitServer, RlsConfig};
use tonic::transport::Channel;

use crate::support::Backend as _;

const CONFIG: &str = "domain: edge
descriptors:
  - key: remote_address
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    value: /login
    rate_limit: { unit: minute, requests_per_unit: 2, name: login }
  - key: path
    value: /export*
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: path
    value: /health
    rate_limit: { unlimited: true }
  - key: path
    value: /closed
    rate_limit: { unit: second, requests_per_unit: 0 }
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit: { unit: minute, requests_per_unit: 2 }
      - key: plan
        rate_limit: { unit: minute, requests_per_unit: 4 }
  - key: trial
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: generic_key
    value: strict
    rate_limit: { unit: minute, requests_per_unit: 5, name: strict, replaces: [{ name: login }] }
  - key: no_limit_here
";

/// Serves `server` on an ephemeral port of 127.0.0.1.
/// Seconds to the end of the clock's minute, the window of a `minute`
/// limit counted as envoyproxy/ratelimit counts it. An edge less than 2 s
/// away is waited out first, so that what a test sends next falls in one
/// window: every server a test starts waits here.
fn minute_edge() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let left = 60.0 - now % 60.0;
    if left < 2.0 {
        std::thread::sleep(std::time::Duration::from_secs_f64(left + 0.05));
        return 60;
    }
    left.ceil() as u64
}

async fn serve(server: RateLimitServer) -> SocketAddr {
    minute_edge();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(server.into_service())
            .serve_with_incoming(
                tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
            ),
    );
    addr
}

async fn client(addr: SocketAddr) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

/// A `remote_address` descriptor whose `limit` overrides its quota with
/// one an hour.
fn one_an_hour(ip: &str) -> RateLimitDescriptor {
    let mut d = descriptor(&[("remote_address", ip)]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: 3, // HOUR
    });
    d
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "edge".into(),
        descriptors,
        hits_addend: 0,
    }
}

async fn ask(
    c: &mut RateLimitServiceClient<Channel>,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    c.should_rate_limit(request(descriptors))
        .await
        .unwrap()
        .into_inner()
}

fn codes(r: &RateLimitResponse) -> Vec<i32> {
    r.statuses.iter().map(|s| s.code).collect()
}

const OK: i32 = Code::Ok as i32;
const OVER: i32 = Code::OverLimit as i32;

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key == name)
        .map(|h| h.value.as_str())
}

async fn local_server() -> RateLimitServiceClient<Channel> {
    let config = RlsConfig::from_yaml_str(CONFIG).unwrap();
    let server = RateLimitServer::builder(config).build().unwrap();
    client(serve(server).await).await
}

#[tokio::test]
async fn each_descriptor_admits_exactly_its_quota_with_the_draft_headers() {
    let mut c = local_server().await;
    let ip = || vec![descriptor(&[("remote_address", "192.0.2.1")])];
    for left in [2, 1, 0] {
        let r = ask(&mut c, ip()).await;
        assert_eq!(r.overall_code, OK);
        assert_eq!(r.statuses[0].limit_remaining, left);
        let limit = r.statuses[0].current_limit.as_ref().unwrap();
        assert_eq!((limit.requests_per_unit, limit.unit), (3, 2), "3 a minute");
        assert_eq!(
            header(&r, "ratelimit-policy"),
            Some(r#""edge.remote_address";q=3;w=60"#)
        );
        assert!(
            header(&r, "ratelimit")
                .unwrap()
                .contains(&format!(";r={left};"))
        );
        assert!(r.raw_body.is_empty());
    }
    let edge = minute_edge();
    let r = ask(&mut c, ip()).await;
    assert_eq!((r.overall_code, codes(&r)), (OVER, vec![OVER]));
    // The minute's end, as envoyproxy/ratelimit's windows follow the clock.
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((edge - 1..=edge).contains(&retry), "{retry} of {edge}");
    let reset = r.statuses[0].duration_until_reset.unwrap().seconds as u64;
    assert!((edge - 1..=edge).contains(&reset), "{reset} of {edge}");
    assert_eq!(header(&r, "content-type"), Some("application/problem+json"));
    let body = String::from_utf8(r.raw_body.clone()).unwrap();
    assert!(body.contains(r#""status":429"#), "{body}");
    // Another address has its own counter.
    let r = ask(&mut c, vec![descriptor(&[("remote_address", "192.0.2.2")])]).await;
    assert_eq!(r.overall_code, OK);
}

#[tokio::test]
async fn statuses_follow_the_request_and_each_descriptor_counts_on_its_own() {
    let mut c = local_server().await;
    let both = || {
        vec![
            descriptor(&[("path", "/login")]),
            descriptor(&[("no_limit_here", "x")]),
            descriptor(&[("remote_address", "198.51.100.7")]),
        ]
    };
    assert_eq!(codes(&ask(&mut c, both()).await), [OK, OK, OK]);
    assert_eq!(codes(&ask(&mut c, both()).await), [OK, OK, OK]);
    let r = ask(&mut c, both()).await;
    assert_eq!(codes(&r), [OVER, OK, OK], "login is 2 a minute");
    assert_eq!(r.overall_code, OVER);
    assert!(r.statuses[1].current_limit.is_none(), "no limit matched");
    assert_eq!(r.statuses[0].current_limit.as_ref().unwrap().name, "login");
    // The address was counted on the refused request too: 3 of 3.
    let r = ask(
        &mut c,
        vec![descriptor(&[("remote_address", "198.51.100.7")])],
    )
    .await;
    assert_eq!(codes(&r), [OVER]);
}

#[tokio::test]
async fn hits_addend_zero_checks_and_above_one_spends_that_many() {
    let mut c = local_server().await;
    let with_hits = |n: Option<u64>| {
        let mut d = descriptor(&[("remote_address", "203.0.113.9")]);
        d.hits_addend = n;
        vec![d]
    };
    let r = ask(&mut c, with_hits(Some(0))).await;
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), (vec![OK], 3));
    let r = ask(&mut c, with_hits(Some(2))).await;
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), (vec![OK], 1));
    let r = ask(&mut c, with_hits(Some(0))).await;
    assert_eq!(r.statuses[0].limit_remaining, 1, "a check spends nothing");
    let r = ask(&mut c, with_hits(Some(2))).await;
    assert_eq!(codes(&r), [OVER], "2 more of 1 left");
    // The request's own hits_addend, when the descriptor has none.
    let mut req = request(vec![descriptor(&[("remote_address", "203.0.113.10")])]);
    req.hits_addend = 3;
    let r = c.should_rate_limit(req).await.unwrap().into_inner();
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), (vec![OK], 0));
}

#[tokio::test]
async fn a_descriptors_limit_overrides_its_quota_with_counters_of_its_own() {
    let mut c = local_server().await;
    let overridden = || vec![one_an_hour("192.0.2.50")];
    let r = ask(&mut c, overridden()).await;
    let limit = r.statuses[0].current_limit.as_ref().unwrap();
    assert_eq!((limit.requests_per_unit, limit.unit), (1, 3));
    assert_eq!(codes(&r), [OK]);
    assert_eq!(codes(&ask(&mut c, overridden()).await), [OVER]);
    // The configured quota's counter is untouched.
    let r = ask(
        &mut c,
        vec![descriptor(&[("remote_address", "192.0.2.50")])],
    )
    .await;
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), (vec![OK], 2));
}

#[tokio::test]
async fn nested_wildcard_shadow_unlimited_blocked_and_replaced_limits() {
    let mut c = local_server().await;
    // Nested: the exact value first, then the key alone (one counter per value).
    let free = || vec![descriptor(&[("tenant", "acme"), ("plan", "free")])];
    let pro = |t: &str| vec![descriptor(&[("tenant", t), ("plan", "pro")])];
    assert_eq!(codes(&ask(&mut c, free()).await), [OK]);
    assert_eq!(codes(&ask(&mut c, free()).await), [OK]);
    assert_eq!(codes(&ask(&mut c, free()).await), [OVER], "free: 2");
    for _ in 0..4 {
        assert_eq!(codes(&ask(&mut c, pro("acme")).await), [OK]);
    }
    assert_eq!(
        codes(&ask(&mut c, pro("acme")).await),
        [OVER],
        "other plans: 4"
    );
    assert_eq!(codes(&ask(&mut c, pro("globex")).await), [OK], "per tenant");
    // A tenant alone matches a node without a limit: let through.
    let r = ask(&mut c, vec![descriptor(&[("tenant", "acme")])]).await;
    assert_eq!(
        (codes(&r), r.statuses[0].current_limit.is_none()),
        (vec![OK], true)
    );
    // Wildcard: every /export… path, one counter each.
    let export = |p: &str| vec![descriptor(&[("path", p)])];
    assert_eq!(codes(&ask(&mut c, export("/export/a")).await), [OK]);
    assert_eq!(codes(&ask(&mut c, export("/export/a")).await), [OVER]);
    assert_eq!(codes(&ask(&mut c, export("/export/b")).await), [OK]);
    // Shadow: counted, never over.
    for _ in 0..3 {
        assert_eq!(
            codes(&ask(&mut c, vec![descriptor(&[("trial", "t")])]).await),
            [OK]
        );
    }
    // Unlimited and blocked.
    for _ in 0..3 {
        assert_eq!(codes(&ask(&mut c, export("/health")).await), [OK]);
    }
    let r = ask(&mut c, export("/closed")).await;
    assert_eq!((codes(&r), r.overall_code), (vec![OVER], OVER));
    // `strict` replaces `login`: together, login does not apply.
    for _ in 0..4 {
        let r = ask(
            &mut c,
            vec![
                descriptor(&[("path", "/login")]),
                descriptor(&[("generic_key", "strict")]),
            ],
        )
        .await;
        assert_eq!(codes(&r), [OK, OK]);
    }
}

#[tokio::test]
async fn malformed_requests_get_a_clear_status() {
    let mut c = local_server().await;
    let mut empty_domain = request(vec![descriptor(&[("remote_address", "a")])]);
    empty_domain.domain.clear();
    let e = c.should_rate_limit(empty_domain).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("domain"), "{e}");
    let e = c.should_rate_limit(request(vec![])).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("no descriptors"), "{e}");
    let e = c
        .should_rate_limit(request(vec![descriptor(&[])]))
        .await
        .unwrap_err();
    assert!(e.message().contains("no entries"), "{e}");
    // An unknown domain has no limits: let through.
    let mut other = request(vec![descriptor(&[("remote_address", "a")])]);
    other.domain = "nowhere".into();
    let r = c.should_rate_limit(other).await.unwrap().into_inner();
    assert_eq!(codes(&r), [OK]);
}

/// What a client controls never turns a limit into an error: a value of
/// any length is counted like any other (the counter key is hashed past
/// the layer's `max_key_len`), and values that look alike once joined
/// keep counters of their own.
#[tokio::test]
async fn long_and_look_alike_descriptor_values_are_counted_apart() {
    let mut c = local_server().await;
    for len in [5_000, 64 * 1024, 1024 * 1024] {
        let long = "x".repeat(len);
        let d = || vec![descriptor(&[("remote_address", &long)])];
        for _ in 0..3 {
            let r = c
                .should_rate_limit(request(d()))
                .await
                .unwrap()
                .into_inner();
            assert_eq!(codes(&r), [OK], "{len} bytes");
        }
        let r = c
            .should_rate_limit(request(d()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(codes(&r), [OVER], "{len} bytes: 3 a minute, as any value");
    }
    // A tenant's plan (any value): 4 a minute for each pair.
    let a = || vec![descriptor(&[("tenant", "x|plan=y"), ("plan", "z")])];
    let b = || vec![descriptor(&[("tenant", "x"), ("plan", "y|plan=z")])];
    for _ in 0..4 {
        let r = c
            .should_rate_limit(request(a()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(codes(&r), [OK]);
    }
    let r = c
        .should_rate_limit(request(a()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(codes(&r), [OVER]);
    let r = c
        .should_rate_limit(request(b()))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(codes(&r), [OK], "another pair, another counter");
}

#[test]
fn configuration_errors_name_the_line_and_column() {
    let e = RlsConfig::from_yaml_str("domain: edge\ndescriptors:\n  - key: a\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n")
        .unwrap_err();
    assert_eq!(e.line(), Some(4), "{e}");
    assert!(e.to_string().contains("fortnight"), "{e}");
    let e = RlsConfig::from_yaml_str("domain: edge\ndescriptors:\n  - key: a\n    bogus: 1\n")
        .unwrap_err();
    assert!(e.to_string().contains("unknown field `bogus`"), "{e}");
    assert_eq!(e.line(), Some(4), "{e}");
    let e = RlsConfig::from_yaml_str("domain: edge\ndescriptors:\n  - key: a\n  - key: b\n    calendar: true\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n")
        .unwrap_err();
    assert_eq!((e.line(), e.column()), (Some(4), Some(5)), "{e}");
    assert!(e.to_string().contains("calendar"), "{e}");
    let e = RlsConfig::from_yaml_str("descriptors: []\n").unwrap_err();
    assert!(e.to_string().contains("domain"), "{e}");
    // A limit the layer refuses names its rule, the descriptor's path.
    let config = RlsConfig::from_yaml_str(
        "domain: edge\ndescriptors:\n  - key: a\n    burst: 0\n    rate_limit: { unit: second, requests_per_unit: 1 }\n",
    )
    .unwrap();
    let e = RateLimitServer::builder(config).build().unwrap_err();
    assert!(e.to_string().contains("edge.a"), "{e}");
}

#[tokio::test]
async fn a_reload_keeps_what_was_spent() {
    let config = RlsConfig::from_yaml_str(CONFIG).unwrap();
    let server = RateLimitServer::builder(config).build().unwrap();
    let mut c = client(serve(server.clone()).await).await;
    let ip = || vec![descriptor(&[("remote_address", "192.0.2.77")])];
    ask(&mut c, ip()).await;
    ask(&mut c, ip()).await;
    server
        .reload(RlsConfig::from_yaml_str(CONFIG).unwrap())
        .unwrap();
    let r = ask(&mut c, ip()).await;
    assert_eq!((codes(&r), r.statuses[0].limit_remaining), (vec![OK], 0));
    assert_eq!(codes(&ask(&mut c, ip()).await), [OVER]);
    let described = server.layer().describe().markdown();
    assert!(described.contains("edge.remote_address"), "{described}");
}

/// A global limit of 20 an hour taken in 200 ms leases.
const LEASED: &str = "domain: edge
descriptors:
  - key: user
    scope: global
    lease: { ttl: 200ms }
    rate_limit: { unit: hour, requests_per_unit: 20 }
";

#[tokio::test]
async fn a_leased_limit_on_two_servers_never_admits_more_than_the_quota() {
    let redis = RedisServer::start();
    let mut clients = Vec::new();
    for _ in 0..2 {
        let server = RateLimitServer::builder(RlsConfig::from_yaml_str(LEASED).unwrap())
            .redis(redis.backend("rls-lease").await)
            .build()
            .unwrap();
        let described = server.layer().describe().markdown();
        assert!(described.contains("lease"), "{described}");
        clients.push(client(serve(server).await).await);
    }
    let mut admitted = 0;
    for round in 0..30 {
        let c = &mut clients[round % 2];
        let r = ask(c, vec![descriptor(&[("user", "bob")])]).await;
        admitted += usize::from(r.overall_code == OK);
    }
    assert!((1..=20).contains(&admitted), "{admitted} of a quota of 20");
    // A lease asks for Redis: refused without a backend, or with scope: local.
    let leased = "domain: edge\ndescriptors:\n  - key: a\n    lease: { ttl: 1s }\n    rate_limit: { unit: hour, requests_per_unit: 5 }\n";
    let e = RateLimitServer::builder(RlsConfig::from_yaml_str(leased).unwrap())
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("needs a Redis backend"), "{e}");
    let local = leased.replace("    lease:", "    scope: local\n    lease:");
    let e = RlsConfig::from_yaml_str(&local).unwrap_err();
    assert!(e.to_string().contains("not `scope: local`"), "{e}");
}

/// Two servers on one Redis with envoyproxy/ratelimit's file as it is (no
/// `scope`: global with a backend, as it counts), and with this crate's
/// extensions: exactly the quota across both, either way.
#[tokio::test]
async fn two_servers_on_one_redis_admit_exactly_the_quota() {
    let redis = RedisServer::start();
    let plain = "domain: edge
descriptors:
  - key: user
    rate_limit: { unit: hour, requests_per_unit: 25 }
";
    let extended = "domain: edge
descriptors:
  - key: user
    scope: global
    algorithm: fixed_window
    rate_limit: { unit: hour, requests_per_unit: 25 }
";
    for (n, config) in [plain, extended].into_iter().enumerate() {
        two_servers(&redis, &format!("rls-{n}"), config).await;
    }
}

async fn two_servers(redis: &RedisServer, prefix: &str, config: &str) {
    let mut clients = Vec::new();
    for _ in 0..2 {
        let server = RateLimitServer::builder(RlsConfig::from_yaml_str(config).unwrap())
            .redis(redis.backend(prefix).await)
            .build()
            .unwrap();
        clients.push(client(serve(server).await).await);
    }
    let mut tasks = Vec::new();
    for (i, c) in clients.into_iter().enumerate() {
        for _ in 0..4 {
            let mut c = c.clone();
            tasks.push(tokio::spawn(async move {
                let mut ok = 0;
                for _ in 0..10 {
                    let r = ask(&mut c, vec![descriptor(&[("user", "alice")])]).await;
                    ok += usize::from(r.overall_code == OK);
                }
                (i, ok)
            }));
        }
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap().1;
    }
    assert_eq!(
        total, 25,
        "{config}: 80 requests over 2 servers and 8 callers"
    );
}

mod client {
    //! The client layer against this crate's server, over real HTTP and gRPC.

    use std::time::Duration;

    use keyed_rate_limit::KeyExtractor;
    use keyed_rate_limit::failure::BreakerConfig;
    use keyed_rate_limit::rls::client::RemoteRateLimitLayer;
    use keyed_rls::{RateLimitServer, RlsConfig};

    use super::CONFIG;
    use crate::support::{client, header, ok_app, serve as serve_http};

    /// The server on a fixed address, on a runtime of its own: dropping the
    /// handle drops the runtime, its listener and every connection, as a
    /// crash would.
    struct Rls(
        Option<std::sync::mpsc::Sender<()>>,
        Option<std::thread::JoinHandle<()>>,
    );

    impl Drop for Rls {
        fn drop(&mut self) {
            drop(self.0.take());
            if let Some(t) = self.1.take() {
                t.join().unwrap();
            }
        }
    }

    fn rls_on(addr: std::net::SocketAddr) -> Rls {
        crate::minute_edge();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let (ready, listening) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.spawn(async move {
                let server = RateLimitServer::builder(RlsConfig::from_yaml_str(CONFIG).unwrap())
                    .build()
                    .unwrap();
                let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
                ready.send(()).unwrap();
                tonic::transport::Server::builder()
                    .add_service(server.into_service())
                    .serve_with_incoming(
                        tonic::transport::server::TcpIncoming::from(listener)
                            .with_nodelay(Some(true)),
                    )
                    .await
                    .unwrap();
            });
            let _ = stopped.recv();
            rt.shutdown_background();
        });
        listening.recv().unwrap();
        Rls(Some(stop), Some(thread))
    }

    fn free_addr() -> std::net::SocketAddr {
        ([127, 0, 0, 1], keyed_rate_limit_testing::free_port()).into()
    }

    fn remote(addr: std::net::SocketAddr, deny: bool) -> RemoteRateLimitLayer {
        remote_with(
            addr,
            deny,
            Duration::from_millis(500),
            Duration::from_secs(30),
        )
    }

    fn remote_with(
        addr: std::net::SocketAddr,
        deny: bool,
        timeout: Duration,
        open_for: Duration,
    ) -> RemoteRateLimitLayer {
        RemoteRateLimitLayer::builder(format!("http://{addr}"), "edge")
            .descriptor([("remote_address", KeyExtractor::header("x-user"))])
            .timeout(timeout)
            .failure_mode_deny(deny)
            .circuit_breaker(
                BreakerConfig::default()
                    .failure_threshold(2)
                    .open_for(open_for),
            )
            .build()
            .unwrap()
    }

    async fn get(url: &str, user: Option<&str>) -> reqwest::Response {
        let mut req = client().get(url);
        if let Some(u) = user {
            req = req.header("x-user", u);
        }
        req.send().await.unwrap()
    }

    #[tokio::test]
    async fn the_services_decisions_and_headers_reach_the_client() {
        let addr = free_addr();
        let _server = rls_on(addr);
        let url = serve_http(ok_app_remote(remote(addr, false))).await;
        for left in [2, 1, 0] {
            let res = get(&url, Some("ivan")).await;
            assert_eq!(res.status(), 200);
            let state = header(&res, "ratelimit").unwrap();
            assert!(state.contains(&format!(";r={left};")), "{state}");
            assert!(
                header(&res, "ratelimit-policy")
                    .unwrap()
                    .contains("edge.remote_address")
            );
        }
        let edge = crate::minute_edge();
        let res = get(&url, Some("ivan")).await;
        assert_eq!(res.status(), 429);
        let retry: u64 = header(&res, "retry-after").unwrap().parse().unwrap();
        assert!((edge - 1..=edge).contains(&retry), "{retry} of {edge}");
        assert!(res.text().await.unwrap().contains(r#""status":429"#));
        // No key, no descriptor: no call, no limit.
        for _ in 0..5 {
            assert_eq!(get(&url, None).await.status(), 200);
        }
    }

    #[tokio::test]
    async fn a_killed_service_is_the_layers_failure_mode() {
        let addr = free_addr();
        let server = rls_on(addr);
        let open = serve_http(ok_app_remote(remote(addr, false))).await;
        let closed = serve_http(ok_app_remote(remote(addr, true))).await;
        assert_eq!(get(&open, Some("judy")).await.status(), 200);
        assert_eq!(get(&closed, Some("judy")).await.status(), 200);
        drop(server);
        for _ in 0..5 {
            assert_eq!(get(&open, Some("judy")).await.status(), 200, "fail open");
        }
        for _ in 0..3 {
            let res = get(&closed, Some("judy")).await;
            assert_eq!(res.status(), 429, "fail closed");
            assert!(header(&res, "retry-after").is_some());
        }
        // The breaker opened after two failures: it waits out its 30 s,
        // so a restarted service is not asked yet.
        let _back = rls_on(addr);
        let res = get(&closed, Some("judy")).await;
        assert_eq!(res.status(), 429, "the breaker is open");
        let retry: u64 = header(&res, "retry-after").unwrap().parse().unwrap();
        assert!(retry > 20, "the breaker's wait, {retry} s");
        // A layer without a broken past asks the restarted service.
        let fresh = serve_http(ok_app_remote(remote(addr, true))).await;
        assert_eq!(get(&fresh, Some("kate")).await.status(), 200);
    }

    /// The client's breaker reports as a global rule's does: the opening
    /// and the closing of an outage, once each, under the domain's name.
    /// Captured process-wide: a callsite first hit by a test on another
    /// thread may keep a thread's own subscriber from seeing it.
    #[tokio::test]
    async fn the_breaker_reports_an_outage_as_a_rules_breaker_does() {
        use crate::support::events::{Events, subscriber};
        let events = Events::default();
        tracing::subscriber::set_global_default(subscriber(events.clone()))
            .expect("the only global subscriber of this test binary");
        let addr = free_addr();
        let open_for = Duration::from_millis(300);
        let layer = RemoteRateLimitLayer::builder(format!("http://{addr}"), "outage")
            .descriptor([("remote_address", KeyExtractor::header("x-user"))])
            .timeout(Duration::from_millis(200))
            .circuit_breaker(
                BreakerConfig::default()
                    .failure_threshold(2)
                    .open_for(open_for),
            )
            .build()
            .unwrap();
        let url = serve_http(ok_app_remote(layer)).await;
        for _ in 0..4 {
            assert_eq!(get(&url, Some("nell")).await.status(), 200, "fail open");
        }
        let _server = rls_on(addr);
        tokio::time::sleep(open_for + Duration::from_millis(100)).await;
        assert_eq!(get(&url, Some("nell")).await.status(), 200);
        let ours: Vec<String> = events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| e.get("rule").is_some_and(|r| r == "outage"))
            .map(|e| e["message"].clone())
            .collect();
        assert_eq!(
            ours,
            [
                "rate-limit service circuit breaker opened",
                "rate-limit service circuit breaker closed; the service answers again"
            ]
        );
    }

    #[tokio::test]
    async fn a_service_that_does_not_answer_is_the_timeouts_failure() {
        // Accepts connections and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let wait = Duration::from_millis(100);
        for (deny, want) in [(false, 200), (true, 429)] {
            let app = ok_app_remote(remote_with(addr, deny, wait, Duration::from_secs(30)));
            let url = serve_http(app).await;
            assert_eq!(get(&url, Some("liam")).await.status(), want, "deny {deny}");
        }
    }

    #[tokio::test]
    async fn a_grpc_request_over_the_limit_is_resource_exhausted() {
        let addr = free_addr();
        let _server = rls_on(addr);
        let url = serve_http(ok_app_remote(remote(addr, false))).await;
        let grpc = || {
            client()
                .get(&url)
                .header("x-user", "mia")
                .header("content-type", "application/grpc")
                .send()
        };
        // CONFIG's remote_address: 3 a minute.
        for _ in 0..3 {
            assert_eq!(grpc().await.unwrap().status(), 200);
        }
        let res = grpc().await.unwrap();
        assert_eq!(res.status(), 200, "a trailers-only gRPC refusal");
        assert_eq!(header(&res, "grpc-status").as_deref(), Some("8"));
        assert!(header(&res, "grpc-retry-pushback-ms").is_some());
    }

    #[tokio::test]
    async fn a_restarted_service_is_asked_again_once_the_breaker_probes() {
        let addr = free_addr();
        let server = rls_on(addr);
        let layer = remote_with(
            addr,
            true,
            Duration::from_millis(500),
            Duration::from_millis(200),
        );
        let url = serve_http(ok_app_remote(layer)).await;
        assert_eq!(get(&url, Some("noah")).await.status(), 200);
        drop(server);
        assert_eq!(get(&url, Some("noah")).await.status(), 429, "fail closed");
        let _back = rls_on(addr);
        // Bounded: the breaker probes 200 ms after it opened.
        let mut statuses = Vec::new();
        for _ in 0..60 {
            let res = get(&url, Some("olga")).await;
            statuses.push(res.status().as_u16());
            if res.status() == 200 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(statuses.last(), Some(&200), "{statuses:?}");
        // The restarted service decides: olga has 3 a minute there.
        let mut after = vec![200];
        for _ in 0..3 {
            after.push(get(&url, Some("olga")).await.status().as_u16());
        }
        assert_eq!(after, [200, 200, 200, 429]);
    }

    fn ok_app_remote(layer: RemoteRateLimitLayer) -> axum::Router {
        axum::Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .layer(layer)
    }

    #[test]
    fn bad_settings_are_build_errors() {
        let b = || RemoteRateLimitLayer::builder("http://127.0.0.1:1", "edge");
        assert!(b().build().is_err(), "no descriptor");
        let d = [("a", KeyExtractor::everyone())];
        assert!(
            b().descriptor(d.clone())
                .timeout(Duration::ZERO)
                .build()
                .is_err()
        );
        assert!(
            RemoteRateLimitLayer::builder("not a url", "edge")
                .descriptor(d.clone())
                .build()
                .is_err()
        );
        assert!(
            RemoteRateLimitLayer::builder("http://127.0.0.1:1", "")
                .descriptor(d.clone())
                .build()
                .is_err()
        );
        let _ = ok_app;
        assert!(b().descriptor(d).build().is_ok());
    }
}
