//! The rate-limit layer in front of a real tonic server, called by a real
//! tonic client over TCP.

use std::net::SocketAddr;

use http::StatusCode;
use keyed_rate_limit::OnMissingKey;
use keyed_rate_limit::{KeyExtractor, Quota, RateLimitLayer, Rule};
use tonic::Code;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const QUOTA: u32 = 3;

/// Serves the health service behind `$layer` on an ephemeral port; a macro
/// because the rate and concurrency layers give tonic different body types.
macro_rules! serve {
    ($layer:expr) => {{
        let layer = $layer;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        let (_reporter, health) = tonic_health::server::health_reporter();
        tokio::spawn(async move {
            Server::builder()
                .layer(layer)
                .add_service(health)
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
                .unwrap();
        });
        addr
    }};
}

async fn client(addr: SocketAddr) -> HealthClient<Channel> {
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    HealthClient::new(channel)
}

/// Keyed on the peer IP from tonic's `TcpConnectInfo`; a missing key would be
/// rejected, so a deny after exactly the quota proves the key was found.
fn per_peer_ip() -> RateLimitLayer {
    RateLimitLayer::builder()
        .rule(
            Rule::new(
                "grpc-per-ip",
                KeyExtractor::peer_ip(),
                Quota::per_minute(QUOTA),
            )
            .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED)),
        )
        .build()
        .unwrap()
}

#[tokio::test]
async fn health_checks_are_limited_per_peer_ip_with_resource_exhausted() {
    let addr = serve!(per_peer_ip());
    let mut client = client(addr).await;

    let mut allowed = 0;
    let status = loop {
        match client.check(HealthCheckRequest::default()).await {
            Ok(res) => {
                allowed += 1;
                let policy = res.metadata().get("ratelimit-policy").unwrap();
                assert_eq!(policy, "\"grpc-per-ip\";q=3;w=60");
                let state = res.metadata().get("ratelimit").unwrap().to_str().unwrap();
                assert!(
                    state.starts_with(&format!("\"grpc-per-ip\";r={};", QUOTA - allowed)),
                    "{state}"
                );
                assert_eq!(res.into_inner().status(), ServingStatus::Serving);
            }
            Err(status) => break status,
        }
        assert!(allowed <= QUOTA, "the quota was not enforced");
    };

    assert_eq!(allowed, QUOTA);
    assert_eq!(status.code(), Code::ResourceExhausted);
    // The wait in words, as the HTTP body's `detail` gives it.
    assert!(
        status
            .message()
            .starts_with("rate limit \"grpc-per-ip\" exceeded; retry in "),
        "{}",
        status.message()
    );
    let pushback: u64 = status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .expect("grpc-retry-pushback-ms")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // One call is earned back every 20 s.
    assert!(pushback > 0 && pushback <= 20_000, "{pushback}");
    let retry_after: u64 = status
        .metadata()
        .get("retry-after")
        .expect("retry-after")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(retry_after, pushback.div_ceil(1000));
    assert!(status.message().ends_with(&format!(" {retry_after} s")));

    // The refusal did not break the connection: the next call is refused the same way.
    let again = client
        .check(HealthCheckRequest::default())
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::ResourceExhausted);
}

#[tokio::test]
async fn grpc_message_words_the_refusal_and_a_misconfigured_rule_is_internal() {
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "one",
            KeyExtractor::everyone(),
            Quota::per_hour(1),
        ))
        .grpc_message(|d| format!("come back in {} s", d.retry_after_secs().unwrap_or(0)))
        .build()
        .unwrap();
    let mut first = client(serve!(layer)).await;
    first.check(HealthCheckRequest::default()).await.unwrap();
    let status = first
        .check(HealthCheckRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(status.message(), "come back in 3600 s");

    // Outside an axum router no route is ever matched: INTERNAL, not a
    // limit that never applies.
    let layer = RateLimitLayer::builder()
        .rule(Rule::new(
            "route",
            KeyExtractor::matched_route(),
            Quota::per_hour(1),
        ))
        .build()
        .unwrap();
    let mut second = client(serve!(layer)).await;
    let status = second
        .check(HealthCheckRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Internal);
    assert_eq!(
        status.message(),
        "rate limit \"route\" is misconfigured: the rate limit runs outside the router",
        "the setup in words; the fix is in the server's log"
    );
}

