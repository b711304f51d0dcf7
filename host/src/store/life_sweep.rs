//! Finished Lives kept as history (layout 4): how many and how large, and the sweep that
//! deletes the oldest past `--keep-finished` or the retention, with their pointers.

use super::Store;

impl Store {
    /// Deletes up to `batch` Lives of a shard finished before `cutoff_ms`, with their
    /// pointers in other shards; returns how many.
    pub async fn sweep(&self, shard: u32, cutoff_ms: i64, batch: usize) -> redis::RedisResult<i64> {
        let k = self.shard(shard);
        let swept: Vec<String> = self
            .scripts
            .sweep
            .key(k.finished())
            .key(k.lives())
            .key(k.runs())
            .arg(&k.prefix)
            .arg(cutoff_ms)
            .arg(batch)
            .invoke_async(&mut self.conn())
            .await?;
        for uuid in &swept {
            let home = self.placement.home(uuid);
            if home != shard {
                if let Err(e) = self.unpoint(home, uuid, &format!("{shard}:")).await {
                    tracing::debug!(life = %uuid, error = %e, "cannot remove a swept Life's pointer");
                }
            }
        }
        Ok(swept.len() as i64)
    }

    /// How many finished Lives a shard keeps and an estimate of the bytes of Redis they
    /// take (`scripts/history_size.lua`, from a sample of `sample` of them).
    pub async fn history_size(&self, shard: u32, sample: usize) -> redis::RedisResult<(u64, u64)> {
        let k = self.shard(shard);
        self.scripts
            .history_size
            .key(k.finished())
            .arg(&k.prefix)
            .arg(sample)
            .invoke_async(&mut self.conn())
            .await
    }

    /// When a shard keeps more than `keep` finished Lives: how many of the oldest to
    /// delete (at most `batch`) and the finish time of the last of them, the cutoff to
    /// `sweep` them with (`scripts/finished_excess.lua`).
    pub async fn history_excess(
        &self,
        shard: u32,
        keep: u64,
        batch: usize,
    ) -> redis::RedisResult<Option<(i64, usize)>> {
        let k = self.shard(shard);
        let (excess, cutoff): (i64, i64) = self
            .scripts
            .finished_excess
            .key(k.finished())
            .arg(&k.prefix)
            .arg(keep)
            .arg(batch)
            .invoke_async(&mut self.conn())
            .await?;
        Ok((excess > 0).then_some((cutoff, excess as usize)))
    }
}
