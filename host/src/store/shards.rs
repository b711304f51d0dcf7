//! Logical shards (SPEC section 10): the keyspace is split into `S` shards, fixed when
//! the keyspace is created and recorded in `{prefix}:meta`. Every key of one shard
//! carries the same hash tag, so every script touches one Redis Cluster slot, and the
//! shards' tags are chosen so that their slots spread evenly over the 16,384 slots: a
//! cluster whose masters split the slots into equal ranges (as `redis-cli --cluster
//! create` does) gets an even share of shards on each master.
//!
//! What lives where:
//! - a Life with a `resource_id` in that resource's shard (the conflict guard and the
//!   resource's order stay one atomic script); any other Life by its `life_uuid`;
//! - a timer by its name; a queue, with all its tasks, by its name;
//! - a Life id whose shard is not its own (a client's `life_uuid` booked with a resource
//!   of another shard) leaves a pointer in its own shard, so that a Life is found in
//!   O(1) by id alone: its own shard, then the pointer.

/// Number of Redis Cluster slots.
const SLOTS: u32 = 16_384;

/// The CRC16 Redis Cluster hashes keys with (XMODEM: polynomial 0x1021, initial 0).
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for byte in data {
        crc ^= (*byte as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of a hash tag.
pub fn slot_of(tag: &str) -> u32 {
    crc16(tag.as_bytes()) as u32 % SLOTS
}

/// The cluster slot of a key, as Redis Cluster finds it: the part between the first `{`
/// and the next `}` when that part is not empty, else the whole key.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    (crc16(tagged.unwrap_or(key)) as u32 % SLOTS) as u16
}

/// The hash tag of shard `i` of `shards`: `s{i}` followed by the first suffix whose slot
/// falls in the `i`-th of `shards` equal slot ranges (so `s3.41`), or `s{i}` alone when
/// there are more shards than slots in a range can tell apart.
pub fn shard_tag(i: u32, shards: u32) -> String {
    let lo = (i as u64 * SLOTS as u64 / shards as u64) as u32;
    let hi = ((i as u64 + 1) * SLOTS as u64 / shards as u64) as u32;
    for n in 0..200_000u32 {
        let tag = format!("s{i}.{n}");
        let slot = slot_of(&tag);
        if slot >= lo && slot < hi {
            return tag;
        }
    }
    format!("s{i}")
}

/// FNV-1a, 64 bits: a stable hash for placing names on shards (it must never change,
/// or objects would be looked for in the wrong shard).
pub fn fnv1a(data: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in data {
        hash ^= *byte as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Where objects live: the shard of a Life's id, of a resource, a timer, a queue.
/// Each is FNV-1a of a kind word and the name, modulo the number of shards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub shards: u32,
}

impl Placement {
    fn place(&self, kind: &str, name: &str) -> u32 {
        let mut bytes = Vec::with_capacity(kind.len() + 1 + name.len());
        bytes.extend_from_slice(kind.as_bytes());
        bytes.push(b':');
        bytes.extend_from_slice(name.as_bytes());
        (fnv1a(&bytes) % self.shards as u64) as u32
    }
    /// The home shard of a Life id: where the Life is, or a pointer to where it is.
    pub fn home(&self, life_uuid: &str) -> u32 {
        self.place("life", life_uuid)
    }
    pub fn resource(&self, resource_id: &str) -> u32 {
        self.place("resource", resource_id)
    }
    /// The shard of a debounce key: its record and the Life it holds open.
    pub fn debounce(&self, key: &str) -> u32 {
        self.place("debounce", key)
    }
    /// The shard a Life is stored in: its resource's, else its home.
    pub fn life(&self, life_uuid: &str, resource_id: Option<&str>) -> u32 {
        match resource_id {
            Some(rid) => self.resource(rid),
            None => self.home(life_uuid),
        }
    }
    pub fn timer(&self, name: &str) -> u32 {
        self.place("timer", name)
    }
    pub fn queue(&self, name: &str) -> u32 {
        self.place("queue", name)
    }
    /// The shard of an `Idempotency-Key`'s record.
    pub fn idempotency(&self, key: &str) -> u32 {
        self.place("idem", key)
    }
}

/// The keys of one shard: every name under `{key_prefix}:{tag}:`, the tag in braces so
/// that Redis Cluster hashes only it.
#[derive(Debug, Clone)]
pub struct ShardKeys {
    pub index: u32,
    /// `{key_prefix}:{{tag}}:`, what the scripts receive as PREFIX.
    pub prefix: String,
}

impl ShardKeys {
    pub fn new(key_prefix: &str, index: u32, shards: u32) -> Self {
        ShardKeys {
            index,
            prefix: format!("{key_prefix}:{{{}}}:", shard_tag(index, shards)),
        }
    }
    /// The cluster slot of every key of this shard.
    pub fn slot(&self) -> u32 {
        let open = self.prefix.find('{').expect("tagged") + 1;
        let close = self.prefix[open..].find('}').expect("tagged") + open;
        slot_of(&self.prefix[open..close])
    }
    fn key(&self, rest: std::fmt::Arguments<'_>) -> String {
        format!("{}{rest}", self.prefix)
    }
    /// Any key of this shard.
    pub fn key_of(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }
    /// A Life's hash in layout 3 (read by `kairos migrate` only).
    pub fn life(&self, uuid: &str) -> String {
        self.key(format_args!("life:{uuid}"))
    }
    /// Record bucket `n`: a hash of Life records (`record/`), field = the Life's id.
    pub fn records(&self, n: u64) -> String {
        self.key(format_args!("r:{n}"))
    }
    /// How many record buckets there are (linear hashing: `record_key` in common.lua).
    pub fn record_count(&self) -> String {
        self.key(format_args!("rn"))
    }
    /// Each Life Plan claimed or running: `{claim}|{fire_ms}|{host}[|{started}|{attempt}]`.
    pub fn inflight(&self) -> String {
        self.key(format_args!("inflight"))
    }
    /// Lives whose record changed while one of their Plans ran.
    pub fn touched(&self) -> String {
        self.key(format_args!("touched"))
    }
    /// The record of a booking call made with this `Idempotency-Key`.
    pub fn idempotency(&self, key: &str) -> String {
        self.key(format_args!("idem:{key}"))
    }
    /// The hash of a timer's or a task's Plan (`{name}:timer`, `{queue}/{task}:task`). A
    /// Life's Plans have none: their fields are in the Life's hash ([`Self::plan_field`]).
    pub fn plan(&self, plan_id: &str) -> String {
        debug_assert!(
            plan_field_prefix(plan_id).is_none(),
            "a Life's Plan `{plan_id}` has no hash of its own"
        );
        self.key(format_args!("plan:{plan_id}"))
    }
    /// The key and field name of a field of any Plan: for a Life's Plan
    /// (`{uuid}:birth`, `{uuid}:death`) the Life's hash and `b.{field}` or `d.{field}`
    /// (`resource_id` is the Life's own), else the Plan's own hash (`plan_of` in
    /// scripts/common.lua).
    pub fn plan_field(&self, plan_id: &str, field: &str) -> (String, String) {
        match plan_field_prefix(plan_id) {
            Some((uuid, _)) if field == "resource_id" => (self.life(uuid), field.to_string()),
            Some((uuid, prefix)) => (self.life(uuid), format!("{prefix}{field}")),
            None => (self.key(format_args!("plan:{plan_id}")), field.to_string()),
        }
    }
    /// Pub/sub channel: a Plan of this shard became due within the look-ahead window.
    pub fn notify(&self) -> String {
        self.key(format_args!("notify"))
    }
    pub fn tombstone(&self, queue: &str, task: &str) -> String {
        self.key(format_args!("tombstone:{queue}/{task}"))
    }
    /// Lives' Plans waiting to be claimed: a tree (`tree_*` in common.lua) by fire time.
    pub fn due(&self) -> String {
        self.key(format_args!("due"))
    }
    /// Timers' Plans waiting to be claimed, by fire time (a sorted set).
    pub fn timers_due(&self) -> String {
        self.key(format_args!("timers_due"))
    }
    /// The mark the replica probe writes (store/replicas.rs).
    pub fn ack_mark(&self) -> String {
        self.key(format_args!("ack"))
    }

    pub fn due_tasks(&self) -> String {
        self.key(format_args!("due_tasks"))
    }
    /// Push tasks added and not yet claimed, each a record in a task bucket: a tree.
    pub fn task_due(&self) -> String {
        self.key(format_args!("task_due"))
    }
    /// Task bucket `n`: field `{queue}/{task}`, a pending push task's record.
    pub fn task_records(&self, n: u64) -> String {
        self.key(format_args!("t:{n}"))
    }
    /// How many task buckets there are (linear hashing, as `record_count`).
    pub fn task_record_count(&self) -> String {
        self.key(format_args!("tn"))
    }
    /// The shard's Lives by birth time: a tree.
    pub fn lives(&self) -> String {
        self.key(format_args!("lives"))
    }
    pub fn resource(&self, resource_id: &str) -> String {
        self.key(format_args!("resource:{resource_id}"))
    }
    pub fn order(&self, resource_id: &str) -> String {
        self.key(format_args!("order:{resource_id}"))
    }
    /// The timers' and tasks' Plans the shard's owner holds claimed (Preset or Running);
    /// Lives' are in [`Self::inflight`].
    pub fn held(&self) -> String {
        self.key(format_args!("held"))
    }
    /// Who works the shard: `host`, `gen` (bumped at each takeover), `until` (ms).
    pub fn owner(&self) -> String {
        self.key(format_args!("owner"))
    }
    pub fn runs(&self) -> String {
        self.key(format_args!("runs"))
    }
    /// Finished Lives by finish time: a tree.
    pub fn finished(&self) -> String {
        self.key(format_args!("finished"))
    }
    /// Lives that finished as a failure (`store::outcome`), score = finish ms.
    pub fn failed(&self) -> String {
        self.key(format_args!("failed"))
    }
    pub fn claim_seq(&self) -> String {
        self.key(format_args!("claim_seq"))
    }
    /// A debounce key's open window: the Life it holds and when that must fire at the
    /// latest (`max_wait` after the first booking).
    pub fn debounce(&self, key: &str) -> String {
        self.key(format_args!("debounce:{key}"))
    }
    /// Where a Life of this shard's id lives when it is not here (`{shard}`).
    pub fn pointer(&self, uuid: &str) -> String {
        self.key(format_args!("ptr:{uuid}"))
    }
    /// The Lives of this shard booked with plugin `name`.
    pub fn plugin_lives(&self, name: &str) -> String {
        self.key(format_args!("plugin-lives:{name}"))
    }
    pub fn timer(&self, name: &str) -> String {
        self.key(format_args!("timer:{name}"))
    }
    pub fn timer_plan(&self, name: &str) -> String {
        self.key(format_args!("plan:{name}:timer"))
    }
    pub fn timer_runs(&self, name: &str) -> String {
        self.key(format_args!("timer:{name}:runs"))
    }
    pub fn timers(&self) -> String {
        self.key(format_args!("timers"))
    }
    /// The shard's Lives per state (`census` in common.lua).
    pub fn census(&self) -> String {
        self.key(format_args!("census"))
    }
    pub fn queue(&self, name: &str) -> String {
        self.key(format_args!("queue:{name}"))
    }
    pub fn queue_tasks(&self, name: &str) -> String {
        self.key(format_args!("queue:{name}:tasks"))
    }
    pub fn queue_failed(&self, name: &str) -> String {
        self.key(format_args!("queue:{name}:failed"))
    }
    /// A pull queue's leases: task names, score = when the lease runs out.
    pub fn queue_leased(&self, name: &str) -> String {
        self.key(format_args!("queue:{name}:leased"))
    }
    pub fn queue_running(&self, name: &str) -> String {
        self.key(format_args!("queue:{name}:running"))
    }
    pub fn queue_waiting(&self, name: &str) -> String {
        self.key(format_args!("queue:{name}:waiting"))
    }
    pub fn queues(&self) -> String {
        self.key(format_args!("queues"))
    }
    pub fn task_plan(&self, queue: &str, task: &str) -> String {
        self.key(format_args!("plan:{queue}/{task}:task"))
    }
}

/// The Life and field prefix of a Life's Plan id (`{uuid}:birth` → `b.`, `{uuid}:death`
/// → `d.`); None for a timer's or a task's.
pub fn plan_field_prefix(plan_id: &str) -> Option<(&str, &'static str)> {
    let (uuid, kind) = plan_id.rsplit_once(':')?;
    match kind {
        "birth" => Some((uuid, "b.")),
        "death" => Some((uuid, "d.")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_is_redis_clusters() {
        // Redis Cluster specification: CRC16 of "123456789" is 0x31C3.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        // Known slots (CLUSTER KEYSLOT): "foo" 12182, "bar" 5061.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("bar"), 5061);
        // Hash tags, as the specification words them.
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{bar}.following"), 5061);
        assert_eq!(key_slot(b"x{bar}{zap}"), 5061);
        // `{}` is not a tag: the whole key is hashed.
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(key_slot(b"foo{{bar}}zap"), crc16(b"{bar") % 16384);
    }

    #[test]
    fn every_key_of_a_shard_is_in_its_slot() {
        let keys = ShardKeys::new("kairos", 3, 32);
        assert!(keys.prefix.starts_with("kairos:{s3."), "{}", keys.prefix);
        let tag = &keys.prefix["kairos:{".len()..keys.prefix.len() - 2];
        assert_eq!(keys.slot(), slot_of(tag));
        assert!((1536..2048).contains(&keys.slot()));
    }

    #[test]
    fn a_lifes_plan_fields_are_in_the_lifes_hash() {
        let k = ShardKeys::new("kairos", 3, 32);
        let life = k.life("6f69");
        assert_eq!(
            k.plan_field("6f69:birth", "state"),
            (life.clone(), "b.state".to_string())
        );
        assert_eq!(
            k.plan_field("6f69:death", "fire_at_ms"),
            (life.clone(), "d.fire_at_ms".to_string())
        );
        // A Plan's resource is its Life's.
        assert_eq!(
            k.plan_field("6f69:death", "resource_id"),
            (life, "resource_id".to_string())
        );
        // An id may hold colons; only the last part is the kind.
        assert_eq!(plan_field_prefix("a:b:birth"), Some(("a:b", "b.")));
        for other in ["nightly:timer", "mail/t1:task"] {
            assert_eq!(
                k.plan_field(other, "state"),
                (format!("{}plan:{other}", k.prefix), "state".to_string())
            );
        }
    }

    #[test]
    fn placement_is_stable_and_spreads() {
        let p = Placement { shards: 32 };
        // Fixed forever: a change would look for existing objects in the wrong shard.
        // FNV-1a 64 reference values.
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        let mut counts = [0u32; 32];
        for i in 0..32_000 {
            counts[p.home(&format!("{i:032x}")) as usize] += 1;
        }
        assert!(
            counts.iter().all(|&n| (800..1200).contains(&n)),
            "{counts:?}"
        );
        assert_eq!(p.life("x", Some("conn-1")), p.resource("conn-1"));
        assert_eq!(Placement { shards: 1 }.queue("mail"), 0);
    }

    #[test]
    fn shard_tags_spread_over_equal_slot_ranges() {
        for shards in [1u32, 3, 16, 32, 64, 1024] {
            for i in 0..shards {
                let slot = slot_of(&shard_tag(i, shards));
                let lo = i as u64 * 16_384 / shards as u64;
                let hi = (i as u64 + 1) * 16_384 / shards as u64;
                assert!(
                    (lo..hi).contains(&(slot as u64)),
                    "shard {i} of {shards}: slot {slot} not in {lo}..{hi}"
                );
            }
        }
        // Three masters with equal ranges get 10 or 11 of 32 shards each.
        let per_master = (0..32).fold([0; 3], |mut m, i| {
            m[(slot_of(&shard_tag(i, 32)) as usize * 3) / 16_384] += 1;
            m
        });
        assert!(
            per_master.iter().all(|n| (10..=11).contains(n)),
            "{per_master:?}"
        );
    }
}
