//! The booking load: point and term Lives, resource-bound Lives booked legally one after
//! another on a pool of resources, queue tasks on two queues, and a few timers; every
//! booking and its answer kept in a client-side log.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::Method;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::cluster::Cluster;
use super::rng::Rng;
use crate::{now_ms, rfc3339_ms, Api};

/// What a booking books.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Point,
    Term,
    Task,
}

/// One booking the load sent, and its answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Booking {
    /// life_uuid, or `{queue}/{task}` for a task.
    pub id: String,
    pub kind: Kind,
    pub resource: Option<String>,
    pub queue: Option<String>,
    pub birth_ms: i64,
    pub death_ms: Option<i64>,
    pub sent_ms: i64,
    pub answered_ms: i64,
    /// The host process it was sent to.
    pub via: String,
    pub status: Option<u16>,
    /// The error code of a refusal, or the transport error.
    pub error: Option<String>,
}

impl Booking {
    /// A 200: the booking must not be lost.
    pub fn acked(&self) -> bool {
        self.status == Some(200)
    }

    /// The Idempotency-Keys of the Plans this booking makes.
    pub fn plan_keys(&self) -> Vec<(String, &'static str, i64)> {
        match self.kind {
            Kind::Point => vec![(format!("{}:birth", self.id), "birth", self.birth_ms)],
            Kind::Term => vec![
                (format!("{}:birth", self.id), "birth", self.birth_ms),
                (
                    format!("{}:death", self.id),
                    "death",
                    self.death_ms.unwrap_or(self.birth_ms),
                ),
            ],
            Kind::Task => vec![(format!("{}:task", self.id), "task", self.birth_ms)],
        }
    }
}

/// The timers the load creates (name, schedule, period in ms).
pub const TIMERS: [(&str, &str, i64); 2] = [
    ("chaos-t1", "*/1 * * * * *", 1_000),
    ("chaos-t2", "*/3 * * * * *", 3_000),
];
/// The queues (name, max_concurrent; 0 = no limit).
pub const QUEUES: [(&str, i64); 2] = [("chaos-free", 0), ("chaos-lim", 2)];
/// How long a booking waits for its answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(3);

pub struct LoadPlan {
    /// Run id, prefixed to every id so that two runs never share names.
    pub run: String,
    pub until_ms: i64,
    /// Latest birth (or task ETA) of any booking; a death may be up to 20 s later.
    pub latest_birth_ms: i64,
    /// Margin between a resource's Lives: the hosts' execution_delay_guard_time.
    pub resource_guard_ms: i64,
    pub resources: usize,
}

pub type Log = Arc<Mutex<Vec<Booking>>>;

fn action(kind: &str, id: &str) -> Value {
    json!({"path": format!("/hook/{kind}"), "method": "POST", "body": {"id": id}})
}

