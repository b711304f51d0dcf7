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
        let sweep_every =
            (self.config.history_retention / 4).clamp(Duration::from_secs(1), SWEEP_EVERY_MAX);
        let mut last_sweep = tokio::time::Instant::now() - sweep_every;
        loop {
            self.reclaim_expired().await;
            self.audit_held().await;
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
                        self.metrics
                            .plans_reclaimed
                            .fetch_add(moved.max(0) as u64, std::sync::atomic::Ordering::Relaxed);
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

    /// Hands back Plans this host holds in Redis that are long past due and not running
    /// here: their claim or start reply was lost, or their outcome could not be recorded,
    /// so nothing in memory would ever fire or finish them, and a live host's lease never
    /// expires. "Long" is twice the lease plus the request timeout, beyond any delay a
    /// held Plan meets in a healthy host; a stale timer entry of a Plan handed back fails
    /// its fence at start, and a Running Plan moves only if it started before that cutoff
    /// (a run that began after the in-flight set was read stays), so this never runs a
    /// Plan twice at once.
    async fn audit_held(&self) {
        let now_ms = self.clock.now_ms();
        let cutoff = now_ms - 2 * self.lease_ms() - self.config.request_timeout.as_millis() as i64;
        let stale = match self
            .store
            .held_due_before(&self.host_id, cutoff, 1000)
            .await
        {
            Ok(ids) => ids,
            Err(e) => {
                tracing::warn!(error = %e, "cannot audit held Plans");
                return;
            }
        };
        let orphans: Vec<String> = {
            let in_flight = self.in_flight.lock().expect("in-flight lock");
            stale
                .into_iter()
                .filter(|id| !in_flight.contains(id))
                .collect()
        };
        if orphans.is_empty() {
            return;
        }
        match self
            .store
            .release(&self.host_id, &orphans, self.notify_before_ms(), cutoff)
            .await
        {
            Ok(moved) => tracing::warn!(
                plans = moved,
                "handed back held Plans long past due that this host no longer tracked"
            ),
            Err(e) => tracing::warn!(error = %e, "cannot hand back orphaned Plans"),
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
