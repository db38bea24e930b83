//! `rediss://` against a real TLS-only `redis-server`, with a certificate
//! the test makes with `openssl`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use keyed_rate_limit::backend::redis::{ConnectionMode, RedisBackend, RedisBackendError};
use keyed_rate_limit::{Algorithm, Key, Quota};
use support::redis_server::free_port;

struct TlsRedis {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl TlsRedis {
    /// A TLS-only server (plain port 0) that requires client certificates.
    fn start() -> Self {
        let dir =
            std::env::temp_dir().join(format!("krl-tls-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).unwrap();
        // A private CA and a leaf certificate it signs (rustls rejects a CA
        // used as the end entity), good for server and client auth.
        std::fs::write(
            dir.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .unwrap();
        let openssl = |args: &[&str]| {
            let ok = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .expect("openssl must be installed");
            assert!(ok.success(), "openssl {args:?}");
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=krl-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "key.pem",
            "-out",
            "req.csr",
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            "req.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "ext.cnf",
            "-out",
            "cert.pem",
        ]);
        let port = free_port();
        let file = |n: &str| dir.join(n).to_str().unwrap().to_owned();
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .args([
                "--tls-cert-file",
                &file("cert.pem"),
                "--tls-key-file",
                &file("key.pem"),
            ])
            .args([
                "--tls-ca-cert-file",
                &file("ca.pem"),
                "--tls-auth-clients",
                "yes",
            ])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "TLS redis did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, port, dir }
    }

    fn pem(&self, name: &str) -> Vec<u8> {
        std::fs::read(Path::new(&self.dir).join(name)).unwrap()
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn mutual_tls_with_a_private_ca() {
    let server = TlsRedis::start();
    let url = format!("rediss://127.0.0.1:{}", server.port);
    let b = RedisBackend::builder(&url)
        .prefix("tls")
        .tls_root_cert(server.pem("ca.pem"))
        .tls_client_cert(server.pem("cert.pem"), server.pem("key.pem"))
        .build()
        .await
        .expect("TLS handshake with the private CA and client cert");
    let q = Quota::per_hour(2);
    let mut allowed = Vec::new();
    for _ in 0..3 {
        allowed.push(
            b.check("r", &Key::from("k"), Algorithm::Gcra, &q, 1)
                .await
                .unwrap()
                .is_allowed(),
        );
    }
    assert_eq!(allowed, [true, true, false]);
    // The builder's Debug must not leak the key.
    let dbg = format!(
        "{:?}",
        RedisBackend::builder(&url).tls_client_cert(b"c".to_vec(), b"SECRET".to_vec())
    );
    assert!(!dbg.contains("SECRET") && !dbg.contains("83, 69"), "{dbg}");
}

#[tokio::test]
async fn tls_is_refused_without_the_ca_or_the_client_cert() {
    let server = TlsRedis::start();
    let url = format!("rediss://127.0.0.1:{}", server.port);
    // The system store does not know the private CA.
    let unknown_ca = RedisBackend::builder(&url).build().await.unwrap_err();
    assert!(
        matches!(unknown_ca, RedisBackendError::TlsUnknownIssuer(_)),
        "{unknown_ca:?}"
    );
    assert!(
        unknown_ca.to_string().contains("unknown CA"),
        "{unknown_ca}"
    );
    // The certificate names 127.0.0.1, not localhost; the password never shows.
    let by_name = format!("rediss://:hunter2@localhost:{}", server.port);
    let mismatch = RedisBackend::builder(&by_name)
        .tls_root_cert(server.pem("ca.pem"))
        .tls_client_cert(server.pem("cert.pem"), server.pem("key.pem"))
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(mismatch, RedisBackendError::TlsNameMismatch(_)),
        "{mismatch:?}"
    );
    assert!(
        mismatch.to_string().contains("not valid for the host name"),
        "{mismatch}"
    );
    for shown in [mismatch.to_string(), format!("{mismatch:?}")] {
        assert!(!shown.contains("hunter2"), "{shown}");
    }
    // The server requires a client certificate.
    let no_client_cert = RedisBackend::builder(&url)
        .tls_root_cert(server.pem("ca.pem"))
        .build()
        .await;
    assert!(no_client_cert.is_err());
    // Custom certificates and the pool don't go together: a clear build error.
    let pool = RedisBackend::builder(&url)
        .tls_root_cert(server.pem("ca.pem"))
        .connection(ConnectionMode::Pool { max_size: 2 })
        .build()
        .await;
    assert!(
        pool.unwrap_err()
            .to_string()
            .contains("multiplexed or cluster")
    );
}
