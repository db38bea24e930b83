//! A private `redis-server` per test, on a free port; never the shared 6379.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::tls::Certificates;

/// An argument of [`RedisServer::start_with`] replaced by a free port.
pub const FREE_PORT: &str = "{free port}";

/// The server program: `REDIS_SERVER_BIN` (e.g. Valkey's `valkey-server`,
/// which CI runs the exactness and fault tests on too), else `redis-server`.
pub fn server_binary() -> std::ffi::OsString {
    std::env::var_os("REDIS_SERVER_BIN").unwrap_or_else(|| "redis-server".into())
}

/// A `redis-server` child process, killed on drop.
pub struct RedisServer {
    port: u16,
    extra: Vec<String>,
    password: Option<String>,
    tls: Option<std::sync::Arc<Certificates>>,
    /// A sentinel's configuration file (it rewrites it), removed on drop.
    conf: Option<std::path::PathBuf>,
    /// The server's working directory (`--dir`), its own and removed on
    /// drop: a replica's full sync writes `dump.rdb` there even with
    /// `--save ''`, and no test may write into the source tree.
    dir: std::path::PathBuf,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server with no persistence on a free port.
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments, e.g. `["--requirepass", "pw"]`.
    pub fn start_with(extra: &[&str]) -> Self {
        Self::launch(extra, None)
    }

    /// Starts a TLS-only server (no plain port) that requires client
    /// certificates, with a private CA and a leaf certificate for
    /// `127.0.0.1` made by `openssl`; see [`RedisServer::pem`].
    pub fn start_tls() -> Self {
        Self::launch(&[], Some(std::sync::Arc::new(Certificates::make())))
    }

    /// A TLS-only server with extra arguments that trusts and presents the
    /// certificates of `peer` (a TLS server): servers that talk to each
    /// other (a replica, a sentinel) share one CA.
    pub fn start_tls_like(peer: &RedisServer, extra: &[&str]) -> Self {
        Self::launch(extra, Some(peer.tls.clone().expect("a TLS peer")))
    }

    /// Starts a sentinel (`redis-server <file> --sentinel`) whose
    /// configuration file holds `conf` (`sentinel monitor …` lines), with
    /// its own password when `password` is given.
    pub fn start_sentinel(conf: &str, password: Option<&str>) -> Self {
        Self::sentinel(conf, password, None)
    }

    /// A TLS-only sentinel with `peer`'s certificates, reaching the servers
    /// it watches over TLS.
    pub fn start_sentinel_tls(conf: &str, peer: &RedisServer) -> Self {
        Self::sentinel(conf, None, Some(peer.tls.clone().expect("a TLS peer")))
    }

    fn sentinel(
        conf: &str,
        password: Option<&str>,
        tls: Option<std::sync::Arc<Certificates>>,
    ) -> Self {
        let port = free_port();
        let file =
            std::env::temp_dir().join(format!("krl-sentinel-{}-{port}.conf", std::process::id()));
        std::fs::write(&file, conf).expect("write the sentinel configuration");
        let mut extra = vec!["--sentinel".to_owned()];
        if let Some(pw) = password {
            extra.extend(["--requirepass".to_owned(), pw.to_owned()]);
        }
        if tls.is_some() {
            extra.extend(["--tls-replication".to_owned(), "yes".to_owned()]);
        }
        let mut server = Self {
            port,
            extra,
            password: password.map(str::to_owned),
            tls,
            conf: Some(file),
            dir: private_dir(),
            child: None,
        };
        server.spawn();
        server
    }

    fn launch(extra: &[&str], tls: Option<std::sync::Arc<Certificates>>) -> Self {
        let port = free_port();
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let password = extra
            .iter()
            .position(|a| a == "--requirepass")
            .and_then(|i| extra.get(i + 1).cloned());
        let mut server = Self {
            port,
            extra,
            password,
            tls,
            conf: None,
            dir: private_dir(),
            child: None,
        };
        server.spawn();
        server
    }

