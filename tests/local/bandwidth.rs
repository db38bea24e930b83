//! The bandwidth layer in front of a real axum server, measured by reqwest
//! clients: the throughput figures run concurrently, in one 5-s window.

use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::http::StatusCode;
use axum::routing::{get, post};
use keyed_rate_limit::bandwidth::{Direction, ShapedBody};
use keyed_rate_limit::{BandwidthLimitLayer, KeyExtractor, OnMissingKey};

use crate::support::bandwidth::{self, checksum, endless, pattern, received};
use crate::support::{client, serve, sf};

/// Bytes a second per key in the throughput test.
const RATE: u32 = 256 * 1024;
/// Small, so the start-up burst moves the 5-s figure by about 1 %.
const BURST: u32 = 16 * 1024;
const WINDOW: Duration = Duration::from_secs(5);

fn app(direction: Direction) -> Router {
    let layer = BandwidthLimitLayer::builder("dl", KeyExtractor::header("x-key"), RATE)
        .burst(BURST)
        .direction(direction)
        .build()
        .unwrap();
    Router::new()
        // One frame of the whole body: the layer must split it.
        .route(
            "/whole/{n}",
            get(
                |axum::extract::Path(n): axum::extract::Path<usize>| async move {
                    Bytes::from(pattern(n))
                },
            ),
        )
        // An endless stream of 64 KiB frames.
        .route("/stream", get(|| async { endless(64 * 1024) }))
        .route(
            "/upload",
            post(|body: Bytes| async move { format!("{} {}", body.len(), checksum(&body)) }),
        )
        .layer(layer)
}

/// Bytes of `/stream` that key `key` receives in [`WINDOW`] after the headers.
async fn streamed(base: &str, key: &str) -> usize {
    received(&format!("{base}/stream"), key, Duration::ZERO, WINDOW).await
}

fn rate(bytes: usize) -> f64 {
    bytes as f64 / WINDOW.as_secs_f64()
}

fn assert_near(what: &str, measured: f64) {
    bandwidth::assert_near(what, measured, RATE);
}

/// Everything that takes wall time, at once: one key alone, a second key
/// beside it, four connections of a third, a whole-frame download checked
/// byte for byte, and an upload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bandwidth_rates_per_key_shared_and_intact() {
    let base = serve(app(Direction::Both)).await;
    let up = client();
    let whole_len = RATE as usize * 3;
    let upload_len = RATE as usize * 3;
    let (a, b, c, whole, upload) = tokio::join!(
        streamed(&base, "a"),
        streamed(&base, "b"),
        futures_util::future::join_all((0..4).map(|_| streamed(&base, "c"))),
        async {
            let t = Instant::now();
            let res = client()
                .get(format!("{base}/whole/{whole_len}"))
                .header("x-key", "d")
                .send()
                .await
                .unwrap();
            let body = res.bytes().await.unwrap();
            (body, t.elapsed())
        },
        async {
            let t = Instant::now();
            let res = up
                .post(format!("{base}/upload"))
                .header("x-key", "e")
                .body(pattern(upload_len))
                .send()
                .await
                .unwrap();
            (res.text().await.unwrap(), t.elapsed())
        },
    );
    assert_near("key a alone", rate(a));
    assert_near("key b beside it", rate(b));
    let shared: usize = c.iter().sum();
    println!("key c, four connections: {c:?}");
    assert_near("key c over four connections", rate(shared));
    // One frame of 768 KiB, let out in 16-KiB pieces: whole and in order.
    let (body, took) = whole;
    assert_eq!(body.len(), whole_len);
    assert_eq!(checksum(&body), checksum(&pattern(whole_len)));
    let rate_d = (whole_len - BURST as usize) as f64 / took.as_secs_f64();
    assert_near("key d, one whole frame", rate_d);
    // The upload is paced as the server reads it.
    let (text, took) = upload;
    assert_eq!(
        text,
        format!("{upload_len} {}", checksum(&pattern(upload_len)))
    );
    let rate_e = (upload_len - BURST as usize) as f64 / took.as_secs_f64();
    assert_near("key e, an upload", rate_e);
}

#[tokio::test]
async fn bandwidth_policy_header_counts_content_bytes() {
    let base = serve(app(Direction::Response)).await;
    let res = client()
        .get(format!("{base}/whole/10"))
        .header("x-key", "a")
        .send()
        .await
        .unwrap();
    let policy = sf::member(&res, "ratelimit-policy", "dl");
    assert_eq!(policy.int("q"), Some(i64::from(RATE)));
    assert_eq!(policy.int("w"), Some(1));
    assert_eq!(policy.string("qu").as_deref(), Some("content-bytes"));
    assert_eq!(res.bytes().await.unwrap(), pattern(10));
}

