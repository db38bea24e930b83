//! A keyed rate-limiting [tower] `Layer` for [axum] routers and [tonic]
//! services: local limits on [governor], and global limits shared by a fleet
//! of gateways on Redis (feature `redis`).
//!
//! For each request the layer extracts a **key** (an API key, the
//! authenticated user, the client IP, the matched route, or any closure),
//! evaluates an ordered list of **rules** (quota, cost, algorithm, scope) and
//! either refuses the request with `429 Too Many Requests` and `Retry-After`
//! (gRPC: `RESOURCE_EXHAUSTED` and `grpc-retry-pushback-ms`) or calls the
//! inner service and adds the `RateLimit-Policy` / `RateLimit` headers.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//!
//! use axum::{Router, http::StatusCode, routing::get};
//! use keyed_rate_limit::{BuildError, KeyExtractor, OnMissingKey, Quota, RateLimitLayer, Rule};
//!
//! fn app() -> Result<Router, BuildError> {
//!     let limit = RateLimitLayer::builder()
//!         // Evaluated in order; the first rule that refuses answers the request.
//!         .rule(
//!             Rule::new("per-key", KeyExtractor::header("x-api-key"), Quota::per_minute(100).with_burst(20))
//!                 .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED)),
//!         )
//!         .rule(Rule::new("per-route", KeyExtractor::matched_route(), Quota::new(10_000, Duration::from_secs(60))))
//!         .build()?; // every static quota, cost and name is checked here
//!     Ok(Router::new().route("/", get(|| async { "hi" })).layer(limit))
//! }
//! ```
//!
//! The repository's [`examples/quickstart.rs`](https://github.com/keyed-rate-limit/keyed-rate-limit/blob/main/examples/quickstart.rs)
//! (`cargo run --example quickstart` in a clone) serves a limited `GET /`
//! on `127.0.0.1:3000` and prints its rules. Every diagnostic of the crate
//! (a key it cannot find, Redis failing, a rejected reload) is a `tracing`
//! event: install a subscriber to see them, one that shows WARN and INFO
//! whatever `RUST_LOG` holds, as the examples do
//! (`tracing_subscriber::fmt().with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into())).init()`;
//! a bare `fmt::init()` shows only errors when `RUST_LOG` is unset and
//! tracing-subscriber's `env-filter` feature is on anywhere in the build).
//!
//! # How a request is decided
//!
//! 1. **Key.** Each rule's [`KeyExtractor`] reads the request head. When it
//!    finds no key, the rule's [`OnMissingKey`] skips the rule, rejects the
//!    request (e.g. 401), or counts it against a fallback key. A rule with
//!    no `OnMissingKey` skips a request without the key, **except** when
//!    what the key is read from is missing: no `ConnectInfo`, the layer
//!    outside the router, or for [`KeyExtractor::extension`] no such
//!    extension (the layer runs before its auth layer, or the request is
//!    anonymous). Then it answers 500 and logs the fix instead of limiting
//!    nothing. Auth that lets anonymous requests through keys with
//!    [`KeyExtractor::optional_extension`].
//! 2. **Rules.** The rules run in the order they were added. Each spends the
//!    request's cost from the key's bucket under its [`Quota`], in this
//!    process or, for a global rule, in Redis. The first rule that refuses
//!    ends the evaluation, and the units the rules before it spent are
//!    given back ([refunds](crate::rate_limit::RateLimitBuilder::refunds)).
//! 3. **Answer.** A refusal is a 429 with `Retry-After` and an RFC 9457
//!    problem body (gRPC: a trailers-only `RESOURCE_EXHAUSTED`); the inner
//!    service is not called. An allowed request goes on (with its
//!    [`RateLimitDecision`](decision::RateLimitDecision) in the request
//!    extensions, if the handler asks for it with
//!    [`decision_extension`](rate_limit::RateLimitBuilder::decision_extension)),
//!    and its response gets the rate-limit headers of the rules that applied, except shadow and
//!    hidden ones ([`headers`]).
//!
//! A rule in shadow mode only records what it would have refused; a rule
//! with [`OnDeny::Wait`](rule::OnDeny::Wait) holds a request until its unit is back instead of
//! refusing it. [`ConcurrencyLimitLayer`] is the companion limit on requests
//! *in flight* per key, and [`BandwidthLimitLayer`] paces body bytes per key.
//!
//! # Features
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `metrics` | yes | counters, gauges and a histogram through the [`metrics`](https://docs.rs/metrics) facade ([`observe`]); `tracing` events are always on |
//! | `redis` | | global rate rules, concurrency and bandwidth limits on Redis (`backend::redis`, `Rule::global`, `ConcurrencyLimitBuilder::global`, `BandwidthLimitBuilder::global`), on redis-rs and bb8 |
//! | `redis-cluster` | | `RedisBackend::cluster_builder`: Redis Cluster (implies `redis`) |
//! | `redis-sentinel` | | `RedisBackend::sentinel_builder`: a master watched by Redis Sentinel, followed through failovers (implies `redis`) |
//! | `redis-tls` | | `rediss://` URLs with rustls (ring), `tls_root_cert`, `tls_client_cert` (implies `redis`) |
//! | `tonic` | | the layers on a tonic `Server` (refusals in tonic's body type), and `peer_ip()` from tonic's `TcpConnectInfo` |
//! | `config` | | rules from TOML or YAML files (`config::RulesConfig`), reloaded on change with `notify` (`RulesConfig::watch`) |
//! | `rls` | | a layer that asks a remote rate-limit service, Envoy's RLS v3 (`rls::client`); implies `tonic` |
//!
//! Only `metrics` is on by default. A tonic `Server` needs the `tonic`
//! feature: its responses have tonic's body type, in which the layer writes
//! its refusals (without it the compiler says so, naming the feature). gRPC
//! served by an axum `Router` needs none: a refusal is only headers.
//!
//! # Where to start
//!
//! | to | read |
//! |---|---|
//! | write rules: quotas, costs, any-of groups, algorithms, shadow mode, waiting, lockouts, the control handle, counting by the response, refunds, reload | [`rate_limit`] |
//! | limit a tonic service, and write a client that waits out `grpc-retry-pushback-ms` | [`rate_limit`'s gRPC guide](rate_limit#grpc) |
//! | choose a key: headers, IPs behind proxies, extensions set by auth, composing the limiter with auth | [`key`] |
//! | read the headers and the 429 a client gets, or replace its body | [`headers`] |
//! | watch the limiter: `tracing` events, metrics, the decision extension | [`observe`] |
//! | share limits across gateways on Redis, Redis Cluster, Redis Sentinel, TLS, coalescing and leases | [`backend::redis`][redis] (feature `redis`) |
//! | decide what a global rule does while Redis fails | [`failure`] |
//! | limit requests in flight per key | [`concurrency`] |
//! | shape body bytes per key: downloads, uploads, streams | [`bandwidth`] |
//! | load rules from a TOML or YAML file, and reload them on change | [`config`][config] (feature `config`) |
//! | serve the same rules to Envoy or any gateway as Envoy's rate-limit service (RLS v3) | the `keyed-rls` crate (library and binary), over this crate's [`KeyedRules`](rate_limit::KeyedRules) |
//! | render the rules as a Markdown table or a Mermaid flowchart | [`describe`] |
//! | keep local counters across a restart | [`snapshot`] |
//!
//! The types a first program names are re-exported here, and come first:
//! a [`RateLimitLayer`] of [`Rule`]s, each a [`KeyExtractor`] (what it
//! yields is a [`Key`]; [`OnMissingKey`] says what to do without one), a
//! [`Quota`] and an [`Algorithm`], checked at build time into a
//! [`BuildError`]; then [`ConcurrencyLimitLayer`] and
//! [`BandwidthLimitLayer`], and with their features `RedisBackend` for
//! global rules and `RulesConfig` with its `Registry` for rule files.
//! Everything else lives in its module, named by the table above.
//!
#![cfg_attr(feature = "redis", doc = include_str!("../docs/front_redis.md"))]
#![cfg_attr(
    not(feature = "redis"),
    doc = "# A global rule\n\nWith the `redis` feature, `Rule::global` moves a rule's counters to Redis, so every gateway shares them; see the `backend::redis` module."
)]
//!
//! [tower]: https://docs.rs/tower
//! [axum]: https://docs.rs/axum
//! [tonic]: https://docs.rs/tonic
//! [governor]: https://docs.rs/governor
#![cfg_attr(feature = "redis", doc = "[redis]: crate::backend::redis")]
#![cfg_attr(
    not(feature = "redis"),
    doc = "[redis]: https://docs.rs/keyed-rate-limit/latest/keyed_rate_limit/backend/redis/index.html"
)]
#![cfg_attr(feature = "config", doc = "[config]: crate::config")]
#![cfg_attr(
    not(feature = "config"),
    doc = "[config]: https://docs.rs/keyed-rate-limit/latest/keyed_rate_limit/config/index.html"
)]
// On docs.rs, doc_cfg badges each feature-gated item by its own cfg (it took
// in doc_auto_cfg), so no item carries a hand-written doc(cfg).
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(unreachable_pub)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

