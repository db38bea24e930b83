//! The concurrency limiter in front of a real axum server, called by reqwest.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use bytes::Bytes;
use keyed_rate_limit::{ConcurrencyLimitLayer, Key, KeyExtractor};
use reqwest::StatusCode;
use tokio::sync::{mpsc, oneshot};

/// What the test controls on the server.
#[derive(Clone)]
struct Ctl {
    /// Each `/slow` request sends the switch that lets it finish.
    entered: mpsc::UnboundedSender<oneshot::Sender<()>>,
    /// The chunks of the one `/stream` response.
    feed: Arc<Mutex<Option<mpsc::UnboundedReceiver<Bytes>>>>,
}

struct Server {
    addr: SocketAddr,
    layer: ConcurrencyLimitLayer,
    entered: mpsc::UnboundedReceiver<oneshot::Sender<()>>,
    feed: mpsc::UnboundedSender<Bytes>,
}

async fn slow(State(ctl): State<Ctl>) -> &'static str {
    let (tx, rx) = oneshot::channel();
    ctl.entered.send(tx).unwrap();
    let _ = rx.await;
    "done"
}

async fn stream(State(ctl): State<Ctl>) -> Body {
    let rx = ctl
        .feed
        .lock()
        .unwrap()
        .take()
        .expect("one stream per server");
    let chunks = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Body::from_stream(chunks)
}

async fn serve(max_in_flight: u32) -> Server {
    let layer =
        ConcurrencyLimitLayer::builder("exports", KeyExtractor::header("x-account"), max_in_flight)
            .build()
            .unwrap();
    let (entered_tx, entered) = mpsc::unbounded_channel();
    let (feed, feed_rx) = mpsc::unbounded_channel();
    let ctl = Ctl {
        entered: entered_tx,
        feed: Arc::new(Mutex::new(Some(feed_rx))),
    };
    let app = Router::new()
        .route("/slow", get(slow))
        .route("/stream", get(stream))
        .route("/fast", get(|| async { "fast" }))
        .layer(layer.clone())
        .with_state(ctl);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Server {
        addr,
        layer,
        entered,
        feed,
    }
}

fn get_as(addr: SocketAddr, path: &str, account: &str) -> reqwest::RequestBuilder {
    reqwest::Client::new()
        .get(format!("http://{addr}{path}"))
        .header("x-account", account)
}

/// Sends a `/slow` request in the background; its status and body arrive on `done`.
fn spawn_slow(
    addr: SocketAddr,
    account: &'static str,
    done: mpsc::UnboundedSender<(StatusCode, String)>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let res = get_as(addr, "/slow", account).send().await.unwrap();
        let status = res.status();
        let _ = done.send((status, res.text().await.unwrap()));
    })
}

/// Waits (bounded) until `key` has `n` requests in flight.
async fn wait_in_flight(layer: &ConcurrencyLimitLayer, key: &'static str, n: u32) {
    for _ in 0..500 {
        if layer.in_flight(&Key::from(key)) == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "{key} still has {} in flight, expected {n}",
        layer.in_flight(&Key::from(key))
    );
}

