//! Certificates for a TLS-only `redis-server`, made with `openssl`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// A private CA and a leaf certificate it signs (rustls rejects a CA used
/// as the end entity) for `IP:127.0.0.1`, good for server and client auth;
/// the directory goes on drop.
#[derive(Debug)]
pub(crate) struct Certificates {
    dir: PathBuf,
}

impl Certificates {
    pub(crate) fn make() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "krl-tls-{}-{}",
            std::process::id(),
            crate::free_port()
        ));
        std::fs::create_dir_all(&dir).expect("create the certificate directory");
        std::fs::write(
            dir.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .expect("write ext.cnf");
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
        let new_key = ["-newkey", "rsa:2048", "-nodes"];
        let ca = ["req", "-x509", "-days", "1", "-subj", "/CN=krl-test-ca"];
        openssl(&[&ca[..], &new_key, &["-keyout", "ca.key", "-out", "ca.pem"]].concat());
        let leaf = [
            "req",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "key.pem",
            "-out",
            "req.csr",
        ];
        openssl(&[&leaf[..], &new_key].concat());
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
        Self { dir }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// `redis-server` arguments: these certificates, client certificates required.
    pub(crate) fn server_args(&self) -> Vec<String> {
        let file = |n: &str| self.dir.join(n).to_string_lossy().into_owned();
        [
            "--tls-cert-file".into(),
            file("cert.pem"),
            "--tls-key-file".into(),
            file("key.pem"),
            "--tls-ca-cert-file".into(),
            file("ca.pem"),
            "--tls-auth-clients".into(),
            "yes".into(),
        ]
        .into()
    }
}

impl Drop for Certificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
