//! Bounded concurrent load over HTTP: a fixed number of requests spread
//! over a few clients, each with its own `x-client` key.

/// Sends `n` GETs to `url` from `clients` concurrent clients (client `i`
/// sends `x-client: c<i>`, one request at a time, `n / clients` in all);
/// returns how many were answered 200 and 429. Any other status fails.
pub async fn spread(url: &str, n: usize, clients: usize) -> (u64, u64) {
    assert_eq!(n % clients, 0, "an equal share per client");
    let mut tasks = Vec::new();
    for i in 0..clients {
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move {
            let c = super::client();
            let (mut ok, mut denied) = (0, 0);
            for _ in 0..n / clients {
                let res = c.get(&url).header("x-client", format!("c{i}")).send().await;
                match res.unwrap().status().as_u16() {
                    200 => ok += 1,
                    429 => denied += 1,
                    other => panic!("status {other}"),
                }
            }
            (ok, denied)
        }));
    }
    let mut total = (0, 0);
    for t in tasks {
        let (ok, denied) = t.await.unwrap();
        total = (total.0 + ok, total.1 + denied);
    }
    total
}
