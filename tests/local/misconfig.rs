//! The three setups in which a rule can never find its key, over real
//! HTTP: each refuses with a 500 that names what is missing and logs the
//! fix, instead of limiting nothing; and each done right limits.

use std::net::SocketAddr;

use axum::extract::Request;
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::{Router, routing::get};
use keyed_rate_limit::KeyExtractor;
use keyed_rate_limit::OnMissingKey;
use keyed_rate_limit::{Key, Quota, RateLimitLayer, Rule};

use crate::support::{client, events, serve, statuses};

fn layer(rule: Rule) -> RateLimitLayer {
    RateLimitLayer::builder().rule(rule).build().unwrap()
}

fn routes() -> Router {
    Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/items/{id}", get(|| async { "item" }))
}

/// Serves `app` without `ConnectInfo`, as `axum::serve(listener, app)` does.
async fn serve_plain(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

/// The problem document of a 500, and the ERROR lines logged so far.
async fn refused(url: &str, events: &events::Events) -> (serde_json::Value, Vec<String>) {
    let res = client().get(url).send().await.unwrap();
    assert_eq!(res.status(), 500);
    assert_eq!(
        res.headers()["content-type"],
        "application/problem+json",
        "the default body"
    );
    let body: serde_json::Value = res.json().await.unwrap();
    let errors = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| {
            e.get("message")
                .is_some_and(|m| m.contains("cannot find its key"))
        })
        .map(|e| format!("{e:?}"))
        .collect();
    (body, errors)
}

#[cfg(feature = "metrics")]
fn misconfigs(rule: &str, kind: &str) -> u64 {
    crate::support::metrics::counter_with(
        keyed_rate_limit::observe::MISCONFIG_TOTAL,
        &[("rule", rule), ("kind", kind)],
    )
}

#[tokio::test]
async fn peer_ip_without_connect_info_refuses_and_says_how_to_serve() {
    #[cfg(feature = "metrics")]
    crate::support::metrics::snapshotter();
    let (events, _guard) = events::capture();
    let rule = Rule::new("no-ci", KeyExtractor::peer_ip(), Quota::per_minute(2));
    let url = serve_plain(routes().layer(layer(rule))).await;
    // 5 of 5 passed a 2/min limit before: now none reaches the handler.
    assert_eq!(statuses(&client(), &url, 4).await, [500; 4]);
    let (body, errors) = refused(&url, &events).await;
    assert_eq!(body["status"], 500);
    assert_eq!(body["rule"], "no-ci");
    assert_eq!(
        body["detail"],
        "rate limit \"no-ci\" is misconfigured: the server does not record client addresses",
        "no Rust type for clients"
    );
    assert_eq!(errors.len(), 1, "once a minute per rule: {errors:?}");
    assert!(
        errors[0].contains("into_make_service_with_connect_info"),
        "{errors:?}"
    );
    #[cfg(feature = "metrics")]
    assert_eq!(misconfigs("no-ci", "no_connect_info"), 5);

    // Served with ConnectInfo, the same rule limits.
    let rule = Rule::new("with-ci", KeyExtractor::peer_ip(), Quota::per_minute(2));
    let url = serve(routes().layer(layer(rule))).await;
    assert_eq!(statuses(&client(), &url, 3).await, [200, 200, 429]);
}

#[tokio::test]
async fn an_explicit_policy_still_logs_a_setup_that_cannot_work() {
    let (events, _guard) = events::capture();
    let rule = Rule::new("skip-no-ci", KeyExtractor::peer_ip(), Quota::per_minute(2))
        .on_missing_key(OnMissingKey::Skip);
    let url = serve_plain(routes().layer(layer(rule))).await;
    // Skip is what was asked for...
    assert_eq!(statuses(&client(), &url, 3).await, [200; 3]);
    // ...but peer_ip() without ConnectInfo is never right: an ERROR.
    let logged = events::with_message(&events, "cannot find its key");
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0]["rule"], "skip-no-ci");
    assert_eq!(logged[0]["kind"], "no_connect_info");
}

#[derive(Clone)]
struct User(u64);

async fn auth(mut req: Request, next: Next) -> Response {
    let user = req
        .headers()
        .get("x-user")
        .and_then(|v| v.to_str().ok()?.parse().ok());
    if let Some(id) = user {
        req.extensions_mut().insert(User(id));
    }
    next.run(req).await
}

