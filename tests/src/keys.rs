//! Names of kairos's Redis keys, for tests that look inside. The keyspace is split into
//! shards, each under a hash tag of its own (`kairos::store::shards`); a test asks where
//! a Life, timer or queue lives, or adds a key up over every shard.

use kairos::store::{Placement, ShardKeys};

/// The shards of a keyspace under the prefix `kairos`.
pub struct Keyspace {
    pub placement: Placement,
    shards: Vec<ShardKeys>,
}

impl Keyspace {
    pub fn new(shards: u32) -> Keyspace {
        Keyspace {
            placement: Placement { shards },
            shards: (0..shards)
                .map(|i| ShardKeys::new("kairos", i, shards))
                .collect(),
        }
    }

    pub fn shard(&self, i: u32) -> &ShardKeys {
        &self.shards[i as usize]
    }

    pub fn shards(&self) -> &[ShardKeys] {
        &self.shards
    }

    /// The shard of a Life booked with id `uuid` and no resource.
    pub fn life(&self, uuid: &str) -> &ShardKeys {
        self.shard(self.placement.home(uuid))
    }

    /// The shard of a Life booked with `resource_id`.
    pub fn resource(&self, resource_id: &str) -> &ShardKeys {
        self.shard(self.placement.resource(resource_id))
    }

    pub fn timer(&self, name: &str) -> &ShardKeys {
        self.shard(self.placement.timer(name))
    }

    pub fn queue(&self, name: &str) -> &ShardKeys {
        self.shard(self.placement.queue(name))
    }

    /// `rest` (such as `due`) in every shard.
    pub fn every(&self, rest: &str) -> Vec<String> {
        self.shards
            .iter()
            .map(|k| format!("{}{rest}", k.prefix))
            .collect()
    }
}
