//! HTTP load test: the same axum hello-world app served seven ways, side by side.
//!
//! ```sh
//! cargo run -p keyed-rate-limit-bench --bin loadtest --release --features redis
//! ```
//!
//! 1. `bare`: no rate limiting;
//! 2. `layer-local`: this layer with its defaults, one local rule keyed by
//!    `x-api-key` that never denies;
//! 3. `local-ext`: the same with the decision in the request extensions
//!    ([`decision_extension(true)`](keyed_rate_limit::rate_limit::RateLimitBuilder::decision_extension)),
//!    which `tower_governor` has no counterpart of;
//! 4. `tower_governor`: `tower_governor` 0.8 with the same key, the same quota
//!    and its rate-limit headers (`use_headers`), so both answer with headers;
//! 5. `layer-redis`: this layer, the same rule made global on a private
//!    `redis-server` this program starts on a free port (never 6379);
//! 6. `layer-outer` and `tg-outer`: `layer-local` and `tower_governor`
//!    wrapped around the whole router instead of added with `Router::layer`;
//! 7. `layer-leased`: `layer-redis` with
//!    [`Rule::lease`](keyed_rate_limit::Rule::lease) (100 ms leases);
//! 8. `layer-coalesced`: `layer-redis` with
//!    [`Rule::coalesce`](keyed_rate_limit::Rule::coalesce) (the default;
//!    `layer-redis` turns it off);
//! 9. `fleet-exact`, `fleet-coalesced`, `fleet-leased`: four gateways (four
//!    servers, each with its own backend on the same private Redis), loaded
//!    by four generators at once with a quarter of the connections each;
//!    req/s is their sum, p50/p99 the worst of the four;
//! 10. `layer-deny`, `tg-deny`: a deny flood, one over-limit key answered
//!     429 by this layer (one local rule) and by `tower_governor` (with its
//!     headers), paired as `layer-deny / tg-deny 429s/s`.
//!
//! The load generator is `wrk` when it is on `PATH`, otherwise a built-in
//! keep-alive client (reqwest). Variants run interleaved for several rounds
//! and the medians are printed, with ratios to `bare`: the machine is shared,
//! so read the ratios, not the absolute numbers.
//!
//! Environment: `LOADTEST_SECS` (default 4) per run, `LOADTEST_CONNS` (32),
//! `LOADTEST_THREADS` (2, wrk only), `LOADTEST_ROUNDS` (2),
//! `LOADTEST_GEN=rust` to force the built-in generator, `LOADTEST_WRK_CPUS=1`
//! to pin wrk to CPU 1 (run the harness itself under `taskset -c 0`),
//! `LOADTEST_VARIANTS=bare,layer-local,...` to run some (bare always runs),
//! `LOADTEST_KEYS=10000` to spread wrk's requests over that many keys
//! (wrk only; the default is one hot key).

use keyed_rate_limit_testing as redis_server;

use keyed_rate_limit_bench::app as support;
use keyed_rate_limit_testing::rounds;
use rounds::median;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use axum::Router;
use keyed_rate_limit::RedisBackend;
use keyed_rate_limit::rule::LeasePolicy;
use keyed_rate_limit::{RateLimitLayer, headers::HeaderStyle};
use support::{KEY, KEY_HEADER, app};

async fn serve(router: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    addr
}

/// A limiter around the whole router rather than on its routes.
async fn serve_outer(outer: support::Outer) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(support::serve_outer(listener, app(), outer));
    addr
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
}

fn wrk_on_path() -> bool {
    std::process::Command::new("wrk")
        .arg("--version")
        .output()
        .is_ok()
}

/// `123.45us`, `1.20ms`, `2.00s` -> microseconds.
fn parse_duration_us(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mul) = if let Some(n) = s.strip_suffix("us") {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e3)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60e6)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1e6)
    } else {
        return None;
    };
    num.parse::<f64>().ok().map(|v| v * mul)
}

