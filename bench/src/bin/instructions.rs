//! CPU cost per HTTP request, counted rather than timed: each variant of the
//! load-test app runs alone under `valgrind --tool=callgrind`, which counts
//! the instructions the server process executes. Counts repeat from run to
//! run whatever else the machine is doing, unlike req/s on a shared 2-core
//! box, so they show the layer's cost on the full axum + hyper stack.
//!
//! ```sh
//! cargo run -p keyed-rate-limit-bench --bin instructions --release
//! ```
//!
//! For each variant the server is started twice, to exit after `N` and after
//! `3N` requests, and only the connection tasks are counted; the difference
//! over `2N` cancels what is left of start-up (connection set-up, first-use
//! initialisation). The server runs on a current-thread runtime, so the count
//! is one core's work per request. It is user space only: the kernel's share
//! (the socket reads and writes) is the same for every variant apart from a
//! few more header bytes, so these ratios overstate what the layer costs in
//! req/s, which `loadtest` measures.
//!
//! Environment: `INSTR_REQUESTS` (`N`, default 2000), `INSTR_CONNS` (1: one
//! request per wake-up, the same for every variant), `INSTR_VARIANTS`
//! (a comma-separated subset, printed without ratios). With `--features
//! redis`, `INSTR_VARIANTS` may also name `layer-leased`: `layer-local`'s
//! rule made global on a private `redis-server` with 100 ms leases
//! (`Rule::lease`), its grants counted with the rest; and `layer-global`,
//! the same rule global without leases, every request decided by Redis
//! (the connection's own task, which writes and reads the socket, is not
//! counted: the request's side of a Redis decision is).
//! `INSTR_CALLGRIND_OUT=<dir>` keeps each run's profile there
//! (`callgrind.<variant>.<N>`) for `callgrind_annotate`.
//! Needs `valgrind` (`apt-get install -y valgrind`).

use keyed_rate_limit_bench::app as support;
#[cfg(feature = "redis")]
use keyed_rate_limit_testing as redis_server;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use keyed_rate_limit::headers::HeaderStyle;

/// The last two drop everything but the limiter: no decision extension and
/// no rate-limit headers, against `tower_governor` without its headers.
/// `layer-outer` and `tg-outer` wrap the whole router instead of being
/// added with `Router::layer`.
/// The next four are the accounting variants (see `support::accounting`);
/// the deny variants answer 429, and the last two are one-rule 429s of
/// this layer and of `tower_governor`, both with their headers.
const VARIANTS: [&str; 14] = [
    "bare",
    "layer-local",
    "layer-local-ext",
    "tower_governor",
    "local-minimal",
    "tg-no-headers",
    "layer-outer",
    "tg-outer",
    "count-if",
    "two-rules",
    "deny-refund",
    "deny-no-refund",
    "layer-deny",
    "tower_governor-deny",
];

fn router(variant: &str) -> Router {
    match variant {
        "bare" => support::app(),
        "layer-local" => support::layer_local(false, HeaderStyle::Draft),
        "layer-local-ext" => support::layer_local(true, HeaderStyle::Draft),
        "local-minimal" => support::layer_local(false, HeaderStyle::None),
        "tg-no-headers" => support::tower_governor_no_headers(),
        "tower_governor" => support::tower_governor(),
        "layer-deny" => support::layer_deny(),
        "tower_governor-deny" => support::tower_governor_deny(),
        other => support::accounting(other),
    }
}

static SERVED: AtomicU64 = AtomicU64::new(0);

/// The variants that need the private Redis.
const REDIS_VARIANTS: [&str; 2] = ["layer-leased", "layer-global"];

/// The private Redis the leased variant's child connects to.
static REDIS_URL: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// `layer-local`'s rule, global (with leases when `leased`), on
/// `INSTR_REDIS_URL`.
#[cfg(feature = "redis")]
async fn global(leased: bool) -> Router {
    use keyed_rate_limit::RedisBackend;
    use keyed_rate_limit::rule::LeasePolicy;
    use std::time::Duration;
    let url = std::env::var("INSTR_REDIS_URL").expect("INSTR_REDIS_URL");
    let redis = RedisBackend::builder(url)
        .prefix("instr")
        .build()
        .await
        .unwrap();
    let rule = support::local_rule("leased")
        .global(redis)
        .redis_timeout(Duration::from_secs(1));
    let rule = if leased {
        rule.lease(LeasePolicy::new(Duration::from_millis(100)))
    } else {
        rule
    };
    let layer = keyed_rate_limit::RateLimitLayer::builder()
        .rule(rule)
        .build()
        .unwrap();
    support::app().layer(layer)
}

/// The child: serve `variant` until `n` requests are done, then exit at the
/// first byte of the next one.
fn serve(variant: &str, n: u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let routed = if variant.ends_with("-outer") {
            "bare"
        } else {
            variant
        };
        let base = match routed {
            #[cfg(feature = "redis")]
            "layer-leased" => global(true).await,
            #[cfg(feature = "redis")]
            "layer-global" => global(false).await,
            other => router(other),
        };
        let app = base.layer(axum::middleware::from_fn(
            move |req, next: axum::middleware::Next| async move {
                if SERVED.fetch_add(1, Ordering::Relaxed) == n {
                    std::process::exit(0);
                }
                next.run(req).await
            },
        ));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap());
        if variant == "layer-outer" {
            support::serve_outer(listener, app, support::Outer::Layer).await;
        } else if variant == "tg-outer" {
            support::serve_outer(listener, app, support::Outer::TowerGovernor).await;
        } else {
            axum::serve(listener, app).await.unwrap();
        }
    });
}