#[tokio::test]
async fn two_in_flight_then_429_until_one_completes() {
    let mut s = serve(2).await;
    let (done_tx, mut done) = mpsc::unbounded_channel();
    spawn_slow(s.addr, "acme", done_tx.clone());
    spawn_slow(s.addr, "acme", done_tx.clone());
    let first = s.entered.recv().await.unwrap();
    let second = s.entered.recv().await.unwrap();
    assert_eq!(s.layer.in_flight(&Key::from("acme")), 2);

    let refused = get_as(s.addr, "/slow", "acme").send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.headers()["retry-after"], "1");
    assert_eq!(
        refused.headers()["ratelimit-policy"],
        "\"exports\";q=2;qu=\"concurrent-requests\""
    );
    assert_eq!(refused.headers()["ratelimit"], "\"exports\";r=0;t=1");
    assert_eq!(
        refused.headers()["content-type"],
        "application/problem+json"
    );
    let problem: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(problem["rule"], "exports");
    assert_eq!(problem["status"], 429);

    // Another account has its own slots.
    spawn_slow(s.addr, "globex", done_tx.clone());
    let globex = s.entered.recv().await.unwrap();
    assert_eq!(s.layer.in_flight(&Key::from("globex")), 1);

    first.send(()).unwrap();
    assert_eq!(
        done.recv().await.unwrap(),
        (StatusCode::OK, "done".to_owned())
    );
    wait_in_flight(&s.layer, "acme", 1).await;

    // The freed slot admits a new request; the one after is refused again.
    spawn_slow(s.addr, "acme", done_tx.clone());
    let third = s.entered.recv().await.unwrap();
    let refused = get_as(s.addr, "/fast", "acme").send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    for release in [second, third, globex] {
        release.send(()).unwrap();
        assert_eq!(
            done.recv().await.unwrap(),
            (StatusCode::OK, "done".to_owned())
        );
    }
    wait_in_flight(&s.layer, "acme", 0).await;
    assert_eq!(s.layer.local_keys(), 0, "idle keys are forgotten");
    let admitted = get_as(s.addr, "/fast", "acme").send().await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    assert_eq!(
        admitted.headers()["ratelimit"],
        "\"exports\";r=1;t=1",
        "one of two slots left while this request ran"
    );
    assert_eq!(admitted.text().await.unwrap(), "fast");
}

#[tokio::test]
async fn a_client_that_gives_up_in_the_handler_frees_its_slot() {
    let mut s = serve(1).await;
    let (done_tx, _done) = mpsc::unbounded_channel();
    let client = spawn_slow(s.addr, "acme", done_tx);
    let _release = s.entered.recv().await.unwrap();
    let refused = get_as(s.addr, "/fast", "acme").send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    // Dropping the reqwest future closes the connection; the server drops
    // the handler's future and, with it, the slot.
    client.abort();
    wait_in_flight(&s.layer, "acme", 0).await;
    let admitted = get_as(s.addr, "/fast", "acme").send().await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_streaming_body_holds_its_slot_until_fully_read() {
    let s = serve(1).await;
    let mut res = get_as(s.addr, "/stream", "acme").send().await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    s.feed.send(Bytes::from_static(b"id,total\n")).unwrap();
    assert_eq!(res.chunk().await.unwrap().unwrap(), "id,total\n");

    // The headers are long sent, but the body is still streaming.
    let refused = get_as(s.addr, "/fast", "acme").send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(s.layer.in_flight(&Key::from("acme")), 1);

    s.feed.send(Bytes::from_static(b"1,42\n")).unwrap();
    assert_eq!(res.chunk().await.unwrap().unwrap(), "1,42\n");
    let refused = get_as(s.addr, "/fast", "acme").send().await.unwrap();
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);

    drop(s.feed); // ends the body
    assert_eq!(res.chunk().await.unwrap(), None);
    wait_in_flight(&s.layer, "acme", 0).await;
    let admitted = get_as(s.addr, "/fast", "acme").send().await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    assert_eq!(admitted.text().await.unwrap(), "fast");
}

#[tokio::test]
async fn a_client_that_drops_the_body_midway_frees_its_slot() {
    let s = serve(1).await;
    let mut res = get_as(s.addr, "/stream", "acme").send().await.unwrap();
    s.feed.send(Bytes::from_static(b"part 1\n")).unwrap();
    assert_eq!(res.chunk().await.unwrap().unwrap(), "part 1\n");
    assert_eq!(s.layer.in_flight(&Key::from("acme")), 1);

    // An unread body can't go back to reqwest's pool: the connection closes,
    // the server drops the body and the slot with it.
    drop(res);
    wait_in_flight(&s.layer, "acme", 0).await;
    let admitted = get_as(s.addr, "/fast", "acme").send().await.unwrap();
    assert_eq!(admitted.status(), StatusCode::OK);
    // The test never ended the stream: the server dropped the unfinished body.
    assert!(s.feed.is_closed());
}
