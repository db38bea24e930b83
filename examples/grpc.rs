//! A tonic service limited per tenant (the `x-tenant` metadata), and a
//! tonic client that waits out `grpc-retry-pushback-ms` before it retries.
//!
//! ```sh
//! cargo run --example grpc --features tonic
//! ```
//!
//! It serves the standard health service on `127.0.0.1:50051` (override
//! with `PORT`) behind the limit, then calls it as two clients: one that
//! names its tenant, whose calls over the quota are retried after the
//! server's pushback, and one that names none (`UNAUTHENTICATED`).
//!
//! tonic's client does not retry on its own: `grpc-retry-pushback-ms`
//! (gRFC A6) is honoured only by a retry policy that reads it, as
//! [`Pushback`] does.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use http::StatusCode;
use keyed_rate_limit::BuildError;
use keyed_rate_limit::KeyExtractor;
use keyed_rate_limit::OnMissingKey;
use keyed_rate_limit::{Quota, RateLimitLayer, Rule};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Code, Status};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// Each tenant's calls: 2 at once, then one every 500 ms (GCRA).
pub const PER_TENANT: Quota = Quota::per_second(2);

/// The limit: per `x-tenant` metadata entry (gRPC metadata travels as
/// HTTP/2 headers, so `KeyExtractor::header` reads it); a call without one
/// is refused with `UNAUTHENTICATED`.
pub fn limit() -> Result<RateLimitLayer, BuildError> {
    RateLimitLayer::builder()
        .rule(
            Rule::new("per-tenant", KeyExtractor::header("x-tenant"), PER_TENANT)
                .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED)),
        )
        .build()
}

/// Serves the health service behind [`limit`] on `listener`.
pub async fn serve(
    listener: tokio::net::TcpListener,
) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (_reporter, health) = tonic_health::server::health_reporter();
    Server::builder()
        .layer(limit()?)
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener))
        .await?;
    Ok(())
}

/// A retry policy for rate-limited calls: a call refused with
/// `RESOURCE_EXHAUSTED` and a `grpc-retry-pushback-ms` is tried again after
/// that wait, at most `attempts` times in all, and only while the wait is
/// at most `max_wait`. Any other status, or a refusal without a pushback
/// (the call can never pass), is returned at once.
#[derive(Clone, Copy, Debug)]
pub struct Pushback {
    /// Calls in all, the first included.
    pub attempts: u32,
    /// The longest pushback worth waiting for.
    pub max_wait: Duration,
}

impl Pushback {
    /// Runs `call` until it passes or the policy gives up; also returns how
    /// many attempts it took.
    pub async fn call<T, F, Fut>(&self, mut call: F) -> (Result<T, Status>, u32)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let mut attempt = 1;
        loop {
            let status = match call().await {
                Ok(answer) => return (Ok(answer), attempt),
                Err(status) => status,
            };
            match pushback(&status) {
                Some(wait) if attempt < self.attempts && wait <= self.max_wait => {
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
                _ => return (Err(status), attempt),
            }
        }
    }
}

/// The wait a `RESOURCE_EXHAUSTED` asks for, if any.
pub fn pushback(status: &Status) -> Option<Duration> {
    if status.code() != Code::ResourceExhausted {
        return None;
    }
    let ms = status
        .metadata()
        .get("grpc-retry-pushback-ms")?
        .to_str()
        .ok()?
        .parse()
        .ok()?;
    Some(Duration::from_millis(ms))
}

/// A health check as `tenant` (none: anonymous), retried under `policy`.
pub async fn check(
    client: &HealthClient<Channel>,
    tenant: Option<&str>,
    policy: Pushback,
) -> (Result<(), Status>, u32) {
    policy
        .call(|| {
            let mut client = client.clone();
            let mut req = tonic::Request::new(HealthCheckRequest::default());
            if let Some(t) = tenant.and_then(|t| t.parse().ok()) {
                req.metadata_mut().insert("x-tenant", t);
            }
            async move { client.check(req).await.map(drop) }
        })
        .await
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The crate's diagnostics are `tracing` events: INFO and up unless
    // RUST_LOG says otherwise (`fmt::init()` would show only errors once
    // tracing-subscriber's `env-filter` feature is on anywhere in the build).
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let port: u16 = std::env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(50051);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    let addr: SocketAddr = listener.local_addr()?;
    println!("serving grpc.health.v1.Health on {addr}");
    tokio::spawn(async move {
        if let Err(e) = serve(listener).await {
            eprintln!("server: {e}");
        }
    });
    let channel = Channel::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let client = HealthClient::new(channel);
    let policy = Pushback {
        attempts: 3,
        max_wait: Duration::from_secs(2),
    };
    for i in 1..=5 {
        let (answer, attempts) = check(&client, Some("acme"), policy).await;
        match answer {
            Ok(()) => println!("acme call {i}: served after {attempts} attempt(s)"),
            Err(s) => println!("acme call {i}: {:?} {}", s.code(), s.message()),
        }
    }
    let (answer, _) = check(&client, None, policy).await;
    if let Err(s) = answer {
        println!("anonymous call: {:?} {}", s.code(), s.message());
    }
    Ok(())
}