    /// Starts the process; when it exits at once (another socket took the
    /// free port between `free_port` and its bind), tries a fresh port,
    /// a few times. An extra argument [`FREE_PORT`] is a port too, fresh
    /// for each try (a cluster bus port), and kept once the server is up.
    /// `restart` keeps the ports: nothing else holds them then.
    fn spawn(&mut self) {
        let template = self.extra.clone();
        for attempt in 0..5 {
            if attempt > 0 {
                self.port = free_port();
            }
            assert_ne!(self.port, 6379, "never touch the shared redis");
            self.extra = template
                .iter()
                .map(|a| {
                    if a == FREE_PORT {
                        free_port().to_string()
                    } else {
                        a.clone()
                    }
                })
                .collect();
            let port = self.port.to_string();
            let listen = match &self.tls {
                None => vec!["--port".to_owned(), port],
                Some(certs) => {
                    let mut args = vec!["--port".into(), "0".into(), "--tls-port".into(), port];
                    args.extend(certs.server_args());
                    args
                }
            };
            let child = Command::new(server_binary())
                .args(&self.conf)
                .args(&listen)
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                // Before `extra`, which may name a directory of its own (a cluster's).
                .arg("--dir")
                .arg(&self.dir)
                .args(&self.extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server must be installed");
            self.child = Some(child);
            if self.wait_ready() {
                return;
            }
            self.kill();
        }
        panic!("redis-server did not start on five ports");
    }

    /// Waits for a PONG (a TLS server: an accepted TCP connection); false
    /// when the process exited first.
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        let pid = self.child.as_ref().map(Child::id);
        loop {
            // The answer must come from this child: another test's server
            // on the same port would answer while this one failed to bind.
            let ok = if self.tls.is_some() {
                std::net::TcpStream::connect(("127.0.0.1", self.port))
                    .map(drop)
                    .map_err(|e| e.to_string())
            } else {
                self.connection()
                    .and_then(|mut c| redis::cmd("INFO").arg("server").query::<String>(&mut c))
                    .map_err(|e| e.to_string())
                    .and_then(|info| {
                        let theirs = info
                            .lines()
                            .find_map(|l| l.strip_prefix("process_id:"))
                            .and_then(|p| p.trim().parse::<u32>().ok());
                        if theirs == pid {
                            Ok(())
                        } else {
                            Err(format!("port {} answered by pid {theirs:?}", self.port))
                        }
                    })
            };
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some());
            if exited {
                return false;
            }
            if ok.is_ok() {
                return true;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not start: {ok:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the process is up (not killed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://[:password@]127.0.0.1:port` (`rediss://` for a TLS server).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        match &self.password {
            Some(pw) => format!("{scheme}://:{pw}@127.0.0.1:{}", self.port),
            None => format!("{scheme}://127.0.0.1:{}", self.port),
        }
    }

    /// A PEM file of a TLS server: `ca.pem`, `cert.pem` or `key.pem` (the
    /// leaf certificate serves as the client's too).
    ///
    /// # Panics
    /// On a server started without TLS.
    pub fn pem(&self, name: &str) -> Vec<u8> {
        let certs = self.tls.as_ref().expect("a TLS server");
        std::fs::read(certs.dir().join(name)).expect("read a PEM file")
    }

    /// A fresh blocking connection, for test setup and assertions.
    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection_with_timeout(Duration::from_secs(1))
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = self.signal("-CONT");
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills and starts the server again on the same port: data and scripts are gone.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Stops the process (SIGSTOP): connections stay open but nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP").expect("kill -STOP");
    }

    /// Resumes a paused server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT").expect("kill -CONT");
    }

    fn signal(&self, sig: &str) -> std::io::Result<()> {
        let pid = self.child.as_ref().map(|c| c.id()).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::NotFound, "redis-server not running")
        })?;
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("kill {sig} failed")))
        }
    }

    /// `CONFIG SET key value`.
    pub fn set_config(&self, key: &str, value: &str) {
        let mut c = self.connection().expect("connect");
        redis::cmd("CONFIG")
            .arg("SET")
            .arg(key)
            .arg(value)
            .query::<()>(&mut c)
            .expect("CONFIG SET");
    }

    /// `SCRIPT FLUSH`: forgets every loaded script, as a restart does.
    pub fn flush_scripts(&self) {
        let mut c = self.connection().expect("connect");
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query::<()>(&mut c)
            .expect("SCRIPT FLUSH");
    }

    /// How many `EVALSHA` and `EVAL` calls the server has run (`INFO commandstats`).
    pub fn script_calls(&self) -> u64 {
        let mut c = self.connection().expect("connect");
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut c)
            .expect("INFO");
        info.lines()
            .filter(|l| l.starts_with("cmdstat_evalsha:") || l.starts_with("cmdstat_eval:"))
            .filter_map(|l| {
                l.split("calls=")
                    .nth(1)?
                    .split(',')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum()
    }

    /// The CPU time the server process has used, in seconds:
    /// `used_cpu_sys + used_cpu_user` of `INFO cpu` (all its threads). The
    /// sum, because the kernel splits one precise total into the two by
    /// sampling.
    pub fn cpu_seconds(&self) -> f64 {
        let mut c = self.connection().expect("connect");
        let info: String = redis::cmd("INFO").arg("cpu").query(&mut c).expect("INFO");
        info.lines()
            .filter_map(|l| {
                l.strip_prefix("used_cpu_sys:")
                    .or_else(|| l.strip_prefix("used_cpu_user:"))
            })
            .filter_map(|v| v.trim().parse::<f64>().ok())
            .sum()
    }

    /// The keys matching a pattern (binary-safe).
    pub fn keys(&self, pattern: &str) -> Vec<Vec<u8>> {
        let mut c = self.connection().expect("connect");
        redis::cmd("KEYS").arg(pattern).query(&mut c).expect("KEYS")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        if let Some(conf) = &self.conf {
            let _ = std::fs::remove_file(conf);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh, empty directory under the system's temp directory.
fn private_dir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("krl-redis-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a redis-server working directory");
    dir
}

/// Binds port 0 and releases it; the kernel does not hand it out again soon.
///
/// Never the same port twice in one process: the tests of one binary run
/// side by side, and two servers given one port would see each other.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener.local_addr().expect("local_addr").port();
        let mut given = GIVEN.lock().unwrap_or_else(PoisonError::into_inner);
        if given.insert(port) {
            return port;
        }
    }
}
