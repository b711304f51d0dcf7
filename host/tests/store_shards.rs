//! The sharded keyspace at the store's boundary, against a real redis-server: where Lives
//! go, how a Life is found by id alone, ids unique across shards, listing merged from
//! every shard with exact cursors, and a keyspace that keeps its number of shards.

use kairos::model::NewLife;
use kairos::model::ScheduleType;
use kairos::store::{
    CancelOutcome, ClaimReply, Claimed, IdOrigin, ListFilter, OpenError, StartOutcome,
    StartSection, Store, Takeover,
};
use redis::AsyncCommands;

mod common;
use common::{done, hook, now_ms, Redis};

fn life(id: &str, resource: Option<&str>, at_ms: i64) -> NewLife {
    NewLife {
        life_uuid: id.into(),
        schedule_type: ScheduleType::Point,
        resource_id: resource.map(str::to_string),
        birth_at_ms: at_ms,
        death_at_ms: None,
        birth_action: hook(),
        death_action: None,
    }
}

const LATER: i64 = 3_600_000;

async fn book(store: &Store, l: &NewLife) -> Result<(), u16> {
    store
        .book(l, IdOrigin::Given, now_ms(), 1_000, now_ms())
        .await
        .map_err(|e| e.status.as_u16())
}

/// A resource whose shard is not the home shard of `id`.
fn resource_elsewhere(store: &Store, id: &str) -> String {
    let p = store.placement();
    (0..1000)
        .map(|i| format!("res-{i}"))
        .find(|r| p.resource(r) != p.home(id))
        .unwrap()
}

#[tokio::test]
async fn a_life_is_found_by_id_wherever_its_resource_put_it() {
    let redis = Redis::start();
    let store = redis.store_with(Some(8)).await.unwrap();
    let p = store.placement();
    let rid = resource_elsewhere(&store, "far");
    book(&store, &life("far", Some(&rid), now_ms() + LATER))
        .await
        .unwrap();
    // Stored in the resource's shard, with a pointer in the id's home shard.
    let mut conn = redis.conn().await;
    let in_resource = kairos::store::inspect::life(&mut conn, store.shard(p.resource(&rid)), "far")
        .await
        .unwrap();
    assert!(in_resource.is_some(), "no record in the resource's shard");
    let in_home = kairos::store::inspect::life(&mut conn, store.shard(p.home("far")), "far")
        .await
        .unwrap();
    assert!(in_home.is_none(), "a record in the home shard too");
    let pointer: String = conn
        .get(store.shard(p.home("far")).pointer("far"))
        .await
        .unwrap();
    assert!(
        pointer.starts_with(&format!("{}:", p.resource(&rid))),
        "{pointer}"
    );
    assert_eq!(store.locate("far").await.unwrap(), Some(p.resource(&rid)));
    let view = store.life_view("far", 10).await.unwrap().unwrap();
    assert_eq!(view["resource_id"], rid.as_str());
    let (current, version, _) = store.load_booking("far").await.unwrap().unwrap();
    let mut moved = current.clone();
    moved.birth_at_ms += 60_000;
    assert!(store
        .patch(&current, &version, &moved, now_ms(), 1_000, now_ms())
        .await
        .unwrap());
    // A resource of another shard would move the Life: refused, as the message says.
    let other = (0..1000)
        .map(|i| format!("other-{i}"))
        .find(|r| p.resource(r) != p.resource(&rid))
        .unwrap();
    let (current, version, _) = store.load_booking("far").await.unwrap().unwrap();
    let mut elsewhere = current.clone();
    elsewhere.resource_id = Some(other);
    let err = store
        .patch(&current, &version, &elsewhere, now_ms(), 1_000, now_ms())
        .await
        .unwrap_err();
    assert_eq!(
        (err.status.as_u16(), err.code),
        (409, "resource_shard_change")
    );
    assert_eq!(
        store
            .cancel("far", false, now_ms(), now_ms())
            .await
            .unwrap(),
        CancelOutcome::Done("Stillbirth".into())
    );
    assert_eq!(store.locate("nobody").await.unwrap(), None);
    assert!(store.life_view("nobody", 10).await.unwrap().is_none());
}