async fn run_wrk(addr: SocketAddr, secs: u64, conns: u64, threads: u64, deny: bool) -> Sample {
    // LOADTEST_WRK_CPUS=1 (with the harness itself under `taskset -c 0`)
    // keeps wrk off the server's core, so the server is the bottleneck and
    // the ratios measure its CPU per request rather than scheduler luck.
    let mut cmd = match std::env::var("LOADTEST_WRK_CPUS") {
        Ok(cpus) => {
            let mut c = tokio::process::Command::new("taskset");
            c.args(["-c", &cpus, "wrk"]);
            c
        }
        Err(_) => tokio::process::Command::new("wrk"),
    };
    cmd.arg(format!("-t{}", threads.min(conns).max(1)))
        .arg(format!("-c{conns}"))
        .arg(format!("-d{secs}s"))
        .arg("--latency");
    // LOADTEST_KEYS=n: each request a random one of n keys (a wrk script).
    match std::env::var("LOADTEST_KEYS")
        .ok()
        .and_then(|n| n.parse::<u32>().ok())
    {
        Some(n) => {
            let script = std::env::temp_dir().join(format!("krl-loadtest-keys-{n}.lua"));
            std::fs::write(
                &script,
                format!(
                    "request = function()\n  return wrk.format(nil, nil, {{[\"{KEY_HEADER}\"] = \"k\" .. math.random({n})}})\nend\n"
                ),
            )
            .expect("write the wrk script");
            cmd.arg("-s").arg(script)
        }
        None => cmd.args(["-H", &format!("{KEY_HEADER}: {KEY}")]),
    };
    let out = cmd
        .arg(format!("http://{addr}/"))
        .output()
        .await
        .expect("run wrk");
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |prefix: &str| {
        text.lines()
            .map(str::trim)
            .find_map(|l| l.strip_prefix(prefix).map(|r| r.trim().to_owned()))
    };
    // A deny flood's answers are all 429s; the others', all 200s.
    assert_eq!(
        text.contains("Non-2xx"),
        deny,
        "every answer must be {}:\n{text}",
        if deny { 429 } else { 200 }
    );
    Sample {
        rps: field("Requests/sec:")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0),
        p50_us: field("50%")
            .and_then(|v| parse_duration_us(&v))
            .unwrap_or(0.0),
        p99_us: field("99%")
            .and_then(|v| parse_duration_us(&v))
            .unwrap_or(0.0),
    }
}

/// One generator per address at once, `conns` split among them: req/s
/// summed, latencies the worst.
async fn run_all(
    addrs: &[SocketAddr],
    wrk: bool,
    secs: u64,
    conns: u64,
    threads: u64,
    deny: bool,
) -> Sample {
    let n = addrs.len() as u64;
    let (conns, threads) = ((conns / n).max(1), (threads / n).max(1));
    let runs = addrs.iter().map(|&addr| async move {
        if wrk {
            run_wrk(addr, secs, conns, threads, deny).await
        } else {
            run_rust(addr, secs, conns, deny).await
        }
    });
    let samples = futures_util::future::join_all(runs).await;
    Sample {
        rps: samples.iter().map(|s| s.rps).sum(),
        p50_us: samples.iter().map(|s| s.p50_us).fold(0.0, f64::max),
        p99_us: samples.iter().map(|s| s.p99_us).fold(0.0, f64::max),
    }
}

/// Keep-alive load from `conns` tasks, each with its own connection.
async fn run_rust(addr: SocketAddr, secs: u64, conns: u64, deny: bool) -> Sample {
    let url = format!("http://{addr}/");
    let start = Instant::now();
    let deadline = start + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let client = support::connection();
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let res = support::hello(&client, &url).send().await;
                    let res = res.expect("request");
                    assert_eq!(res.status().as_u16(), if deny { 429 } else { 200 });
                    res.bytes().await.expect("body");
                    lat.push(t.elapsed().as_secs_f64() * 1e6);
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    let pct = |p: f64| all[((all.len() as f64 - 1.0) * p) as usize];
    Sample {
        rps: all.len() as f64 / elapsed,
        p50_us: pct(0.50),
        p99_us: pct(0.99),
    }
}

