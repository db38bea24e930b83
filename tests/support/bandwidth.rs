//! Bodies and measurements for the bandwidth tests: patterned bodies, a
//! checksum, and the bytes of an endless stream received in a window.

use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};

/// Byte `i` of every test body: not periodic in any frame size.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 7)) as u8)
        .collect()
}

/// FNV-1a, enough to tell a reordered or altered body.
pub fn checksum(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// An endless body of `frame`-byte frames.
pub fn endless(frame: usize) -> Body {
    let frame = Bytes::from(pattern(frame));
    let frames =
        futures_util::stream::repeat_with(move || Ok::<_, std::convert::Infallible>(frame.clone()));
    Body::from_stream(frames)
}

/// Bytes of `url` received with `x-key: key` from `skip` after the headers
/// until `skip + window`.
pub async fn received(url: &str, key: &str, skip: Duration, window: Duration) -> usize {
    let mut res = super::client()
        .get(url)
        .header("x-key", key)
        .send()
        .await
        .unwrap();
    let start = Instant::now() + skip;
    let end = start + window;
    let mut got = 0;
    while let Ok(Ok(Some(chunk))) = tokio::time::timeout_at(end.into(), res.chunk()).await {
        if Instant::now() >= start {
            got += chunk.len();
        }
    }
    got
}

/// Prints the figure and checks it is within 10 % of `limit`.
pub fn assert_near(what: &str, measured: f64, limit: u32) {
    let want = f64::from(limit);
    let off = (measured - want) / want;
    println!(
        "{what}: {measured:.0} B/s, limit {limit} B/s ({:+.1} %)",
        off * 100.0
    );
    assert!(
        off.abs() <= 0.10,
        "{what}: {measured:.0} B/s is not within 10 % of {limit}"
    );
}