#[tokio::test]
async fn generated_ids_land_in_their_resources_shard() {
    let p = kairos::store::Placement { shards: 32 };
    for i in 0..50 {
        let rid = format!("conn-{i}");
        let id = kairos::bookings::request::new_life_uuid_for(p, Some(&rid));
        assert_eq!(id.len(), 32);
        assert_eq!(p.home(&id), p.resource(&rid), "{id} for {rid}");
    }
}

#[tokio::test]
async fn an_id_is_taken_once_across_every_shard() {
    let redis = Redis::start();
    let store = redis.store_with(Some(8)).await.unwrap();
    let p = store.placement();
    let rid = resource_elsewhere(&store, "dup");
    book(&store, &life("dup", Some(&rid), now_ms() + LATER))
        .await
        .unwrap();
    // Without a resource it would go to its home shard: the pointer there says taken.
    assert_eq!(
        book(&store, &life("dup", None, now_ms() + LATER)).await,
        Err(409)
    );
    // With a resource of a third shard: the pointer names another shard that has it.
    let third = (0..1000)
        .map(|i| format!("third-{i}"))
        .find(|r| p.resource(r) != p.resource(&rid) && p.resource(r) != p.home("dup"))
        .unwrap();
    assert_eq!(
        book(&store, &life("dup", Some(&third), now_ms() + LATER)).await,
        Err(409)
    );
    // A refused booking takes its own pointer back: the id stays free.
    book(&store, &life("blocker", Some(&third), now_ms() + LATER))
        .await
        .unwrap();
    let free = (0..1000)
        .map(|i| format!("free-{i}"))
        .find(|id| p.home(id) != p.resource(&third))
        .unwrap();
    let refused = book(&store, &life(&free, Some(&third), now_ms() + LATER)).await;
    assert_eq!(refused, Err(409), "the resource is booked at that time");
    let mut conn = redis.conn().await;
    let pointer: Option<String> = conn
        .get(store.shard(p.home(&free)).pointer(&free))
        .await
        .unwrap();
    assert_eq!(pointer, None, "the refused booking left its pointer");
    book(&store, &life(&free, None, now_ms() + LATER))
        .await
        .unwrap();
}

