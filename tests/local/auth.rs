//! The composition of `examples/auth.rs`, served for real and called with reqwest.

use std::net::SocketAddr;

use reqwest::StatusCode;

#[allow(dead_code)] // the example's `main`
#[path = "../../examples/auth.rs"]
mod example;

async fn serve() -> SocketAddr {
    let app = example::app()
        .unwrap()
        .into_make_service_with_connect_info::<SocketAddr>();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

async fn whoami(addr: SocketAddr, api_key: Option<&str>) -> reqwest::Response {
    let mut req = reqwest::Client::new().get(format!("http://{addr}/whoami"));
    if let Some(k) = api_key {
        req = req.header("x-api-key", k);
    }
    req.send().await.unwrap()
}

/// Calls until refused; returns how many calls passed and the refusal.
async fn count_until_denied(
    addr: SocketAddr,
    api_key: Option<&str>,
    expect_body: &str,
) -> (u32, reqwest::Response) {
    let mut passed = 0;
    loop {
        let res = whoami(addr, api_key).await;
        if res.status() != StatusCode::OK {
            return (passed, res);
        }
        assert_eq!(res.text().await.unwrap(), expect_body);
        passed += 1;
        assert!(passed <= 100, "never limited");
    }
}

fn policies(res: &reqwest::Response) -> Vec<String> {
    res.headers()
        .get_all("ratelimit-policy")
        .iter()
        .map(|v| v.to_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn each_plan_gets_its_own_quota_and_anonymous_traffic_is_limited_per_ip() {
    let addr = serve().await;

    let (passed, denied) = count_until_denied(addr, None, "anonymous").await;
    assert_eq!(passed, example::ANONYMOUS.limit());
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    let problem: serde_json::Value = denied.json().await.unwrap();
    assert_eq!(problem["rule"], "api");

    // The same IP, authenticated: tenants don't share the anonymous budget.
    let (passed, denied) = count_until_denied(addr, Some("free-key"), "acme (free)").await;
    assert_eq!(passed, 5);
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(denied.headers().contains_key("retry-after"));
    // The guard's header (outer layer) and the plan's, both listed.
    assert_eq!(
        policies(&denied),
        ["\"api\";q=5;w=60", "\"ip-guard\";q=60;w=60"]
    );

    let (passed, denied) = count_until_denied(addr, Some("pro-key"), "globex (pro)").await;
    assert_eq!(passed, 20);
    assert_eq!(denied.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(policies(&denied)[0], "\"api\";q=20;w=60");

    // Anonymous is still refused: its budget is its own.
    assert_eq!(
        whoami(addr, None).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn the_guard_outside_auth_limits_key_guessing() {
    let addr = serve().await;
    for _ in 0..example::GUARD.limit() {
        let res = whoami(addr, Some("guess")).await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        // Auth refused it before the per-tenant limiter: only the guard counted.
        assert_eq!(policies(&res), ["\"ip-guard\";q=60;w=60"]);
    }
    let res = whoami(addr, Some("guess")).await;
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let problem: serde_json::Value = res.json().await.unwrap();
    assert_eq!(problem["rule"], "ip-guard");
    // The guard covers valid keys too: this IP is done for now.
    assert_eq!(
        whoami(addr, Some("pro-key")).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
}
