//! The Supervisor role: keeps this host's lease alive, takes over the Plans of hosts whose
//! lease expired (crashed or hung), and sweeps finished Lives after retention.
//!
//! Every host runs it; the `reclaim` and `sweep` scripts are atomic, so two supervisors
//! acting on the same dead host at once move each Plan once.

use std::sync::Arc;
use std::time::Duration;

use crate::scheduler::{until_shutdown, Engine, ShutdownSignal};

/// Lives deleted by one sweep call.
const SWEEP_BATCH: usize = 500;
/// Longest pause between two sweeps of finished Lives; a short retention sweeps more
/// often (a quarter of it, at least every second).
const SWEEP_EVERY_MAX: Duration = Duration::from_secs(60);
/// Longest pause between two looks for expired leases.
const SUPERVISE_EVERY_MAX: Duration = Duration::from_secs(5);

impl Engine {
    /// Renews this host's lease every third of its length.
    pub(crate) async fn heartbeat(self: Arc<Self>, mut shutdown: ShutdownSignal) {
        let every = self.config.lease_ttl / 3;
        loop {
            let deadline = self.clock.now_ms() + self.lease_ms();
            if let Err(e) = self.store.heartbeat(&self.host_id, deadline).await {
                tracing::warn!(error = %e, "cannot renew this host's lease");
            }
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = until_shutdown(&mut shutdown) => return,
            }
        }
    }

    pub(crate) async fn supervisor(self: Arc<Self>, mut shutdown: ShutdownSignal) {
        let every = (self.config.lease_ttl / 3).min(SUPERVISE_EVERY_MAX);
        let sweep_every = (self.config.history_retention / 4).clamp(Duration::from_secs(1), SWEEP_EVERY_MAX);
        let mut last_sweep = tokio::time::Instant::now() - sweep_every;
        loop {
            self.reclaim_expired().await;
            if last_sweep.elapsed() >= sweep_every {
                last_sweep = tokio::time::Instant::now();
                self.sweep_finished().await;
            }
            tokio::select! {
                _ = tokio::time::sleep(every.min(sweep_every)) => {}
                _ = until_shutdown(&mut shutdown) => return,
            }
        }
    }

    async fn reclaim_expired(&self) {
        let now_ms = self.clock.now_ms();
        let hosts = match self.store.expired_hosts(now_ms).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(error = %e, "cannot look for expired leases");
                return;
            }
        };
        for host in hosts {
            if host == self.host_id {
                // Our own lease lapsed (Redis was away or we stalled): renew it rather
                // than take our own Plans away from ourselves.
                let _ = self
                    .store
                    .heartbeat(&self.host_id, now_ms + self.lease_ms())
                    .await;
                continue;
            }
            let mut total = 0;
            loop {
                match self
                    .store
                    .reclaim(&host, 1000, Some(now_ms), self.notify_before_ms())
                    .await
                {
                    Ok((moved, left)) => {
                        total += moved;
                        if left <= 0 {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(host = %host, error = %e, "cannot reclaim Plans of an expired host");
                        break;
                    }
                }
            }
            tracing::warn!(host = %host, plans = total, "host lease expired; its Plans are back in the due set");
        }
    }

    async fn sweep_finished(&self) {
        let cutoff = self.clock.now_ms() - self.config.history_retention.as_millis() as i64;
        loop {
            match self.store.sweep(cutoff, SWEEP_BATCH).await {
                Ok(n) if (n as usize) < SWEEP_BATCH => {
                    if n > 0 {
                        tracing::info!(lives = n, "swept finished Lives past retention");
                    }
                    return;
                }
                Ok(_) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "sweep failed");
                    return;
                }
            }
        }
    }
}
