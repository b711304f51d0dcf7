//! What a host holds in memory: the Plans it tracks (for the audit and for giving a
//! shard up) and the fired Plans waiting for a worker.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use crate::store::{Claimed, Owner};

/// What this host holds in memory, by (Plan id, claim): two entries of one Plan exist
/// only when a run of an earlier claim is still going after the lease was lost and the
/// Plan was claimed again.
#[derive(Default)]
pub(crate) struct Tracked {
    pub(crate) plans: HashMap<(String, String), TrackedPlan>,
    pub(crate) tasks: usize,
    /// Lives' Plans tracked, per shard: what the audit compares with the shard's
    /// `inflight` entries before it reads them.
    pub(crate) lives: HashMap<u32, usize>,
}

pub(crate) struct TrackedPlan {
    pub(crate) task: bool,
    pub(crate) life: bool,
    pub(crate) shard: u32,
    /// Its start_run is on its way to Redis, or it started (its action may be under
    /// way): a shard is given up only once none of its Plans is busy. A start counts
    /// too, because start_run may mark the Plan Running in Redis just before a drain
    /// hands the shard's held Plans back (the next owner would run it beside this host).
    pub(crate) busy: bool,
}

/// A tracked Plan's key: (Plan id, claim number).
fn tracked_key(plan: &Claimed) -> (String, String) {
    (plan.plan_id.clone(), plan.claim.clone())
}

impl Tracked {
    pub(crate) fn track(&mut self, plan: &Claimed) {
        let owner = plan.owner();
        let task = matches!(owner, Some(Owner::Task { .. }));
        let life = matches!(owner, Some(Owner::Life(..)));
        let previous = self.plans.insert(
            tracked_key(plan),
            TrackedPlan {
                task,
                life,
                shard: plan.shard,
                busy: false,
            },
        );
        if previous.is_none() {
            self.count(task, life, plan.shard, 1);
        }
    }

    /// Adds `n` (1 or -1) to the counts of a Plan's kind.
    pub(crate) fn count(&mut self, task: bool, life: bool, shard: u32, n: isize) {
        if task {
            self.tasks = self.tasks.saturating_add_signed(n);
        }
        if life {
            let c = self.lives.entry(shard).or_default();
            *c = c.saturating_add_signed(n);
        }
    }

    pub(crate) fn forget(&mut self, plan: &Claimed) {
        if let Some(gone) = self.plans.remove(&tracked_key(plan)) {
            self.count(gone.task, gone.life, gone.shard, -1);
        }
    }

    /// Marks a Plan busy or not; false when it is not tracked.
    pub(crate) fn set_busy(&mut self, plan: &Claimed, busy: bool) -> bool {
        match self.plans.get_mut(&tracked_key(plan)) {
            Some(p) => {
                p.busy = busy;
                true
            }
            None => false,
        }
    }

    pub(crate) fn busy_in(&self, shard: u32) -> usize {
        self.plans
            .values()
            .filter(|p| p.shard == shard && p.busy)
            .count()
    }

    /// Lets go of a shard's Plans that are not busy; how many went.
    pub(crate) fn let_go_of_shard(&mut self, shard: u32) -> usize {
        let before = self.plans.len();
        let (mut tasks_gone, mut lives_gone) = (0, 0);
        self.plans.retain(|_, p| {
            let keep = p.shard != shard || p.busy;
            if !keep && p.task {
                tasks_gone += 1;
            }
            if !keep && p.life {
                lives_gone += 1;
            }
            keep
        });
        self.tasks -= tasks_gone;
        if let Some(c) = self.lives.get_mut(&shard) {
            *c = c.saturating_sub(lives_gone);
        }
        before - self.plans.len()
    }
}

/// Fired Plans waiting for a worker, best first: priority rank (1 first), then fire time,
/// then arrival.
#[derive(Default)]
pub(crate) struct WaitingRuns {
    heap: BinaryHeap<(Reverse<WaitKey>, WaitingRun)>,
    arrivals: u64,
}

/// (priority rank, fire time ms, arrival number).
type WaitKey = (u8, i64, u64);

/// A Plan in `WaitingRuns`; the key alone orders the heap.
struct WaitingRun(Claimed);

impl PartialEq for WaitingRun {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for WaitingRun {}
impl PartialOrd for WaitingRun {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for WaitingRun {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl WaitingRuns {
    pub(crate) fn push(&mut self, plan: Claimed) {
        self.arrivals += 1;
        let key = (plan.opts.rank(), plan.fire_at_ms, self.arrivals);
        self.heap.push((Reverse(key), WaitingRun(plan)));
    }
    pub(crate) fn pop(&mut self) -> Option<Claimed> {
        self.heap.pop().map(|(_, run)| run.0)
    }
    pub(crate) fn len(&self) -> usize {
        self.heap.len()
    }
    pub(crate) fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::RunOpts;

    fn plan(id: &str, fire_at_ms: i64, priority: Option<u8>) -> Claimed {
        Claimed {
            plan_id: id.into(),
            shard: 0,
            fire_at_ms,
            claim: "1".into(),
            action: String::new(),
            attempts: 0,
            resource_id: None,
            opts: RunOpts {
                priority,
                ..RunOpts::default()
            },
            record: None,
        }
    }

    #[test]
    fn a_drain_waits_for_a_start_under_way_and_the_plans_it_let_go_of_never_start() {
        let mut t = Tracked::default();
        let (starting, waiting) = (plan("a:birth", 100, None), plan("b:birth", 100, None));
        t.track(&starting);
        t.track(&waiting);
        // `starting`'s start_run is on its way to Redis when the shard is drained.
        assert!(t.set_busy(&starting, true));
        assert_eq!(t.let_go_of_shard(0), 1, "only the Plan not starting goes");
        assert_eq!(
            t.busy_in(0),
            1,
            "the shard is not handed back while a start may mark a Plan Running"
        );
        assert!(
            !t.set_busy(&waiting, true),
            "a Plan let go of does not start here: the next owner has it"
        );
        // Its start was put off (resource busy): the drain need not wait for it.
        assert!(t.set_busy(&starting, false));
        assert_eq!(t.busy_in(0), 0);
        assert_eq!(t.let_go_of_shard(0), 1);
        assert!(t.plans.is_empty());
    }

    #[test]
    fn waiting_runs_go_by_priority_then_fire_time_then_arrival() {
        let mut w = WaitingRuns::default();
        w.push(plan("low:timer", 100, Some(4)));
        w.push(plan("life-late:birth", 300, None));
        w.push(plan("high:timer", 500, Some(1)));
        w.push(plan("life-early:birth", 200, None));
        w.push(plan("same-time-second:birth", 200, None));
        let order: Vec<String> = std::iter::from_fn(|| w.pop()).map(|p| p.plan_id).collect();
        assert_eq!(
            order,
            [
                "high:timer",
                "life-early:birth",
                "same-time-second:birth",
                "life-late:birth",
                "low:timer"
            ]
        );
        assert!(w.is_empty());
    }
}