#[macro_use]
mod macros;

// The modules by layer, as a request meets them (docs/adr/0015): each
// imports only from its own layer or those below it.
// entry
#[cfg(feature = "config")]
pub mod config;
#[cfg(feature = "rls")]
pub mod rls;
// middleware
pub mod bandwidth;
pub mod concurrency;
pub mod rate_limit;
// rules
pub mod describe;
mod engine;
pub mod rule;
// answer
mod gate;
pub mod headers;
pub mod response;
mod settings;
// state
#[cfg(feature = "redis")]
pub mod backend;
pub mod failure;
mod store;
// key
pub mod decision;
pub mod key;
pub mod observe;
pub mod snapshot;
// values
pub mod algorithm;
pub mod error;
mod policy;
pub mod quota;
mod util;

pub use algorithm::Algorithm;
#[cfg(feature = "redis")]
pub use backend::redis::RedisBackend;
pub use bandwidth::BandwidthLimitLayer;
pub use concurrency::ConcurrencyLimitLayer;
#[cfg(feature = "config")]
pub use config::{Registry, RulesConfig};
pub use error::BuildError;
pub use key::{Key, KeyExtractor, OnMissingKey};
pub use quota::Quota;
pub use rate_limit::RateLimitLayer;
pub use rule::Rule;

/// The README's code blocks, compiled as doctests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
