//! What the store-level tests share: a redis-server of the test's own on a free port,
//! and a webhook action.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kairos::model::{Action, WebhookAction};
use kairos::store::{Claimed, FinishedRun, OpenError, RunOutcome, RunRecord, Store};

/// A redis-server of this test's own on a free port, removed on drop.
pub struct Redis {
    child: Child,
    pub port: u16,
    dir: PathBuf,
}

impl Redis {
    pub fn start() -> Redis {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir =
            std::env::temp_dir().join(format!("kairos-store-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed (apt-get install -y redis-server)");
        let deadline = Instant::now() + Duration::from_secs(10);
        while redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .and_then(|c| c.get_connection())
            .is_err()
        {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Redis { child, port, dir }
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        redis::Client::open(self.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap()
    }

    /// A store on this server with `shards` (None: the keyspace's own, or the default).
    pub async fn store_with(&self, shards: Option<u32>) -> Result<Store, OpenError> {
        Store::connect(&self.url(), "kairos", chrono_tz::UTC, shards).await
    }

    /// A store on a keyspace of one shard.
    pub async fn store(&self) -> Store {
        self.store_with(Some(1)).await.unwrap()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

pub fn hook() -> Action {
    Action::Webhook(WebhookAction {
        path: Some("/hook".into()),
        url: None,
        method: "POST".into(),
        headers: BTreeMap::new(),
        body: None,
        connect_timeout_ms: None,
        request_timeout_ms: None,
        retry_count: 0,
        retry_interval_ms: 1000,
        callbacks: Default::default(),
    })
}

/// A run of `plan` that succeeded (200) at its `attempt`.
pub fn done(plan: &Claimed, attempt: u32) -> FinishedRun {
    FinishedRun {
        plan: plan.clone(),
        outcome: RunOutcome::Done,
        record: RunRecord {
            should_run_at_ms: plan.fire_at_ms,
            started_at_ms: now_ms(),
            duration_ms: 5,
            outcome: "success",
            status: Some(200),
            error: None,
            attempt,
            output: None,
            logs: Vec::new(),
            retry_after_ms: None,
        },
        callback: None,
    }
}
