//! Multiplexed connection vs bb8 pool under concurrency, against a private
//! `redis-server` this example starts (never the shared one on 6379).
//!
//! `cargo run -p keyed-rate-limit-bench --release --bin redis_conn_bench --features redis [decisions] [concurrency]`

use keyed_rate_limit_testing as redis_server;

use keyed_rate_limit::{Algorithm, Key, Quota};
use keyed_rate_limit::{RedisBackend, backend::redis::ConnectionMode};
use keyed_rate_limit_bench::spread::per_second;
use redis_server::RedisServer;

async fn run(backend: &RedisBackend, decisions: usize, concurrency: usize) -> f64 {
    let backend = backend.clone();
    per_second(decisions, concurrency, move |i| {
        let b = backend.clone();
        async move {
            let quota = Quota::per_hour(1_000_000);
            let key = Key::from((i % 1000) as u64);
            b.check("bench", &key, Algorithm::Gcra, &quota, 1)
                .await
                .expect("check");
        }
    })
    .await
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let decisions: usize = args
        .next()
        .map_or(10_000, |a| a.parse().expect("decisions"));
    let concurrency: usize = args.next().map_or(64, |a| a.parse().expect("concurrency"));
    let server = RedisServer::start();
    let modes = [
        ("multiplexed", ConnectionMode::Multiplexed),
        ("pool(16)", ConnectionMode::Pool { max_size: 16 }),
        ("pool(64)", ConnectionMode::Pool { max_size: 64 }),
    ];
    let mut best = vec![0f64; modes.len()];
    for round in 0..3 {
        for (i, (name, mode)) in modes.iter().enumerate() {
            let b = RedisBackend::builder(server.url())
                .prefix(format!("bench{round}{i}"))
                .connection(*mode)
                .build()
                .await
                .expect("build");
            run(&b, 1_000, concurrency).await; // warm up connections and the script
            let rate = run(&b, decisions, concurrency).await;
            best[i] = best[i].max(rate);
            println!("round {round} {name:>12}: {rate:>9.0} decisions/s");
        }
    }
    println!("best of 3, {decisions} decisions at concurrency {concurrency}:");
    for (i, (name, _)) in modes.iter().enumerate() {
        println!(
            "{name:>12}: {:>9.0} decisions/s ({:.2}x multiplexed)",
            best[i],
            best[i] / best[0]
        );
    }
}