#[tokio::test]
async fn grpc_missing_key_is_rejected_with_the_mapped_code() {
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new(
                "tenant",
                KeyExtractor::header("x-tenant"),
                Quota::per_minute(5),
            )
            .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED)),
        )
        .build()
        .unwrap();
    let addr = serve!(layer);
    let mut client = client(addr).await;

    let status = client
        .check(HealthCheckRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
    // Words for a client that forgot its credentials, not the limiter's terms.
    assert_eq!(
        status.message(),
        "credentials required: rate limit \"tenant\" counts requests by caller, and this request names none"
    );

    let mut req = tonic::Request::new(HealthCheckRequest::default());
    req.metadata_mut()
        .insert("x-tenant", "acme".parse().unwrap());
    let res = client.check(req).await.unwrap();
    assert_eq!(res.into_inner().status(), ServingStatus::Serving);
}

#[tokio::test]
async fn a_streaming_watch_holds_its_concurrency_slot_until_dropped() {
    use keyed_rate_limit::ConcurrencyLimitLayer;
    let layer = ConcurrencyLimitLayer::builder("grpc-streams", KeyExtractor::peer_ip(), 1)
        .build()
        .unwrap();
    let addr = serve!(layer);
    let mut client = client(addr).await;

    // `watch` answers with a stream that stays open: the slot stays taken.
    let mut stream = client
        .watch(HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);

    let refused = client
        .check(HealthCheckRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    let pushback: u64 = refused
        .metadata()
        .get("grpc-retry-pushback-ms")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(pushback > 0);

    // Dropping the stream ends the body and frees the slot.
    drop(stream);
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match client.check(HealthCheckRequest::default()).await {
            Ok(res) => {
                assert_eq!(res.into_inner().status(), ServingStatus::Serving);
                break;
            }
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted);
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the slot was never freed"
                );
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    }
}

/// `OnDeny::Wait` holds a gRPC call for its unit instead of refusing it.
#[tokio::test]
async fn grpc_calls_over_the_quota_wait_for_their_unit() {
    use keyed_rate_limit::rule::OnDeny;
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new(
                "grpc-wait",
                KeyExtractor::peer_ip(),
                Quota::new(5, std::time::Duration::from_secs(1)).with_burst(1),
            )
            .on_deny(OnDeny::Wait {
                max: std::time::Duration::from_secs(5),
                queue: 10,
            }),
        )
        .build()
        .unwrap();
    let addr = serve!(layer);
    let client = client(addr).await;
    let calls: Vec<_> = (0..3)
        .map(|_| {
            let mut c = client.clone();
            tokio::spawn(async move { c.check(HealthCheckRequest::default()).await })
        })
        .collect();
    for call in calls {
        let res = call.await.unwrap().expect("waited, not refused");
        assert_eq!(res.into_inner().status(), ServingStatus::Serving);
    }
}

/// `count_if` on gRPC: an error before any message is a trailers-only
/// response, so its `grpc-status` is in the head the closure sees. Only
/// failed checks (unknown services) count.
#[tokio::test]
async fn count_if_sees_a_trailers_only_grpc_status() {
    let layer = RateLimitLayer::builder()
        .rule(
            Rule::new(
                "failed-checks",
                KeyExtractor::everyone(),
                Quota::per_hour(2),
            )
            .count_if(|res| res.headers.get("grpc-status").is_some_and(|s| s != "0")),
        )
        .build()
        .unwrap();
    let addr = serve!(layer);
    let mut client = client(addr).await;
    let check = |service: &str| HealthCheckRequest {
        service: service.to_owned(),
    };
    for _ in 0..5 {
        let ok = client.check(check("")).await.unwrap();
        assert_eq!(ok.into_inner().status(), ServingStatus::Serving);
    }
    for _ in 0..2 {
        let err = client.check(check("nope")).await.unwrap_err();
        assert_eq!(err.code(), Code::NotFound, "counted, not refused");
    }
    let err = client.check(check("")).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "two failures spent it");
}