/// Books `l` as an id of `origin` and answers how many GETs Redis ran for it.
async fn gets_to_book(redis: &Redis, store: &Store, l: &NewLife, origin: IdOrigin) -> u64 {
    let mut conn = redis.conn().await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .unwrap();
    store
        .book(l, origin, now_ms(), 1_000, now_ms())
        .await
        .unwrap();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_get:calls="))
        .map(|rest| rest.split(',').next().unwrap().parse().unwrap())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_booking_looks_for_a_pointer_only_where_one_can_stand() {
    let redis = Redis::start();
    let store = redis.store_with(Some(8)).await.unwrap();
    let p = store.placement();
    let at = now_ms() + LATER;
    // Every booking call reads its shard's count of record buckets (`rn`) with a GET.
    // A named id in its home shard: a pointer there would say it is taken elsewhere.
    let named = life("named", None, at);
    assert_eq!(
        gets_to_book(&redis, &store, &named, IdOrigin::Given).await,
        1 + 1
    );
    // An id drawn for the booking: no other booking can have named it.
    let drawn = life("drawn", None, at);
    assert_eq!(
        gets_to_book(&redis, &store, &drawn, IdOrigin::Drawn).await,
        1
    );
    // A named id stored outside its home shard: pointers stand only in home shards. The
    // pointer's own script, in the home shard, reads the pointer there and that shard's
    // `rn` (two GETs) before it writes one.
    let rid = resource_elsewhere(&store, "away");
    assert_ne!(p.resource(&rid), p.home("away"));
    let away = life("away", Some(&rid), at);
    assert_eq!(
        gets_to_book(&redis, &store, &away, IdOrigin::Given).await,
        2 + 1
    );
    // And a named id is still refused where a pointer says it is taken.
    assert_eq!(book(&store, &life("away", None, at)).await, Err(409));
}

#[tokio::test]
async fn a_pointer_left_by_a_booking_cut_off_is_replaced_once_it_is_old() {
    let redis = Redis::start();
    let store = redis.store_with(Some(8)).await.unwrap();
    let p = store.placement();
    let mut conn = redis.conn().await;
    let home = p.home("orphan");
    let elsewhere = (home + 1) % 8;
    // A host died between the pointer and the Life: fresh, it may be a booking in flight.
    let _: () = conn
        .set(
            store.shard(home).pointer("orphan"),
            format!("{elsewhere}:{}", now_ms()),
        )
        .await
        .unwrap();
    assert_eq!(
        book(&store, &life("orphan", None, now_ms() + LATER)).await,
        Err(409)
    );
    // Two minutes old and naming a shard without the Life: left over, replaced.
    let _: () = conn
        .set(
            store.shard(home).pointer("orphan"),
            format!("{elsewhere}:{}", now_ms() - 120_000),
        )
        .await
        .unwrap();
    book(&store, &life("orphan", None, now_ms() + LATER))
        .await
        .unwrap();
    let pointer: Option<String> = conn.get(store.shard(home).pointer("orphan")).await.unwrap();
    assert_eq!(pointer, None);
    assert_eq!(store.locate("orphan").await.unwrap(), Some(home));
}

#[tokio::test]
async fn listing_merges_every_shard_in_one_order_with_exact_cursors() {
    let redis = Redis::start();
    let store = redis.store_with(Some(8)).await.unwrap();
    let base = now_ms() + LATER;
    let mut want = Vec::new();
    for i in 0..150i64 {
        // Times repeat, so that ids break ties; a third have a resource.
        let at = base + (i * 7919 % 50) * 1000;
        let id = format!("l{i:03}");
        let rid = (i % 3 == 0).then(|| format!("r{i}"));
        book(&store, &life(&id, rid.as_deref(), at)).await.unwrap();
        want.push((at, id));
    }
    want.sort();
    let want: Vec<String> = want.into_iter().map(|(_, id)| id).collect();
    let mut got = Vec::new();
    let mut cursor = None;
    for _ in 0..100 {
        let kairos::store::Page {
            items: page,
            next_cursor: next,
            ..
        } = store
            .list(&ListFilter {
                limit: 7,
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        got.extend(
            page.iter()
                .map(|l| l["life_uuid"].as_str().unwrap().to_string()),
        );
        match next {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(got, want, "every Life once, in birth order");
    // A window and a state filter together.
    for i in 0..150 {
        if i % 5 == 0 {
            store
                .cancel(&format!("l{i:03}"), false, now_ms(), now_ms())
                .await
                .unwrap();
        }
    }
    let (from, to) = (base + 10_000, base + 30_000);
    let page = store
        .list(&ListFilter {
            state: Some("Stillbirth".into()),
            from_ms: Some(from),
            to_ms: Some(to),
            limit: 100,
            ..Default::default()
        })
        .await
        .unwrap()
        .items;
    let got: Vec<&str> = page
        .iter()
        .map(|l| l["life_uuid"].as_str().unwrap())
        .collect();
    let expected: Vec<&String> = want
        .iter()
        .filter(|id| {
            let i: i64 = id[1..].parse().unwrap();
            let at = base + (i * 7919 % 50) * 1000;
            i % 5 == 0 && (from..=to).contains(&at)
        })
        .collect();
    assert_eq!(got.len(), expected.len(), "{got:?}");
    assert!(got.iter().zip(&expected).all(|(g, e)| g == e));
}

#[tokio::test]
async fn a_keyspace_keeps_the_number_of_shards_it_was_created_with() {
    let redis = Redis::start();
    let created = redis.store_with(Some(8)).await.unwrap();
    assert_eq!(created.shard_count(), 8);
    assert_eq!(redis.store_with(None).await.unwrap().shard_count(), 8);
    match redis.store_with(Some(16)).await {
        Err(OpenError::Layout(why)) => assert!(why.contains("--shards 8"), "{why}"),
        other => panic!("another number of shards was accepted: {:?}", other.is_ok()),
    }
    // A keyspace of the layout before shards is not taken for an empty one.
    let old = Redis::start();
    let mut conn = old.conn().await;
    let _: () = conn.zadd("kairos:due", "x:birth", 1).await.unwrap();
    match old.store_with(None).await {
        Err(OpenError::Layout(why)) => assert!(why.contains("kairos migrate"), "{why}"),
        other => panic!("an old keyspace was opened: {:?}", other.is_ok()),
    }
}

#[tokio::test]
async fn the_sweep_takes_a_swept_lifes_pointer_with_it() {
    let redis = Redis::start();
    let store = redis.store_with(Some(8)).await.unwrap();
    let p = store.placement();
    let rid = resource_elsewhere(&store, "gone");
    book(&store, &life("gone", Some(&rid), now_ms() + LATER))
        .await
        .unwrap();
    store
        .cancel("gone", false, now_ms(), now_ms())
        .await
        .unwrap();
    let swept = store
        .sweep(p.resource(&rid), now_ms() + 1, 100)
        .await
        .unwrap();
    assert_eq!(swept, 1);
    let mut conn = redis.conn().await;
    let pointer: Option<String> = conn
        .get(store.shard(p.home("gone")).pointer("gone"))
        .await
        .unwrap();
    assert_eq!(pointer, None);
    // The id is free again.
    book(&store, &life("gone", None, now_ms() + LATER))
        .await
        .unwrap();
}

/// Books 24 point Lives named `{prefix}00`.. in 4 shards, takes every shard over as
/// "h1" and claims its Plans: each shard, the generation taken, and its Plans.
async fn claim_in_four_shards(store: &Store, prefix: &str) -> Vec<(u32, u64, Vec<Claimed>)> {
    let at = now_ms() + 5_000;
    for i in 0..24 {
        book(store, &life(&format!("{prefix}{i:02}"), None, at + i))
            .await
            .unwrap();
    }
    let mut claimed = Vec::new();
    for shard in 0..4 {
        let Takeover::Taken { gen, .. } = store.shard_takeover(shard, "h1", 30_000).await.unwrap()
        else {
            panic!("shard {shard} is held");
        };
        let ClaimReply::Claimed { plans, .. } = store
            .claim(shard, "h1", gen, now_ms() + 60_000, 1000, now_ms(), 0)
            .await
            .unwrap()
        else {
            panic!("shard {shard}: claim refused");
        };
        assert!(!plans.is_empty(), "shard {shard} got no Lives");
        claimed.push((shard, gen, plans));
    }
    claimed
}

/// On a standalone Redis the runs of many shards are recorded in one call of
/// `finish_life` (a section a shard), and each run is judged and answered as its own:
/// one whose claim is not this host's any more is refused in the middle of the others,
/// and the rest are written, each in its own shard, with its shard's census.
#[tokio::test]
async fn runs_of_many_shards_finish_in_one_call_each_answered_as_its_own() {
    let redis = Redis::start();
    let store = redis.store_with(Some(4)).await.unwrap();
    let mut runs = Vec::new();
    for (shard, gen, plans) in claim_in_four_shards(&store, "l").await {
        let refs: Vec<&Claimed> = plans.iter().collect();
        let started = store
            .start_runs(shard, "h1", gen, &refs, 180_000)
            .await
            .unwrap();
        assert!(started
            .iter()
            .all(|s| matches!(s, StartOutcome::Run { attempts: 1 })));
        runs.extend(plans.iter().map(|p| done(p, 1)));
    }
    assert_eq!(runs.len(), 24);
    // Interleave the shards, as the finisher's batch comes, and spoil one run's claim.
    runs.sort_by(|a, b| a.plan.plan_id.cmp(&b.plan.plan_id));
    let spoiled = 13;
    runs[spoiled].plan.claim = "999999".into();
    let held = store
        .finish_lives("h1", &runs, now_ms(), now_ms())
        .await
        .unwrap();
    let expected: Vec<bool> = (0..24).map(|i| i != spoiled).collect();
    assert_eq!(held, expected);
    for (i, run) in runs.iter().enumerate() {
        let id = run.plan.plan_id.trim_end_matches(":birth");
        let view = store.life_view(id, 10).await.unwrap().unwrap();
        let state = if i == spoiled { "Inexistent" } else { "Dead" };
        assert_eq!(view["state"], state, "{id}: {view:#}");
    }
    // The census of every shard: Inexistent, Alive, Dead, Stillbirth, Invalidated.
    let stats = store.cluster_stats(now_ms()).await.unwrap();
    assert_eq!(stats.lives, [1, 0, 23, 0, 0]);
}

/// Redis lost its scripts (a restart does that; here `SCRIPT FLUSH`) while bookings were
/// coming: the calls under way all find `book` missing, and each must still be judged
/// in the order the bookings came (`POST /schedules/batch` answers its items so). Here
/// every booking of a round overlaps the first on one resource, sent one after another
/// while the calls before them are under way, so the first alone may stand.
#[tokio::test]
async fn bookings_keep_their_order_when_redis_lost_its_scripts() {
    let redis = Redis::start();
    let store = std::sync::Arc::new(redis.store().await);
    let mut conn = redis.conn().await;
    let at = now_ms() + LATER;
    for round in 0..30 {
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut conn)
            .await
            .unwrap();
        let rid = format!("room-{round}");
        let mut calls = Vec::new();
        for i in 0..40 {
            let id = kairos::bookings::request::new_life_uuid_for(store.placement(), Some(&rid));
            let l = life(&id, Some(&rid), at + i);
            let store = store.clone();
            // Spawned in order and first polled in that order (one thread), so each
            // booking reaches the store's batcher after the one before it.
            calls.push(tokio::spawn(async move { book(&store, &l).await }));
            if i % 3 == 0 {
                tokio::task::yield_now().await;
            }
        }
        let mut answers = Vec::new();
        for call in calls {
            answers.push(call.await.unwrap());
        }
        assert_eq!(
            answers[0],
            Ok(()),
            "round {round}: the first booking was overtaken: {answers:?}"
        );
        assert!(
            answers[1..].iter().all(|a| *a == Err(409)),
            "round {round}: a later booking overtook the first: {answers:?}"
        );
    }
}

/// The sizes of `tree`'s leaves, in order.
async fn leaf_sizes(conn: &mut redis::aio::MultiplexedConnection, tree: &str) -> Vec<usize> {
    let entries: Vec<String> = conn.zrange(tree, 0, -1).await.unwrap();
    let mut sizes = Vec::new();
    for entry in entries {
        let leaf = format!("{tree}:{}", entry.rsplit_once('|').unwrap().1);
        sizes.push(conn.zcard(&leaf).await.unwrap());
    }
    sizes
}

#[tokio::test]
async fn bookings_in_time_order_fill_their_leaves_and_others_split_them_in_halves() {
    let redis = Redis::start();
    let store = redis.store_with(Some(1)).await.unwrap();
    let mut conn = redis.conn().await;
    let at = now_ms() + LATER;
    // In the order of their times: each booking lands at the end of the last leaf.
    for i in 0..600 {
        book(&store, &life(&format!("seq-{i:04}"), None, at + i))
            .await
            .unwrap();
    }
    let k = store.shard(0);
    for tree in [k.due(), k.lives()] {
        let sizes = leaf_sizes(&mut conn, &tree).await;
        assert_eq!(sizes.iter().sum::<usize>(), 600, "{tree}: {sizes:?}");
        // Every leaf but the last was left full when the next began (48: the size a
        // booking's sampled check splits past).
        let (last, full) = sizes.split_last().unwrap();
        assert!(
            full.iter().all(|&n| (48..=128).contains(&n)),
            "{tree}: {sizes:?}"
        );
        assert!(*last <= 128, "{tree}: {sizes:?}");
    }
    // Out of order (each one before the last): leaves split in two halves, none outgrows
    // its listpack, and the tree keeps every member in order.
    for i in 0..300 {
        book(
            &store,
            &life(&format!("mid-{i:04}"), None, at + 599 - 2 * i),
        )
        .await
        .unwrap();
    }
    let sizes = leaf_sizes(&mut conn, &k.lives()).await;
    assert_eq!(sizes.iter().sum::<usize>(), 900, "{sizes:?}");
    assert!(sizes.iter().all(|&n| n <= 128), "{sizes:?}");
    assert!(
        sizes.iter().any(|&n| n < 48),
        "no leaf was split in halves: {sizes:?}"
    );
    let mut want: Vec<(i64, String)> = (0..600)
        .map(|i| (i, format!("seq-{i:04}")))
        .chain((0..300).map(|i| (599 - 2 * i, format!("mid-{i:04}"))))
        .collect();
    want.sort();
    let want: Vec<String> = want.into_iter().map(|(_, id)| id).collect();
    let (mut got, mut cursor) = (Vec::new(), None);
    for _ in 0..20 {
        let page = store
            .list(&ListFilter {
                limit: 100,
                cursor: cursor.clone(),
                ..Default::default()
            })
            .await
            .unwrap();
        got.extend(
            page.items
                .iter()
                .map(|l| l["life_uuid"].as_str().unwrap().to_string()),
        );
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => break,
        }
    }
    assert_eq!(got, want, "every Life once, in birth order");
}

/// On a standalone Redis the Plans of many shards start in one call of `start_run` (a
/// section a shard), each section fenced by this host's lease on its own shard: a
/// section sent under a generation the shard no longer has starts nothing and answers
/// `lost` for each of its Plans, in the middle of the others, which start; a retry of the
/// call answers the started ones as before.
#[tokio::test]
async fn plans_of_many_shards_start_in_one_call_each_fenced_by_its_own_lease() {
    let redis = Redis::start();
    let store = redis.store_with(Some(4)).await.unwrap();
    let claimed = claim_in_four_shards(&store, "s").await;
    let stale = 2;
    let sections: Vec<StartSection<'_>> = claimed
        .iter()
        .map(|(shard, gen, plans)| StartSection {
            shard: *shard,
            // A generation of the shard other than the one this host holds.
            gen: if *shard == stale { gen + 1 } else { *gen },
            plans: plans.iter().collect(),
        })
        .collect();
    for round in 0..2 {
        let answers = store
            .start_sections("h1", &sections, 180_000)
            .await
            .unwrap();
        assert_eq!(answers.len(), 4);
        for ((shard, _, plans), answer) in claimed.iter().zip(&answers) {
            assert_eq!(answer.len(), plans.len(), "round {round}, shard {shard}");
            let want = if *shard == stale {
                StartOutcome::Lost
            } else {
                StartOutcome::Run { attempts: 1 }
            };
            assert!(
                answer.iter().all(|a| *a == want),
                "round {round}, shard {shard}: {answer:?}"
            );
        }
    }
    // Only the started Plans carry a start in their shard's `inflight` entry
    // (`{claim}|{fire}|{host}|{started}|{attempt}`).
    let mut conn = redis.conn().await;
    for (shard, _, plans) in &claimed {
        for plan in plans {
            let entry: String = conn
                .hget(store.shard(*shard).inflight(), &plan.plan_id)
                .await
                .unwrap();
            let fields = entry.split('|').count();
            let want = if *shard == stale { 3 } else { 5 };
            assert_eq!(fields, want, "shard {shard}, {}: {entry}", plan.plan_id);
        }
    }
}