#[tokio::main]
async fn main() {
    let secs = support::env_u64("LOADTEST_SECS", 4);
    let conns = support::env_u64("LOADTEST_CONNS", 32);
    let threads = support::env_u64("LOADTEST_THREADS", 2);
    let rounds = support::env_u64("LOADTEST_ROUNDS", 2).max(1);
    let use_wrk = std::env::var("LOADTEST_GEN").as_deref() != Ok("rust") && wrk_on_path();

    let redis = redis_server::RedisServer::start();
    let backend = RedisBackend::builder(redis.url())
        .prefix("loadtest")
        .build()
        .await
        .expect("connect to the private redis");
    let global_layer = |rule: keyed_rate_limit::Rule| {
        RateLimitLayer::builder()
            .rule(
                rule.global(backend.clone())
                    // Generous: a timeout would answer from the local fallback
                    // and flatter the Redis numbers.
                    .redis_timeout(Duration::from_secs(1)),
            )
            .build()
            .unwrap()
    };
    let global = global_layer(support::local_rule("global").coalesce(false));
    let leased = global_layer(
        support::local_rule("leased").lease(LeasePolicy::new(Duration::from_millis(100))),
    );
    let coalesced = global_layer(support::local_rule("coalesced").coalesce(true));

    // Four gateways, each with its own connection to the same Redis.
    let mut fleets: Vec<Vec<SocketAddr>> = Vec::new();
    for (i, name) in ["fleet-exact", "fleet-coalesced", "fleet-leased"]
        .iter()
        .enumerate()
    {
        let mut addrs = Vec::new();
        for _ in 0..4 {
            let redis = RedisBackend::builder(redis.url())
                .prefix(format!("loadtest-fleet{i}"))
                .build()
                .await
                .expect("connect to the private redis");
            let rule = support::local_rule(name)
                .global(redis)
                .redis_timeout(Duration::from_secs(1));
            let rule = match i {
                0 => rule.coalesce(false),
                1 => rule,
                _ => rule.lease(LeasePolicy::new(Duration::from_millis(100))),
            };
            let layer = RateLimitLayer::builder().rule(rule).build().unwrap();
            addrs.push(serve(app().layer(layer)).await);
        }
        fleets.push(addrs);
    }
    let one = |a: SocketAddr| vec![a];
    let variants: Vec<(&str, Vec<SocketAddr>)> = vec![
        ("bare", one(serve(app()).await)),
        (
            "layer-local",
            one(serve(support::layer_local(false, HeaderStyle::Draft)).await),
        ),
        (
            "local-ext",
            one(serve(support::layer_local(true, HeaderStyle::Draft)).await),
        ),
        (
            "tower_governor",
            one(serve(support::tower_governor()).await),
        ),
        ("layer-redis", one(serve(app().layer(global.clone())).await)),
        ("layer-outer", one(serve_outer(support::Outer::Layer).await)),
        (
            "tg-outer",
            one(serve_outer(support::Outer::TowerGovernor).await),
        ),
        (
            "layer-leased",
            one(serve(app().layer(leased.clone())).await),
        ),
        ("layer-coalesced", one(serve(app().layer(coalesced)).await)),
        ("fleet-exact", fleets[0].clone()),
        ("fleet-coalesced", fleets[1].clone()),
        ("fleet-leased", fleets[2].clone()),
        // One over-limit key: every request after the first is a 429.
        ("layer-deny", one(serve(support::layer_deny()).await)),
        ("tg-deny", one(serve(support::tower_governor_deny()).await)),
    ];
    let only = std::env::var("LOADTEST_VARIANTS").ok();
    let runs = |name: &str| {
        name == "bare"
            || only
                .as_deref()
                .is_none_or(|o| o.split(',').any(|v| v.trim() == name))
    };

    // One request each: 200, and the rate-limit headers each sends.
    let client = reqwest::Client::new();
    for (name, addrs) in &variants {
        let addr = addrs[0];
        let res = client
            .get(format!("http://{addr}/"))
            .header(KEY_HEADER, KEY)
            .send()
            .await
            .unwrap();
        let headers: Vec<_> = res
            .headers()
            .keys()
            .map(|k| k.as_str())
            .filter(|k| k.contains("ratelimit"))
            .map(str::to_owned)
            .collect();
        assert!(res.status().is_success(), "{name}: {}", res.status());
        println!("{name:>15} on {addr}: 200, headers {headers:?}");
    }

    println!(
        "\ngenerator: {}, {conns} connections, {secs} s per run, {rounds} interleaved rounds",
        if use_wrk {
            format!("wrk -t{}", threads.min(conns).max(1))
        } else {
            "built-in (reqwest keep-alive)".to_owned()
        }
    );
    let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); variants.len()];
    for round in 0..rounds {
        for i in rounds::order(round as usize, variants.len()) {
            let (name, addrs) = &variants[i];
            if !runs(name) {
                continue;
            }
            let deny = name.ends_with("-deny");
            let s = run_all(addrs, use_wrk, secs, conns, threads, deny).await;
            println!(
                "round {round} {name:>15}: {:>9.0} req/s  p50 {:>7.0} us  p99 {:>7.0} us",
                s.rps, s.p50_us, s.p99_us
            );
            samples[i].push(s);
        }
    }

    let med: Vec<Sample> = samples
        .iter()
        .map(|v| {
            if v.is_empty() {
                vec![Sample {
                    rps: f64::NAN,
                    p50_us: f64::NAN,
                    p99_us: f64::NAN,
                }]
            } else {
                v.clone()
            }
        })
        .map(|v| Sample {
            rps: median(v.iter().map(|s| s.rps).collect()),
            p50_us: median(v.iter().map(|s| s.p50_us).collect()),
            p99_us: median(v.iter().map(|s| s.p99_us).collect()),
        })
        .collect();
    let bare = med[0];
    println!("\nmedians over {rounds} rounds, ratios to bare:");
    println!(
        "{:>15} {:>10} {:>9} {:>9} {:>8} {:>8} {:>8} {:>10}",
        "variant", "req/s", "p50 us", "p99 us", "rps/bare", "p50/bare", "p99/bare", "paired"
    );
    // The same round's runs are seconds apart, so their ratio cancels much
    // of the drift between rounds; the median of those ratios is the
    // steadier estimate.
    let paired = |a: usize, b: usize| {
        let ratios: Vec<f64> = samples[a]
            .iter()
            .zip(&samples[b])
            .map(|(x, y)| x.rps / y.rps)
            .collect();
        if ratios.is_empty() {
            f64::NAN
        } else {
            median(ratios)
        }
    };
    for (i, ((name, _), m)) in variants.iter().zip(&med).enumerate() {
        let paired = paired(i, 0);
        println!(
            "{name:>15} {:>10.0} {:>9.0} {:>9.0} {:>8.2} {:>8.2} {:>8.2} {paired:>10.2}",
            m.rps,
            m.p50_us,
            m.p99_us,
            m.rps / bare.rps,
            m.p50_us / bare.p50_us,
            m.p99_us / bare.p99_us
        );
    }
    println!(
        "layer-local / tower_governor req/s = {:.2}, paired {:.2} (without the decision extension {:.2}, paired {:.2}; both around the router {:.2}, paired {:.2}); layer-redis / layer-local = {:.2}",
        med[1].rps / med[3].rps,
        paired(1, 3),
        med[2].rps / med[3].rps,
        paired(2, 3),
        med[5].rps / med[6].rps,
        paired(5, 6),
        med[4].rps / med[1].rps
    );
    let ratio =
        |a: usize, b: usize| format!("{:.2}, paired {:.2}", med[a].rps / med[b].rps, paired(a, b));
    println!(
        "layer-leased / layer-local = {}; layer-coalesced / layer-redis = {}",
        ratio(7, 1),
        ratio(8, 4)
    );
    println!(
        "four gateways: fleet-leased / layer-local = {}; fleet-coalesced / fleet-exact = {}",
        ratio(11, 1),
        ratio(10, 9)
    );
    println!(
        "deny flood: layer-deny / tg-deny 429s/s = {}",
        ratio(12, 13)
    );
    println!("redis breaker after the runs: {:?}", global.breakers());
    println!("leased breaker after the runs: {:?}", leased.breakers());
}