/// Sends `body` to a host that is up (any of them, seeded), retrying only the choice of
/// host while none is up; logs and returns the booking.
#[allow(clippy::too_many_arguments)]
async fn send(
    cluster: &Cluster,
    rng: &mut Rng,
    log: &Log,
    path: &str,
    body: Value,
    mut booking: Booking,
) -> Booking {
    let deadline = now_ms() + 10_000;
    let (via, api): (String, Api) = loop {
        let live = cluster.live_apis();
        if !live.is_empty() {
            break rng.pick(&live).clone();
        }
        if now_ms() > deadline {
            booking.via = "-".into();
            booking.error = Some("no host up".into());
            log.lock().unwrap().push(booking.clone());
            return booking;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    booking.via = via;
    booking.sent_ms = now_ms();
    let reply = api
        .try_raw(
            Method::POST,
            path,
            serde_json::to_vec(&body).unwrap(),
            ANSWER_WITHIN,
        )
        .await;
    booking.answered_ms = now_ms();
    match reply {
        Ok((status, reply)) => {
            booking.status = Some(status);
            if status != 200 {
                booking.error = Some(
                    reply["error"]["code"]
                        .as_str()
                        .map(str::to_string)
                        .unwrap_or_else(|| reply.to_string()),
                );
            }
        }
        Err(e) => booking.error = Some(e),
    }
    log.lock().unwrap().push(booking.clone());
    booking
}

fn blank(id: String, kind: Kind, birth_ms: i64) -> Booking {
    Booking {
        id,
        kind,
        resource: None,
        queue: None,
        birth_ms,
        death_ms: None,
        sent_ms: 0,
        answered_ms: 0,
        via: String::new(),
        status: None,
        error: None,
    }
}

/// Creates the queues and timers; they must be acknowledged (no fault is running yet).
pub async fn setup(api: &Api) -> Result<(), String> {
    for (queue, max_concurrent) in QUEUES {
        let (status, reply) = api
            .put(
                &format!("/queues/{queue}"),
                &json!({"rate": 0, "bucket_size": 100, "max_concurrent": max_concurrent}),
            )
            .await;
        if status != 200 {
            return Err(format!("PUT /queues/{queue}: {status} {reply}"));
        }
    }
    for (name, schedule, _) in TIMERS {
        let (status, reply) = api
            .post(
                "/timers",
                &json!({"name": name, "schedule": schedule, "action": action("timer", name)}),
            )
            .await;
        if status != 200 {
            return Err(format!("POST /timers {name}: {status} {reply}"));
        }
    }
    Ok(())
}

/// Point Lives, and term Lives with no resource, due 3 s to 60 s ahead.
async fn lives(cluster: Arc<Cluster>, plan: Arc<LoadPlan>, mut rng: Rng, log: Log, tag: usize) {
    let mut n = 0u32;
    while now_ms() < plan.until_ms && n < 100_000 {
        tokio::time::sleep(Duration::from_millis(rng.range(150, 600) as u64)).await;
        let now = now_ms();
        let birth = (now + rng.range(3_000, 60_000))
            .min(plan.latest_birth_ms)
            .max(now + 3_000);
        n += 1;
        let id = format!("{}-l{tag}-{n}", plan.run);
        if rng.chance(0.25) {
            let death = birth + rng.range(2_000, 20_000);
            let mut b = blank(id.clone(), Kind::Term, birth);
            b.death_ms = Some(death);
            let body = json!({
                "life_uuid": id, "schedule_type": "term",
                "birth_time": rfc3339_ms(birth), "death_time": rfc3339_ms(death),
                "birth": action("birth", &id), "death": action("death", &id),
            });
            send(&cluster, &mut rng, &log, "/schedules", body, b).await;
        } else {
            let body = json!({
                "life_uuid": id, "schedule_type": "point",
                "birth_time": rfc3339_ms(birth), "birth": action("birth", &id),
            });
            send(
                &cluster,
                &mut rng,
                &log,
                "/schedules",
                body,
                blank(id, Kind::Point, birth),
            )
            .await;
        }
    }
}

/// Resource-bound Lives: each resource's next Life starts after the previous one's end
/// plus the guard and a gap of 0.2–2 s, so every booking is legal and the only way two
/// Plans of one resource can overlap or run out of order is the engine. The cursor moves
/// on whatever the answer, so that a booking stored despite a failed answer never makes
/// the next one conflict.
async fn resources(cluster: Arc<Cluster>, plan: Arc<LoadPlan>, mut rng: Rng, log: Log) {
    let mut cursor = vec![0i64; plan.resources];
    let mut n = 0u32;
    while now_ms() < plan.until_ms && n < 100_000 {
        tokio::time::sleep(Duration::from_millis(rng.range(150, 500) as u64)).await;
        let now = now_ms();
        let r = rng.range(0, plan.resources as i64 - 1) as usize;
        let birth = cursor[r].max(now + rng.range(3_000, 6_000));
        if birth > now + 45_000 || birth > plan.latest_birth_ms {
            continue;
        }
        n += 1;
        let id = format!("{}-r{r}-{n}", plan.run);
        let resource = format!("{}-res{r}", plan.run);
        if rng.chance(0.8) {
            let death = birth + rng.range(2_000, 20_000);
            cursor[r] = death + plan.resource_guard_ms + rng.range(200, 2_000);
            let mut b = blank(id.clone(), Kind::Term, birth);
            b.death_ms = Some(death);
            b.resource = Some(resource.clone());
            let body = json!({
                "life_uuid": id, "schedule_type": "term", "resource_id": resource,
                "term": {"birth_time": rfc3339_ms(birth), "death_time": rfc3339_ms(death)},
                "birth": action("birth", &id), "death": action("death", &id),
            });
            send(&cluster, &mut rng, &log, "/schedules", body, b).await;
        } else {
            cursor[r] = birth + plan.resource_guard_ms + rng.range(200, 2_000);
            let mut b = blank(id.clone(), Kind::Point, birth);
            b.resource = Some(resource.clone());
            let body = json!({
                "life_uuid": id, "schedule_type": "point", "resource_id": resource,
                "birth_time": rfc3339_ms(birth), "birth": action("birth", &id),
            });
            send(&cluster, &mut rng, &log, "/schedules", body, b).await;
        }
    }
}

/// Queue tasks, 1–4 per call, due 1–20 s ahead, on both queues.
async fn tasks(cluster: Arc<Cluster>, plan: Arc<LoadPlan>, mut rng: Rng, log: Log) {
    let mut n = 0u32;
    while now_ms() < plan.until_ms && n < 100_000 {
        tokio::time::sleep(Duration::from_millis(rng.range(300, 1_000) as u64)).await;
        let (queue, _) = *rng.pick(&QUEUES);
        let count = rng.range(1, 4);
        let mut items = Vec::new();
        let mut batch = Vec::new();
        for _ in 0..count {
            n += 1;
            let name = format!("{}-k{n}", plan.run);
            let eta = (now_ms() + rng.range(1_000, 20_000)).min(plan.latest_birth_ms);
            items.push(
                json!({"name": name, "eta": rfc3339_ms(eta), "action": action("task", &name)}),
            );
            let mut b = blank(format!("{queue}/{name}"), Kind::Task, eta);
            b.queue = Some(queue.to_string());
            batch.push(b);
        }
        // One call books the whole list (all or nothing): log each task with its answer.
        let first = batch[0].clone();
        let sent = send(
            &cluster,
            &mut rng,
            &Arc::new(Mutex::new(Vec::new())),
            &format!("/queues/{queue}/tasks"),
            Value::Array(items),
            first,
        )
        .await;
        let mut l = log.lock().unwrap();
        for mut b in batch {
            b.via = sent.via.clone();
            b.sent_ms = sent.sent_ms;
            b.answered_ms = sent.answered_ms;
            b.status = sent.status;
            b.error = sent.error.clone();
            l.push(b);
        }
    }
}

/// Runs the whole load until `plan.until_ms`, logging into `log`; returns the log.
pub async fn run(cluster: Arc<Cluster>, plan: LoadPlan, rng: &Rng, log: Log) -> Vec<Booking> {
    let plan = Arc::new(plan);
    let mut tasks_ = Vec::new();
    for tag in 0..2 {
        tasks_.push(tokio::spawn(lives(
            cluster.clone(),
            plan.clone(),
            rng.fork(10 + tag as u64),
            log.clone(),
            tag,
        )));
    }
    tasks_.push(tokio::spawn(resources(
        cluster.clone(),
        plan.clone(),
        rng.fork(20),
        log.clone(),
    )));
    tasks_.push(tokio::spawn(tasks(
        cluster.clone(),
        plan.clone(),
        rng.fork(30),
        log.clone(),
    )));
    for t in tasks_ {
        let _ = t.await;
    }
    let out = log.lock().unwrap().clone();
    out
}
