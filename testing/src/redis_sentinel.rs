//! A private Redis Sentinel set-up: a master, a replica and three
//! sentinels with quorum 2, on free ports, torn down on drop.

use std::time::{Duration, Instant};

use crate::redis_server::RedisServer;

/// The name the sentinels monitor.
pub const MASTER_NAME: &str = "krl-master";

pub struct SentinelGroup {
    /// `servers[0]` starts as the master, `servers[1]` as its replica.
    pub servers: Vec<RedisServer>,
    pub sentinels: Vec<RedisServer>,
}

impl SentinelGroup {
    /// Starts the master, its replica (synced), and three sentinels that
    /// call a master down after 1 s of silence.
    pub fn start() -> Self {
        Self::start_with_auth(None)
    }

    /// [`start`](Self::start), with `(data, sentinel)` passwords: the
    /// master's and replica's (`requirepass`, `masterauth`), and the
    /// sentinels' own.
    pub fn start_with_auth(auth: Option<(&str, &str)>) -> Self {
        let data_auth: Vec<&str> = match auth {
            Some((pw, _)) => vec!["--requirepass", pw, "--masterauth", pw],
            None => Vec::new(),
        };
        let master = RedisServer::start_with(&data_auth);
        let port = master.port().to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &port];
        replica_args.extend(&data_auth);
        let replica = RedisServer::start_with(&replica_args);
        let mut conf = format!(
            "sentinel monitor {MASTER_NAME} 127.0.0.1 {port} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 3000\n\
             sentinel parallel-syncs {MASTER_NAME} 1\n"
        );
        if let Some((pw, sentinel_pw)) = auth {
            conf.push_str(&format!("sentinel auth-pass {MASTER_NAME} {pw}\n"));
            // The sentinels' own password, to talk to each other.
            conf.push_str(&format!("sentinel sentinel-pass {sentinel_pw}\n"));
        }
        let sentinel_pw = auth.map(|(_, s)| s);
        let sentinels = (0..3)
            .map(|_| RedisServer::start_sentinel(&conf, sentinel_pw))
            .collect();
        let group = Self {
            servers: vec![master, replica],
            sentinels,
        };
        group.wait_synced(Duration::from_secs(10));
        group.wait_sentinels_see_each_other(Duration::from_secs(10));
        group
    }

    /// A TLS-only master, replica and three sentinels sharing one CA; the
    /// sentinels reach the servers over TLS. Not waited on beyond each
    /// process's start: this crate's client speaks no TLS. See
    /// [`RedisServer::pem`] for the certificates.
    pub fn start_tls() -> Self {
        let master = RedisServer::start_tls();
        let port = master.port().to_string();
        let replica = RedisServer::start_tls_like(
            &master,
            &[
                "--replicaof",
                "127.0.0.1",
                &port,
                "--tls-replication",
                "yes",
            ],
        );
        let conf = format!("sentinel monitor {MASTER_NAME} 127.0.0.1 {port} 2\n");
        let sentinels = (0..3)
            .map(|_| RedisServer::start_sentinel_tls(&conf, &master))
            .collect();
        Self {
            servers: vec![master, replica],
            sentinels,
        }
    }

    /// `redis://127.0.0.1:<port>` of each sentinel, down ones included.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The port the first running sentinel names as the master.
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels
            .iter()
            .filter(|s| s.is_running())
            .find_map(|s| {
                let mut c = s.connection().ok()?;
                let (_, port): (String, u16) = redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(MASTER_NAME)
                    .query(&mut c)
                    .ok()?;
                Some(port)
            })
    }

    /// The server on `port`.
    pub fn server(&mut self, port: u16) -> &mut RedisServer {
        self.servers
            .iter_mut()
            .find(|s| s.port() == port)
            .expect("one of the group's servers")
    }

    /// Waits until every running replica has the master's whole stream.
    pub fn wait_synced(&self, timeout: Duration) {
        let master = self.master_port().unwrap_or(self.servers[0].port());
        poll(
            timeout,
            "the replica's sync",
            Duration::from_millis(20),
            || {
                self.servers.iter().all(|s| {
                    !s.is_running() || s.port() == master || {
                        let info = info(s, "replication");
                        info.contains("master_link_status:up")
                            && offset(&info, "slave_repl_offset")
                                == offset(
                                    &info_of(&self.servers, master, "replication"),
                                    "master_repl_offset",
                                )
                    }
                })
            },
        );
    }

    /// Waits until each sentinel knows the two others (a failover needs a
    /// quorum that can agree).
    fn wait_sentinels_see_each_other(&self, timeout: Duration) {
        poll(
            timeout,
            "the sentinels to meet",
            Duration::from_millis(50),
            || {
                self.sentinels.iter().all(|s| {
                    s.connection()
                        .and_then(|mut c| {
                            redis::cmd("SENTINEL")
                                .arg("sentinels")
                                .arg(MASTER_NAME)
                                .query::<Vec<redis::Value>>(&mut c)
                        })
                        .is_ok_and(|others| others.len() >= 2)
                })
            },
        );
    }
}

/// Calls `done` every `every` until it is true; panics after `timeout`.
fn poll(timeout: Duration, what: &str, every: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !done() {
        assert!(Instant::now() < deadline, "no {what} within {timeout:?}");
        std::thread::sleep(every);
    }
}

fn info(s: &RedisServer, section: &str) -> String {
    s.connection()
        .and_then(|mut c| redis::cmd("INFO").arg(section).query::<String>(&mut c))
        .unwrap_or_default()
}

fn info_of(servers: &[RedisServer], port: u16, section: &str) -> String {
    servers
        .iter()
        .find(|s| s.port() == port && s.is_running())
        .map(|s| info(s, section))
        .unwrap_or_default()
}

fn offset(info: &str, field: &str) -> Option<u64> {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

/// `role:` of the server on `port`, from `INFO replication`.
pub fn role(servers: &[RedisServer], port: u16) -> Option<String> {
    info_of(servers, port, "replication")
        .lines()
        .find_map(|l| l.strip_prefix("role:"))
        .map(|r| r.trim().to_owned())
}