/// Keep-alive requests on `conns` connections until the server goes away.
async fn load(addr: SocketAddr, conns: u64) {
    let url = format!("http://{addr}/");
    let tasks: Vec<_> = (0..conns)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let client = support::connection();
                // Until the server exits: the request or its body then fails.
                while let Ok(res) = support::hello(&client, &url).send().await {
                    let expected = res.status().is_success() || res.status() == 429;
                    assert!(expected, "{}", res.status());
                    if res.bytes().await.is_err() {
                        break;
                    }
                }
            })
        })
        .collect();
    for t in tasks {
        let _ = t.await;
    }
}

/// Instructions the server ran for `variant` with `n` requests.
async fn count(variant: &str, n: u64, conns: u64) -> u64 {
    let exe = std::env::current_exe().unwrap();
    // INSTR_CALLGRIND_OUT=dir keeps each run's profile, for callgrind_annotate.
    let out_file = std::env::var("INSTR_CALLGRIND_OUT").map_or("/dev/null".to_owned(), |dir| {
        format!("{dir}/callgrind.{variant}.{n}")
    });
    let mut child = Command::new("valgrind")
        .args([
            "--tool=callgrind",
            &format!("--callgrind-out-file={out_file}"),
        ])
        // Count inside the connection tasks only: start-up (the runtime,
        // governor's clock calibration, which varies) stays out.
        .args([
            "--collect-atstart=no",
            "--toggle-collect=*handle_connection*",
        ])
        .arg(exe)
        .args(["--serve", variant, &n.to_string()])
        // Only where it is read: the environment's size moves the stack,
        // and with it libc's alignment paths, by a couple of hundred
        // instructions per request.
        .envs(
            REDIS_URL
                .get()
                .filter(|_| REDIS_VARIANTS.contains(&variant))
                .map(|u| ("INSTR_REDIS_URL", u.clone())),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run valgrind (apt-get install -y valgrind)");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr: SocketAddr = line.trim().parse().expect("the server's address");
    load(addr, conns).await;
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    err.lines()
        .find_map(|l| {
            l.split_once("I   refs:")
                .map(|(_, n)| n.trim().replace(',', ""))
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no instruction count from valgrind:\n{err}"))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 4 && args[1] == "--serve" {
        return serve(&args[2], args[3].parse().unwrap());
    }
    let n = support::env_u64("INSTR_REQUESTS", 2000);
    let conns = support::env_u64("INSTR_CONNS", 1);
    let rt = tokio::runtime::Runtime::new().unwrap();
    println!(
        "instructions per request (callgrind, server on a current-thread runtime, {conns} keep-alive connections, (I(3N) - I(N)) / 2N with N = {n})"
    );
    // `INSTR_VARIANTS=layer-local,count-if` measures those alone (no ratios).
    // Only for the leased variant: an idle server beside the others would
    // change what they are measured beside.
    #[cfg(feature = "redis")]
    let _redis = std::env::var("INSTR_VARIANTS")
        .is_ok_and(|v| v.split(',').any(|v| REDIS_VARIANTS.contains(&v)))
        .then(|| {
            let server = redis_server::RedisServer::start();
            let _ = REDIS_URL.set(server.url());
            server
        });
    if let Ok(only) = std::env::var("INSTR_VARIANTS") {
        for variant in only.split(',') {
            let (small, large) = rt.block_on(async {
                (
                    count(variant, n, conns).await,
                    count(variant, 3 * n, conns).await,
                )
            });
            let per = large.saturating_sub(small) as f64 / (2 * n) as f64;
            println!("{variant:>17}: {per:>8.0}   (I(N) {small}, I(3N) {large})");
        }
        return;
    }
    let mut per_request = Vec::new();
    for variant in VARIANTS {
        let (small, large) = rt.block_on(async {
            (
                count(variant, n, conns).await,
                count(variant, 3 * n, conns).await,
            )
        });
        let per = large.saturating_sub(small) as f64 / (2 * n) as f64;
        println!("{variant:>17}: {per:>8.0}   (I(N) {small}, I(3N) {large})");
        per_request.push(per);
    }
    let bare = per_request[0];
    println!(
        "\nratios (a cost ratio c gives at most 1/c of the bare throughput when the server's CPU is the limit):"
    );
    for (variant, per) in VARIANTS.iter().zip(&per_request).skip(1) {
        println!(
            "{variant:>17}: {:.3} of bare's instructions, +{:.0} per request, throughput bound {:.3} of bare",
            per / bare,
            per - bare,
            bare / per
        );
    }
    println!(
        "layer-local / tower_governor instructions = {:.3}; without the decision extension {:.3}; limiter only (no extension, no headers, either side) {:.3}; both around the router {:.3}",
        per_request[1] / per_request[3],
        per_request[2] / per_request[3],
        per_request[4] / per_request[5],
        per_request[6] / per_request[7]
    );
    println!(
        "accounting: count_if {:+.0} and a second rule {:+.0} per allowed request over layer-local; a 429 by a second rule with its refund {:+.0} over one without",
        per_request[8] - per_request[1],
        per_request[9] - per_request[1],
        per_request[10] - per_request[11]
    );
    println!(
        "layer-deny / tower_governor-deny instructions = {:.3}",
        per_request[12] / per_request[13]
    );
    println!(
        "layer-deny / layer-local instructions = {:.3}",
        per_request[12] / per_request[1]
    );
}
