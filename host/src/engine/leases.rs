//! The shards a host owns and its leases on them, as the host sees them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// A shard this host owns.
#[derive(Debug, Clone)]
pub(crate) struct Owned {
    /// The lease's generation: claims and starts go under it.
    pub gen: u64,
    /// Being given up: no new claims or starts.
    pub draining: bool,
    /// The lease as this host sees it.
    pub lease: Arc<LeaseWatch>,
}

/// Until when this host's lease on a shard holds, by this host's clock (ms), and how many
/// times it has lapsed (renewed only after it had run out). A process frozen (SIGSTOP, a
/// paused VM) past its lease, then resumed, finds it lapsed even if the heartbeat renews
/// it first: another host may have taken its Plans over meanwhile. Each shard has its
/// own: a master that cannot be reached lapses the leases of its shards only, and the
/// runs of the other shards go on.
#[derive(Debug)]
pub(crate) struct LeaseWatch {
    until_ms: AtomicI64,
    lapses: AtomicU64,
}

impl LeaseWatch {
    pub(crate) fn new(until_ms: i64) -> Self {
        LeaseWatch {
            until_ms: AtomicI64::new(until_ms),
            lapses: AtomicU64::new(0),
        }
    }

    pub(crate) fn renewed(&self, renewed_at_ms: i64, until_ms: i64) {
        if renewed_at_ms > self.until_ms.load(Ordering::Acquire) {
            self.lapses.fetch_add(1, Ordering::AcqRel);
        }
        self.until_ms.fetch_max(until_ms, Ordering::AcqRel);
    }

    pub(crate) fn until_ms(&self) -> i64 {
        self.until_ms.load(Ordering::Acquire)
    }
}

/// A shard's lease as a run started under it: the run is not called once that lease has
/// lapsed, even if renewed since.
#[derive(Debug, Clone)]
pub(crate) struct LeaseToken {
    lease: Arc<LeaseWatch>,
    lapses: u64,
}

impl LeaseToken {
    pub(crate) fn new(lease: Arc<LeaseWatch>) -> Self {
        let lapses = lease.lapses.load(Ordering::Acquire);
        LeaseToken { lease, lapses }
    }

    /// The lease has not lapsed since the token was taken and holds at `now_ms`.
    pub(crate) fn intact(&self, now_ms: i64) -> bool {
        self.lease.lapses.load(Ordering::Acquire) == self.lapses && now_ms < self.lease.until_ms()
    }
}

/// The shards this host owns.
#[derive(Default)]
pub(crate) struct ShardTable {
    owned: Mutex<HashMap<u32, Owned>>,
}

impl ShardTable {
    /// The generation to claim and start under, for a shard owned and not draining.
    pub(crate) fn active_gen(&self, shard: u32) -> Option<u64> {
        self.owned
            .lock()
            .expect("shard table lock")
            .get(&shard)
            .filter(|o| !o.draining)
            .map(|o| o.gen)
    }

    /// Shards owned and not draining, in order.
    pub(crate) fn active(&self) -> Vec<(u32, u64)> {
        let owned = self.owned.lock().expect("shard table lock");
        let mut out: Vec<(u32, u64)> = owned
            .iter()
            .filter(|(_, o)| !o.draining)
            .map(|(s, o)| (*s, o.gen))
            .collect();
        out.sort();
        out
    }

    /// Every shard owned, draining or not.
    pub(crate) fn all(&self) -> Vec<(u32, Owned)> {
        let owned = self.owned.lock().expect("shard table lock");
        let mut out: Vec<(u32, Owned)> = owned.iter().map(|(s, o)| (*s, o.clone())).collect();
        out.sort_by_key(|(s, _)| *s);
        out
    }

    /// A shard's lease, while it is owned.
    pub(crate) fn lease(&self, shard: u32) -> Option<Arc<LeaseWatch>> {
        self.owned
            .lock()
            .expect("shard table lock")
            .get(&shard)
            .map(|o| o.lease.clone())
    }

    pub(crate) fn insert(&self, shard: u32, gen: u64, lease_until_ms: i64) {
        self.owned.lock().expect("shard table lock").insert(
            shard,
            Owned {
                gen,
                draining: false,
                lease: Arc::new(LeaseWatch::new(lease_until_ms)),
            },
        );
    }

    pub(crate) fn drain(&self, shard: u32) {
        if let Some(o) = self.owned.lock().expect("shard table lock").get_mut(&shard) {
            o.draining = true;
        }
    }

    pub(crate) fn remove(&self, shard: u32) -> Option<Owned> {
        self.owned.lock().expect("shard table lock").remove(&shard)
    }

    pub(crate) fn len(&self) -> usize {
        self.owned.lock().expect("shard table lock").len()
    }
}
