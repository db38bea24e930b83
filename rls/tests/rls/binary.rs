//! `keyed-rls` as a process: health, Envoy's grpcio stubs (xds-protos)
//! against it, a reload on file change, and a graceful SIGTERM.

use std::process::Command;

use crate::process::{CONFIG, Rls, free_port, temp_file, venv};

/// `grpc.health.v1` through grpcio's own health stubs, when the
/// environment has them, else a raw connect.
fn healthy(venv: &std::path::Path, rls: &Rls) -> String {
    let script = format!(
        "import grpc\nfrom grpc_health.v1 import health_pb2, health_pb2_grpc\n\
         s = health_pb2_grpc.HealthStub(grpc.insecure_channel('{}'))\n\
         print(health_pb2.HealthCheckResponse.ServingStatus.Name(s.Check(health_pb2.HealthCheckRequest(service='envoy.service.ratelimit.v3.RateLimitService')).status))",
        rls.addr
    );
    let out = Command::new(venv.join("bin/python"))
        .args(["-c", &script])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

#[test]
fn envoys_own_stubs_get_the_protocol_to_the_letter() {
    let Some(venv) = venv() else { return };
    let config = temp_file("edge.yaml", CONFIG);
    let rls = Rls::start(&config, free_port());
    assert_eq!(healthy(&venv, &rls), "SERVING");
    let out = Command::new(venv.join("bin/python"))
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/rls/xds_client.py"
        ))
        .arg(rls.addr.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("all protocol cases passed"), "{stdout}");
}

#[test]
fn a_changed_file_is_reloaded_a_bad_one_is_not_and_sigterm_stops_it() {
    let config = temp_file("edge.yaml", CONFIG);
    let mut rls = Rls::start(&config, free_port());
    // Past the file system's timestamp resolution.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    std::fs::write(
        &config,
        CONFIG.replace("requests_per_unit: 3", "requests_per_unit: 5"),
    )
    .unwrap();
    rls.log_until("rate-limit rules file applied");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    std::fs::write(
        &config,
        "domain: edge\ndescriptors:\n  - key: user\n    bogus: 1\n",
    )
    .unwrap();
    let log = rls.log_until("rate-limit rules file rejected");
    assert!(
        log.contains("unknown field `bogus`") || log.contains("bogus"),
        "{log}"
    );
    let status = rls.terminate();
    assert!(status.success(), "{status:?}");
}

/// envoyproxy/ratelimit's file as is, served by two processes on one
/// private Redis: every limit counts in Redis, in windows on the clock.
/// Exactly the limit is admitted across both in a window, the status's
/// reset is the window's edge, and the next window admits the limit again.
#[test]
fn two_processes_on_one_redis_count_its_file_as_it_does() {
    const FILE: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: burst
    rate_limit: { unit: second, requests_per_unit: 5 }
";
    let redis = keyed_rate_limit_testing::RedisServer::start();
    let config = temp_file("edge.yaml", FILE);
    let start = || {
        let port = free_port();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_keyed-rls"));
        cmd.args(["--listen", &format!("127.0.0.1:{port}"), "--config"])
            .arg(&config)
            .args(["--redis", &redis.url()]);
        Rls::spawn(cmd, ([127, 0, 0, 1], port).into())
    };
    let (a, b) = (start(), start());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let mut c = [crate::client(a.addr).await, crate::client(b.addr).await];
        let edge = crate::minute_edge();
        let asked = std::time::Instant::now();
        let mut ok = 0;
        let mut last = None;
        for i in 0..8 {
            let r = crate::ask(&mut c[i % 2], vec![crate::descriptor(&[("user", "u")])]).await;
            ok += usize::from(r.overall_code == crate::OK);
            last = Some(r);
        }
        assert_eq!(ok, 3, "a minute's 3 across both processes");
        let over = &last.unwrap().statuses[0];
        assert_eq!(over.limit_remaining, 0);
        let reset = over.duration_until_reset.unwrap().seconds as u64;
        // Whole seconds to the same minute's end, less what the asks took
        // (the first ones load the scripts; a loaded machine is slow): the
        // edge is rounded up and the reset down, a second apart at most.
        let took = asked.elapsed().as_secs_f64().ceil() as u64;
        assert!(
            (edge.saturating_sub(2 + took)..=edge).contains(&reset),
            "{reset} s to the minute's end, {edge} when asked, {took} s ago"
        );
        // A second's windows, twice: each admits 5 across both.
        for window in 0..2 {
            let into = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_millis();
            // Start a window's first tenth, with the window to finish in.
            tokio::time::sleep(std::time::Duration::from_millis(
                u64::from(1_000 - into) + 20,
            ))
            .await;
            let mut ok = 0;
            for i in 0..12 {
                let r = crate::ask(&mut c[i % 2], vec![crate::descriptor(&[("burst", "b")])]).await;
                ok += usize::from(r.overall_code == crate::OK);
            }
            assert_eq!(ok, 5, "window {window}: a second's 5 across both processes");
            // Late in the same window, nothing came back (a bucket would
            // have refilled 4 units by now).
            let into = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_millis();
            if into < 800 {
                tokio::time::sleep(std::time::Duration::from_millis(u64::from(850 - into))).await;
                let r =
                    crate::ask(&mut c[window], vec![crate::descriptor(&[("burst", "b")])]).await;
                assert_eq!(r.overall_code, crate::OVER, "850 ms into window {window}");
            }
        }
    });
}
