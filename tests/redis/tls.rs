//! `rediss://` against a real TLS-only `redis-server`, with a certificate
//! the test makes with `openssl`.

use keyed_rate_limit::{Algorithm, Key, Quota};
use keyed_rate_limit::{
    RedisBackend,
    backend::redis::{ConnectionMode, RedisBackendError},
};
use keyed_rate_limit_testing::RedisServer;

#[tokio::test]
async fn mutual_tls_with_a_private_ca() {
    let server = RedisServer::start_tls();
    let url = server.url();
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
    let server = RedisServer::start_tls();
    let url = server.url();
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
    let by_name = format!("rediss://:hunter2@localhost:{}", server.port());
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
