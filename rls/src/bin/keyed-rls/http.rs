//! envoyproxy/ratelimit's HTTP endpoints: `/healthcheck`, `/json` (a
//! `ShouldRateLimit` in protobuf's JSON mapping) and the metrics on
//! `HOST:PORT`, and `/rlconfig` (the limits as they run) on the debug port.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use keyed_rls::RateLimitServer;
use keyed_rls::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use keyed_rls::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use keyed_rls::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use keyed_rls::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitService;
use keyed_rls::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use metrics_exporter_prometheus::PrometheusHandle;
use serde::Deserialize;

#[derive(Clone)]
struct App {
    server: RateLimitServer,
    healthy: Arc<AtomicBool>,
    metrics: PrometheusHandle,
}

async fn listen(addr: SocketAddr, app: axum::Router) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the HTTP endpoints stopped");
        }
    });
    Ok(())
}

/// `/healthcheck`, `/json` and the metrics at `/metrics` on `addr`; the
/// metrics alone at `prometheus` too (`USE_PROMETHEUS`).
pub(crate) async fn serve(
    addr: SocketAddr,
    prometheus: Option<&(SocketAddr, String)>,
    server: RateLimitServer,
    healthy: Arc<AtomicBool>,
    metrics: PrometheusHandle,
) -> std::io::Result<()> {
    let state = App {
        server,
        healthy,
        metrics,
    };
    let render = |State(a): State<App>| async move { a.metrics.render() };
    let app = axum::Router::new()
        .route("/healthcheck", get(health))
        .route("/json", post(json))
        .route("/metrics", get(render))
        .with_state(state.clone());
    listen(addr, app).await?;
    if let Some((addr, path)) = prometheus {
        let app = axum::Router::new()
            .route(path, get(render))
            .with_state(state);
        listen(*addr, app).await?;
    }
    Ok(())
}

/// `/rlconfig` on `addr`: each limit's rule, as `describe()` prints it.
pub(crate) async fn serve_debug(addr: SocketAddr, server: RateLimitServer) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/rlconfig",
        get(move || async move { server.layer().describe().to_string() }),
    );
    listen(addr, app).await
}

/// `OK` once the rules are loaded, as envoyproxy/ratelimit answers it.
async fn health(State(a): State<App>) -> Response {
    if a.healthy.load(Ordering::Acquire) {
        "OK".into_response()
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "no rules loaded").into_response()
    }
}

/// A request as protobuf's JSON mapping writes it (`hitsAddend`, or the
/// field's own name `hits_addend`).
#[derive(Deserialize)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend")]
    #[serde(rename = "hitsAddend")]
    hits_addend: u32,
}

#[derive(Deserialize)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    limit: Option<JsonLimit>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<JsonU64>,
}

#[derive(Deserialize)]
struct JsonEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
struct JsonLimit {
    #[serde(alias = "requests_per_unit", rename = "requestsPerUnit")]
    requests_per_unit: u32,
    unit: String,
}

/// A 64-bit integer, which protobuf's JSON mapping writes as a string.
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonU64 {
    Number(u64),
    Text(String),
}

impl JsonRequest {
    fn into_pb(self) -> Option<RateLimitRequest> {
        let descriptors = self
            .descriptors
            .into_iter()
            .map(|d| {
                let limit = match d.limit {
                    Some(l) => Some(RateLimitOverride {
                        requests_per_unit: l.requests_per_unit,
                        unit: unit_number(&l.unit)?,
                    }),
                    None => None,
                };
                let hits = match d.hits_addend {
                    Some(JsonU64::Number(n)) => Some(n),
                    Some(JsonU64::Text(t)) => Some(t.parse().ok()?),
                    None => None,
                };
                Some(RateLimitDescriptor {
                    entries: d
                        .entries
                        .into_iter()
                        .map(|e| Entry {
                            key: e.key,
                            value: e.value,
                        })
                        .collect(),
                    limit,
                    hits_addend: hits,
                })
            })
            .collect::<Option<_>>()?;
        Some(RateLimitRequest {
            domain: self.domain,
            descriptors,
            hits_addend: self.hits_addend,
        })
    }
}

const UNITS: [&str; 8] = [
    "UNKNOWN", "SECOND", "MINUTE", "HOUR", "DAY", "MONTH", "YEAR", "WEEK",
];

fn unit_number(name: &str) -> Option<i32> {
    let at = UNITS.iter().position(|u| u.eq_ignore_ascii_case(name))?;
    i32::try_from(at).ok()
}

/// `ShouldRateLimit` over HTTP/1: 200 with the response, 429 when over
/// the limit, 400 for what is not a request or is refused as one.
async fn json(State(a): State<App>, body: axum::body::Bytes) -> Response {
    let Some(req) = serde_json::from_slice::<JsonRequest>(&body)
        .ok()
        .and_then(JsonRequest::into_pb)
    else {
        return (StatusCode::BAD_REQUEST, "not a RateLimitRequest").into_response();
    };
    match a.server.should_rate_limit(tonic::Request::new(req)).await {
        Ok(res) => {
            let res = res.into_inner();
            let status = if res.overall_code == Code::OverLimit as i32 {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, axum::Json(to_json(&res))).into_response()
        }
        Err(s) => (StatusCode::BAD_REQUEST, s.message().to_owned()).into_response(),
    }
}

fn code_name(code: i32) -> &'static str {
    match Code::try_from(code) {
        Ok(Code::Ok) => "OK",
        Ok(Code::OverLimit) => "OVER_LIMIT",
        _ => "UNKNOWN",
    }
}

/// The response in protobuf's JSON mapping, default values left out.
fn to_json(res: &RateLimitResponse) -> serde_json::Value {
    use serde_json::{Map, Value, json};
    let mut out = Map::new();
    out.insert("overallCode".into(), code_name(res.overall_code).into());
    let statuses: Vec<Value> = res
        .statuses
        .iter()
        .map(|s| {
            let mut o = Map::new();
            o.insert("code".into(), code_name(s.code).into());
            if let Some(l) = &s.current_limit {
                let mut limit = Map::new();
                if !l.name.is_empty() {
                    limit.insert("name".into(), l.name.clone().into());
                }
                limit.insert("requestsPerUnit".into(), l.requests_per_unit.into());
                let unit = usize::try_from(l.unit).ok().and_then(|u| UNITS.get(u));
                limit.insert("unit".into(), (*unit.unwrap_or(&"UNKNOWN")).into());
                o.insert("currentLimit".into(), limit.into());
            }
            if s.limit_remaining > 0 {
                o.insert("limitRemaining".into(), s.limit_remaining.into());
            }
            if let Some(d) = &s.duration_until_reset {
                let secs = d.seconds as f64 + f64::from(d.nanos) / 1e9;
                o.insert("durationUntilReset".into(), format!("{secs}s").into());
            }
            Value::Object(o)
        })
        .collect();
    if !statuses.is_empty() {
        out.insert("statuses".into(), statuses.into());
    }
    let headers: Vec<Value> = res
        .response_headers_to_add
        .iter()
        .map(|h| json!({ "key": h.key, "value": h.value }))
        .collect();
    if !headers.is_empty() {
        out.insert("responseHeadersToAdd".into(), headers.into());
    }
    Value::Object(out)
}
