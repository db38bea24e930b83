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
    rls.log_until("rules reloaded");
    std::thread::sleep(std::time::Duration::from_millis(1100));
    std::fs::write(
        &config,
        "domain: edge\ndescriptors:\n  - key: user\n    bogus: 1\n",
    )
    .unwrap();
    let log = rls.log_until("rules not reloaded");
    assert!(
        log.contains("unknown field `bogus`") || log.contains("bogus"),
        "{log}"
    );
    let status = rls.terminate();
    assert!(status.success(), "{status:?}");
}
