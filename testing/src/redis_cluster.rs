//! A private 3-master Redis Cluster on free ports, torn down on drop.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::redis_server::{FREE_PORT, RedisServer, free_port};

pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
    dir: PathBuf,
}

impl RedisCluster {
    /// Starts 3 cluster-enabled servers and joins them with `redis-cli --cluster create`.
    pub fn start() -> Self {
        Self::start_with_replicas(0)
    }

    /// 3 masters with `replicas` replicas each; nodes `0..3` are the masters.
    pub fn start_with_replicas(replicas: usize) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "krl-cluster-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|i| {
                let conf = dir.join(format!("nodes-{i}.conf"));
                // An explicit bus port: the default (port + 10000) may not
                // be free. A fresh one per try: another test's server may
                // take it between `free_port` and the bind.
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    conf.to_str().unwrap(),
                    "--cluster-port",
                    FREE_PORT,
                    "--dir",
                    dir.to_str().unwrap(),
                    // Fail over within about a second of a master dying.
                    "--cluster-node-timeout",
                    "1000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli must be installed");
        assert!(
            out.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self { nodes, dir };
        cluster.wait_ok();
        cluster.wait_replicas(replicas);
        cluster
    }

    /// Waits until every master's replicas are online, so writes can reach them.
    fn wait_replicas(&self, replicas: usize) {
        if replicas == 0 {
            return;
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        for n in &self.nodes {
            let mut c = n.connection().unwrap();
            loop {
                let info: String = redis::cmd("INFO").arg("replication").query(&mut c).unwrap();
                if info.contains("role:slave") {
                    break;
                }
                let online = info
                    .lines()
                    .filter(|l| l.starts_with("slave") && l.contains("state=online"))
                    .count();
                if online == replicas {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "replicas never came online: {info}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The index of a node that is a master.
    pub fn a_master(&self) -> usize {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].is_running())
            .find(|i| {
                let mut c = self.nodes[*i].connection().unwrap();
                let info: String = redis::cmd("INFO").arg("replication").query(&mut c).unwrap();
                info.contains("role:master")
            })
            .expect("a master")
    }

    /// The URLs of the running nodes but `dead`.
    pub fn urls_but(&self, dead: usize) -> Vec<String> {
        self.nodes
            .iter()
            .enumerate()
            .filter(|(i, n)| *i != dead && n.is_running())
            .map(|(_, n)| n.url())
            .collect()
    }

    /// Whether three of the nodes at `urls` are masters and the cluster is
    /// ok on each: a killed master's replica has taken over. Blocking.
    pub fn promoted(urls: &[String]) -> bool {
        let query = |url: &String, cmd: &str, arg: &str| -> String {
            redis::Client::open(url.as_str())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)))
                .and_then(|mut c| redis::cmd(cmd).arg(arg).query(&mut c))
                .unwrap_or_default()
        };
        let masters = urls
            .iter()
            .filter(|u| query(u, "INFO", "replication").contains("role:master"))
            .count();
        masters == 3
            && urls
                .iter()
                .all(|u| query(u, "CLUSTER", "INFO").contains("cluster_state:ok"))
    }

    pub fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in self.nodes.iter().filter(|n| n.is_running()) {
            loop {
                let mut c = n.connection().unwrap();
                let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut c).unwrap();
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(Instant::now() < deadline, "cluster never became ok: {info}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// `CLUSTER MYID` of node `i`.
    pub fn node_id(&self, i: usize) -> String {
        let mut c = self.nodes[i].connection().unwrap();
        redis::cmd("CLUSTER").arg("MYID").query(&mut c).unwrap()
    }

    /// Moves `slots` slots from node `from` to node `to`, keys included.
    pub fn reshard(&self, from: usize, to: usize, slots: u32) {
        let out = Command::new("redis-cli")
            .args([
                "--cluster",
                "reshard",
                &format!("127.0.0.1:{}", self.nodes[0].port()),
            ])
            .args(["--cluster-from", &self.node_id(from)])
            .args(["--cluster-to", &self.node_id(to)])
            .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "reshard: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        self.wait_ok();
    }

    /// Every key on every node, with the index of the node that holds it.
    pub fn keys(&self) -> Vec<(usize, Vec<u8>)> {
        self.nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.keys("*").into_iter().map(move |k| (i, k)))
            .collect()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        self.nodes.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