/// The status of a GET as `user` (`x-user`; empty: anonymous).
async fn status_as(url: &str, user: &str) -> u16 {
    let req = client().get(url);
    let req = if user.is_empty() {
        req
    } else {
        req.header("x-user", user)
    };
    req.send().await.unwrap().status().as_u16()
}

fn by_user() -> Rule {
    // A closure capturing a value, where a `fn` pointer was required before.
    let tenant = String::from("acme");
    Rule::new(
        "per-user",
        KeyExtractor::extension::<User>(move |u| Key::from(format!("{tenant}:{}", u.0))),
        Quota::per_minute(2),
    )
}

#[tokio::test]
async fn an_extension_rule_outside_its_auth_layer_refuses() {
    #[cfg(feature = "metrics")]
    crate::support::metrics::snapshotter();
    let (events, _guard) = events::capture();
    // axum runs the last `.layer` first: the limit sees the request before auth.
    let app = routes()
        .layer(middleware::from_fn(auth))
        .layer(layer(by_user()));
    let url = serve(app).await;
    let c = client();
    for _ in 0..4 {
        let res = c.get(&url).header("x-user", "7").send().await.unwrap();
        assert_eq!(res.status(), 500);
    }
    let res = c.get(&url).header("x-user", "7").send().await.unwrap();
    let body: serde_json::Value = res.json().await.unwrap();
    let detail = body["detail"].as_str().unwrap();
    assert_eq!(
        detail,
        "rate limit \"per-user\" is misconfigured: the request lacks what the rate limit \
         counts it by, which an earlier layer (such as authentication) should have set"
    );
    assert!(
        !detail.contains("User"),
        "no Rust type for clients: {detail}"
    );
    let logged = events::with_message(&events, "cannot find its key");
    assert_eq!(logged.len(), 1, "{logged:?}");
    // The log names the type, and both causes in axum's terms.
    let message = &logged[0]["message"];
    assert!(message.contains("misconfig::User extension"), "{message}");
    assert!(
        message.contains("write `.layer(rate_limit)` above `.layer(auth)`"),
        "{message}"
    );
    assert!(message.contains("or the request is anonymous"), "{message}");
    assert!(message.contains("optional_extension"), "{message}");
    #[cfg(feature = "metrics")]
    assert_eq!(misconfigs("per-user", "no_extension"), 5);

    // Inside auth, it limits per user; an anonymous request is refused
    // until the rule says anonymous requests are expected.
    let app = routes()
        .layer(layer(by_user()))
        .layer(middleware::from_fn(auth));
    let url = serve(app).await;
    let sent = |user: &'static str| status_as(&url, user);
    assert_eq!(
        [sent("7").await, sent("7").await, sent("7").await],
        [200, 200, 429]
    );
    assert_eq!(sent("8").await, 200, "another user has their own budget");
    assert_eq!(sent("").await, 500);

    let anonymous_free = by_user().on_missing_key(OnMissingKey::Skip);
    let app = routes()
        .layer(layer(anonymous_free))
        .layer(middleware::from_fn(auth));
    let url = serve(app).await;
    let before = events::with_message(&events, "cannot find its key").len();
    assert_eq!(statuses(&c, &url, 3).await, [200; 3]);
    assert_eq!(
        events::with_message(&events, "cannot find its key").len(),
        before,
        "Skip on an extension means anonymous requests are expected: no error"
    );
}

/// Auth that lets anonymous requests through: `optional_extension` says
/// so, with no `OnMissingKey` to choose.
#[tokio::test]
async fn an_optional_extension_skips_anonymous_requests_and_limits_known_users() {
    let (events, _guard) = events::capture();
    let rule = || {
        Rule::new(
            "per-user",
            KeyExtractor::optional_extension::<User>(|u| Key::from(u.0)),
            Quota::per_minute(2),
        )
    };
    // The right order: the limit's `.layer` first, so auth runs before it.
    let app = routes()
        .layer(layer(rule()))
        .layer(middleware::from_fn(auth));
    let url = serve(app).await;
    let c = client();
    let as_user = |user: &'static str| status_as(&url, user);
    for _ in 0..4 {
        assert_eq!(as_user("").await, 200, "anonymous requests skip the rule");
    }
    assert_eq!(
        [as_user("7").await, as_user("7").await, as_user("7").await],
        [200, 200, 429],
        "a known user is limited"
    );
    assert_eq!(as_user("8").await, 200, "each user has their own budget");
    assert_eq!(as_user("").await, 200);
    assert!(
        events::with_message(&events, "cannot find its key").is_empty(),
        "anonymous requests were expected: no error"
    );

    // The wrong order with the extension required (`extension`, no
    // `OnMissingKey`): loud, a 500 for everyone and an ERROR naming both
    // causes; `an_extension_rule_outside_its_auth_layer_refuses` reads it.
    let required = Rule::new(
        "per-user-required",
        KeyExtractor::extension::<User>(|u| Key::from(u.0)),
        Quota::per_minute(2),
    );
    let app = routes()
        .layer(middleware::from_fn(auth))
        .layer(layer(required));
    let url = serve(app).await;
    let res = c.get(&url).header("x-user", "7").send().await.unwrap();
    assert_eq!(res.status(), 500);
    let logged = events::with_message(&events, "cannot find its key");
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0]["rule"], "per-user-required");
}