/// A gRPC answer is paced by its bytes (five 7-byte `Check` answers at
/// 28 B/s after a 14-byte burst: 0.75 s), its trailers pass, and a server
/// stream's messages come through.
#[tokio::test]
async fn grpc_answers_are_shaped_by_their_bytes_and_keep_their_trailers() {
    use keyed_rate_limit::BandwidthLimitLayer;
    let layer = BandwidthLimitLayer::builder("grpc-bytes", KeyExtractor::peer_ip(), 28)
        .burst(14)
        .build()
        .unwrap();
    let addr = serve!(layer);
    let mut client = client(addr).await;
    let start = std::time::Instant::now();
    for _ in 0..5 {
        let res = client.check(HealthCheckRequest::default()).await.unwrap();
        let policy = res.metadata().get("ratelimit-policy").unwrap();
        assert_eq!(policy, "\"grpc-bytes\";q=28;w=1;qu=\"content-bytes\"");
        // A status read from the trailers: they were not held back or lost.
        assert_eq!(res.into_inner().status(), ServingStatus::Serving);
    }
    let took = start.elapsed();
    assert!(
        took >= std::time::Duration::from_millis(600) && took < std::time::Duration::from_secs(3),
        "five answers took {took:?}"
    );
    let mut stream = client
        .watch(HealthCheckRequest::default())
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);
}

#[allow(dead_code)] // the example's `main`
#[path = "../../examples/grpc.rs"]
mod example;

/// `examples/grpc.rs`, served for real and called by its own client.
mod example_app {
    use std::time::Duration;

    use tonic::Code;
    use tonic::transport::Channel;
    use tonic_health::pb::health_client::HealthClient;

    use super::example::{self, Pushback};

    #[tokio::test]
    async fn the_example_client_waits_out_the_pushback_and_is_served() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(example::serve(listener));
        let channel = Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let client = HealthClient::new(channel);
        let once = Pushback {
            attempts: 1,
            max_wait: Duration::from_secs(2),
        };
        let patient = Pushback {
            attempts: 3,
            ..once
        };

        // The burst of 2, then a refusal that names the wait.
        for _ in 0..2 {
            let (answer, attempts) = example::check(&client, Some("acme"), once).await;
            assert!(answer.is_ok(), "{answer:?}");
            assert_eq!(attempts, 1);
        }
        let (refused, _) = example::check(&client, Some("acme"), once).await;
        let refused = refused.unwrap_err();
        assert_eq!(refused.code(), Code::ResourceExhausted);
        let wait = example::pushback(&refused).expect("grpc-retry-pushback-ms");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(500),
            "{wait:?}"
        );
        assert!(
            refused.message().contains("retry in 1 s"),
            "{}",
            refused.message()
        );

        // Refused at first, the client waits the pushback, and the retry
        // passes: a client that did not wait would be refused again.
        let (answer, attempts) = example::check(&client, Some("acme"), patient).await;
        assert!(answer.is_ok(), "{answer:?}");
        assert_eq!(attempts, 2, "one refusal, one wait, one retry");

        // Another tenant has its own budget.
        let (answer, attempts) = example::check(&client, Some("globex"), once).await;
        assert!(answer.is_ok() && attempts == 1, "{answer:?}");

        // No tenant: UNAUTHENTICATED in words for a client, never retried.
        let (anonymous, attempts) = example::check(&client, None, patient).await;
        let anonymous = anonymous.unwrap_err();
        assert_eq!(anonymous.code(), Code::Unauthenticated);
        assert_eq!(attempts, 1);
        assert!(
            anonymous.message().starts_with("credentials required"),
            "{}",
            anonymous.message()
        );
    }
}
