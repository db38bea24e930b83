//! The pipelined ceiling (`benches/redis.rs`): one connection sending
//! batches of `PIPELINE` `EVALSHA` of the GCRA rate script, and
//! `redis-benchmark -P` running the same script.

use std::time::{Duration, Instant};

use keyed_rate_limit::Quota;

/// The GCRA rate script as the backend loads it: a batch of one request.
pub const GCRA: &str = concat!(
    include_str!("../../src/backend/redis/lua/clock.lua"),
    include_str!("../../src/backend/redis/lua/quota_change.lua"),
    include_str!("../../src/backend/redis/lua/one_number.lua"),
    include_str!("../../src/backend/redis/lua/gcra.lua"),
    "moves = function()\nif made then return made end\nmade = {}\nlocal m = made\n",
    include_str!("../../src/backend/redis/lua/whole_at.lua"),
    include_str!("../../src/backend/redis/lua/one_key.lua"),
    include_str!("../../src/backend/redis/lua/moved.lua"),
    "return m\nend\n",
    "local wide = false\n",
    include_str!("../../src/backend/redis/lua/batch.lua"),
);
/// `EVALSHA`s per pipeline.
pub const PIPELINE: usize = 256;

/// Decisions/s of one pipelined connection sending batches of `PIPELINE`
/// `EVALSHA` in quota `q`, over `nkeys` keys.
pub async fn ceiling(url: &str, dur: Duration, q: Quota, nkeys: usize) -> f64 {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg(GCRA)
        .query_async(&mut conn)
        .await
        .unwrap();
    let window_us = q.window().as_micros() as u64;
    let keys: Vec<String> = (0..nkeys)
        .map(|i| format!("krl:{{ceiling:k{i}}}:gcra"))
        .collect();
    let start = Instant::now();
    let mut n = 0usize;
    while start.elapsed() < dur {
        let mut pipe = redis::pipe();
        for j in 0..PIPELINE {
            pipe.cmd("EVALSHA")
                .arg(&sha)
                // The key's state (a rule that cannot be locked).
                .arg(1)
                .arg(&keys[(n + j) % keys.len()])
                .arg(q.limit())
                .arg(window_us)
                .arg(q.burst())
                // No lock, no lockout, no quota change (one key per key,
                // no previous quota, mode 1, at 0); the key once, one unit.
                .arg(&[0, 0, 1, 1, 1, 0, 1, 0][..]);
        }
        let replies: Vec<(i64, i64, i64)> = pipe.query_async(&mut conn).await.unwrap();
        assert_eq!(replies.len(), PIPELINE);
        n += PIPELINE;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// `redis-benchmark -P 256` running the same script, when installed.
pub fn redis_benchmark(port: u16, sha: &str) -> Option<f64> {
    let out = std::process::Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-P", &PIPELINE.to_string(), "-c", "4", "-n", "400000"])
        .args(["-r", "100000", "--csv", "EVALSHA", sha, "1"])
        .args(["krl:{rb:__rand_int__}:gcra"])
        .args(["1000000000", "1000000"])
        .args(["1000000000", "0", "0", "1", "1", "1", "0", "1", "0"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "test","rps",...  then  "EVALSHA ...","123456.79",...
    text.lines().nth(1).and_then(|l| {
        l.split(',')
            .nth(1)
            .and_then(|v| v.trim_matches('"').parse().ok())
    })
}