#[tokio::test]
async fn bandwidth_missing_key_follows_the_policy() {
    let reject = BandwidthLimitLayer::builder("dl", KeyExtractor::header("x-key"), RATE)
        .on_missing_key(OnMissingKey::Reject(StatusCode::UNAUTHORIZED))
        .build()
        .unwrap();
    let base = serve(
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(reject),
    )
    .await;
    let res = client().get(&base).send().await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        res.headers()["www-authenticate"],
        r#"ApiKey header="x-key""#
    );
    // A key source missing from the setup is a 500, not an unlimited body.
    let nowhere = BandwidthLimitLayer::builder("dl", KeyExtractor::peer_ip(), RATE)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .layer(nowhere);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let res = client()
        .get(format!("http://{addr}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

#[test]
fn bandwidth_build_checks_settings() {
    let b = |rate| BandwidthLimitLayer::builder("dl", KeyExtractor::everyone(), rate);
    assert!(b(0).build().is_err());
    assert!(b(1000).burst(0).build().is_err());
    // Above 10⁶ bytes a second the bucket counts in larger units.
    assert_eq!(b(u32::MAX).build().unwrap().bytes_per_second(), u32::MAX);
    assert!(b(1000).max_keys(0).build().is_err());
    assert!(
        BandwidthLimitLayer::builder("", KeyExtractor::everyone(), 1)
            .build()
            .is_err()
    );
    assert_eq!(b(1000).build().unwrap().burst(), 1000);
}

type Boxed = http_body_util::combinators::UnsyncBoxBody<Bytes, std::convert::Infallible>;

/// The layer in process over `body`, for the global key.
async fn through(rate: u32, burst: u32, body: Boxed) -> ShapedBody<Boxed> {
    use tower::ServiceExt;
    let layer = BandwidthLimitLayer::builder("dl", KeyExtractor::everyone(), rate)
        .burst(burst)
        .build()
        .unwrap();
    let body = std::sync::Arc::new(std::sync::Mutex::new(Some(body)));
    let svc = layer.layer(tower::service_fn(
        move |_req: http::Request<ShapedBody<http_body_util::Empty<Bytes>>>| {
            let body = body.lock().unwrap().take().unwrap();
            async move { Ok::<_, std::convert::Infallible>(http::Response::new(body)) }
        },
    ));
    let req = http::Request::new(http_body_util::Empty::<Bytes>::new());
    svc.oneshot(req).await.unwrap().into_body()
}

#[tokio::test]
async fn bandwidth_splits_a_large_frame_without_copying() {
    use http_body_util::BodyExt;
    let whole = Bytes::from(pattern(100_000));
    let mut body = std::pin::pin!(
        through(
            4_000_000,
            16 * 1024,
            http_body_util::Full::new(whole.clone()).boxed_unsync()
        )
        .await
    );
    assert!(body.is_shaped());
    let mut at = 0;
    while let Some(frame) = body.frame().await {
        let piece = frame.unwrap().into_data().unwrap();
        assert!(piece.len() <= 16 * 1024, "a piece of {} bytes", piece.len());
        // A view of the same buffer, in order.
        assert_eq!(piece.as_ptr(), whole[at..].as_ptr());
        at += piece.len();
        // What is held counts as still to come, exactly.
        let left = (whole.len() - at) as u64;
        assert_eq!(http_body::Body::size_hint(&*body).exact(), Some(left));
    }
    assert_eq!(at, whole.len());
}

#[tokio::test]
async fn bandwidth_reads_no_further_than_a_slow_client() {
    use http_body_util::BodyExt;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let made = Arc::new(AtomicUsize::new(0));
    let counter = made.clone();
    let frames = futures_util::stream::repeat_with(move || {
        counter.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::convert::Infallible>(http_body::Frame::data(Bytes::from_static(&[7; 1000])))
    });
    let body = through(
        10_000_000,
        64 * 1024,
        http_body_util::StreamBody::new(frames).boxed_unsync(),
    )
    .await;
    let mut body = std::pin::pin!(body);
    for read in 1..=10 {
        body.frame().await.unwrap().unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        // The frame let out is the only one taken from the inner body.
        assert_eq!(made.load(Ordering::SeqCst), read);
    }
}

/// Server-sent events through the layer: every event arrives whole and in
/// order, paced by its bytes (never faster than the rate after the burst).
#[tokio::test]
async fn bandwidth_paces_server_sent_events_intact() {
    use axum::response::sse::{Event, Sse};
    const EVENTS: usize = 20;
    const SIZE: usize = 2048;
    let rate = 32 * 1024;
    let layer = BandwidthLimitLayer::builder("sse", KeyExtractor::header("x-key"), rate)
        .burst(4 * 1024)
        .build()
        .unwrap();
    let events = || {
        let text = |i: usize| format!("{i:04}:{}", "x".repeat(SIZE - 5));
        let stream = futures_util::stream::iter(
            (0..EVENTS)
                .map(move |i| Ok::<_, std::convert::Infallible>(Event::default().data(text(i)))),
        );
        Sse::new(stream)
    };
    let base = serve(
        Router::new()
            .route("/events", get(move || async move { events() }))
            .layer(layer),
    )
    .await;
    let start = Instant::now();
    let res = client()
        .get(format!("{base}/events"))
        .header("x-key", "a")
        .send()
        .await
        .unwrap();
    let body = res.text().await.unwrap();
    let took = start.elapsed();
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.len(), EVENTS, "every event arrives");
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d.len(), SIZE, "event {i} whole");
        assert!(d.starts_with(&format!("{i:04}:")), "event {i} in order");
    }
    // What is past the burst comes at the rate at most.
    let paced = (body.len() - 4 * 1024) as f64 / f64::from(rate);
    assert!(
        took.as_secs_f64() >= paced * 0.95,
        "{took:?} for {} bytes",
        body.len()
    );
}