#[tokio::test]
async fn matched_route_around_the_router_refuses_and_inside_it_limits() {
    let (events, _guard) = events::capture();
    let rule = || {
        Rule::new(
            "per-route",
            KeyExtractor::matched_route(),
            Quota::per_minute(2),
        )
    };
    // The layer wrapped around the whole router: no route is matched yet.
    let wrapped = layer(rule()).layer(routes());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let make =
            axum::ServiceExt::<Request>::into_make_service_with_connect_info::<SocketAddr>(wrapped);
        axum::serve(listener, make).await.unwrap()
    });
    assert_eq!(statuses(&client(), &url, 8).await, [500; 8]);
    let logged = events::with_message(&events, "cannot find its key");
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert!(logged[0]["message"].contains("route_layer"), "{logged:?}");
    assert_eq!(logged[0]["kind"], "outside_router");

    // Inside the router, one budget per route; a path no route matches
    // has no key and is skipped: a 404, not a 500.
    let url = serve(routes().layer(layer(rule()))).await;
    let c = client();
    assert_eq!(statuses(&c, &url, 3).await, [200, 200, 429]);
    assert_eq!(
        statuses(&c, &format!("{url}/items/1"), 3).await,
        [200, 200, 429]
    );
    assert_eq!(statuses(&c, &format!("{url}/nowhere"), 3).await, [404; 3]);
    let url = serve(routes().route_layer(layer(rule()))).await;
    assert_eq!(statuses(&c, &url, 3).await, [200, 200, 429]);
    assert_eq!(statuses(&c, &format!("{url}/nowhere"), 2).await, [404; 2]);
    assert_eq!(
        events::with_message(&events, "cannot find its key").len(),
        1,
        "no error once the layer is inside the router"
    );
}

#[tokio::test]
async fn a_concurrency_limit_without_its_key_source_refuses_too() {
    use keyed_rate_limit::ConcurrencyLimitLayer;
    let (events, _guard) = events::capture();
    let limit = ConcurrencyLimitLayer::builder("slots", KeyExtractor::peer_ip(), 2)
        .build()
        .unwrap();
    let url = serve_plain(routes().layer(limit)).await;
    let (body, errors) = refused(&url, &events).await;
    assert_eq!(body["rule"], "slots");
    assert_eq!(errors.len(), 1, "{errors:?}");
    let limit = ConcurrencyLimitLayer::builder("slots", KeyExtractor::peer_ip(), 2)
        .build()
        .unwrap();
    let url = serve(routes().layer(limit)).await;
    assert_eq!(statuses(&client(), &url, 3).await, [200; 3]);
}

/// `deny_response` takes what axum handlers return; the status stays the
/// layer's, the closure's headers and body are sent.
#[tokio::test]
async fn deny_response_takes_into_response_and_keeps_the_layers_status() {
    use axum::http::{StatusCode, header};
    let limit = RateLimitLayer::builder()
        .rule(Rule::new(
            "one",
            KeyExtractor::everyone(),
            Quota::per_hour(1),
        ))
        .deny_response(|d| {
            // A 503 asked for, a 429 sent: the status is the limiter's contract.
            let text = format!("wait {} s", d.retry_after_secs().unwrap_or(0));
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [(header::CONTENT_TYPE, "text/plain")],
                text,
            )
        })
        .build()
        .unwrap();
    let url = serve(routes().layer(limit)).await;
    let c = client();
    assert_eq!(c.get(&url).send().await.unwrap().status(), 200);
    let res = c.get(&url).send().await.unwrap();
    assert_eq!(res.status(), 429);
    assert_eq!(res.headers()["content-type"], "text/plain");
    assert_eq!(res.headers()["retry-after"], "3600");
    assert!(res.headers().contains_key("ratelimit"));
    assert_eq!(res.text().await.unwrap(), "wait 3600 s");
}
