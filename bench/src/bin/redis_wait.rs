//! What `WAIT 1` after each decision would cost: a decision-shaped script
//! (`TIME`, `GET`, `SET … PX`) on one multiplexed connection to a private
//! master with one replica, alone and pipelined with `WAIT 1 100`, at
//! concurrency 1 and 64, in interleaved rounds (median decisions/s and the
//! paired ratio per round).
//!
//! `cargo run -p keyed-rate-limit-bench --release --bin redis_wait --features redis [decisions] [rounds]`

use keyed_rate_limit_bench::spread::per_second;
use keyed_rate_limit_testing::RedisServer;
use keyed_rate_limit_testing::rounds::{median, order};
use redis::aio::MultiplexedConnection;

const SCRIPT: &str = "local t = redis.call('TIME') \
    local n = tonumber(redis.call('GET', KEYS[1]) or '0') + 1 \
    redis.call('SET', KEYS[1], n, 'PX', 60000) return n";

async fn run(
    conn: &MultiplexedConnection,
    decisions: usize,
    concurrency: usize,
    wait: bool,
) -> f64 {
    let (conn, script) = (conn.clone(), redis::Script::new(SCRIPT));
    per_second(decisions, concurrency, move |i| {
        let (mut c, hash) = (conn.clone(), script.get_hash().to_owned());
        async move {
            let key = format!("k{}", i % 1000);
            let mut p = redis::pipe();
            p.cmd("EVALSHA").arg(&hash).arg(1).arg(&key);
            if wait {
                p.cmd("WAIT").arg(1).arg(100);
                let (_, acked): (i64, i64) = p.query_async(&mut c).await.expect("pipeline");
                assert_eq!(acked, 1, "the replica acknowledged");
            } else {
                let (_,): (i64,) = p.query_async(&mut c).await.expect("evalsha");
            }
        }
    })
    .await
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let decisions: usize = args.next().map_or(5_000, |a| a.parse().expect("decisions"));
    let rounds: usize = args.next().map_or(5, |a| a.parse().expect("rounds"));
    let master = RedisServer::start();
    let port = master.port().to_string();
    let _replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let client = redis::Client::open(master.url()).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let _: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(SCRIPT)
        .query_async(&mut conn)
        .await
        .expect("load");
    // Until the replica has synced, WAIT would time out.
    loop {
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(100)
            .query_async(&mut conn)
            .await
            .expect("wait");
        if acked == 1 {
            break;
        }
    }
    for concurrency in [1, 64] {
        let (mut plain, mut waited, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..rounds {
            let mut got = [0.0; 2];
            for i in order(round, 2) {
                got[i] = run(&conn, decisions, concurrency, i == 1).await;
            }
            plain.push(got[0]);
            waited.push(got[1]);
            ratios.push(got[1] / got[0]);
        }
        println!(
            "concurrency {concurrency}: decisions/s without WAIT {:.0}, with WAIT 1 {:.0}; with / without, paired median {:.3} ({rounds} rounds of {decisions})",
            median(plain),
            median(waited),
            median(ratios)
        );
    }
}
