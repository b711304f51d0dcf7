//! Booking as a service: what `POST /schedules`, `/defer` and a plugin's follow-up
//! bookings share (validation in the spec's order, the plugin registry check, the store).

use std::sync::Arc;

pub mod idempotency;
pub mod request;

use crate::clock::Clock;
use crate::config::Config;
use crate::error::ApiError;
use crate::model::NewLife;
use crate::outbound::OutboundPolicy;
use crate::plugins::Registry;
use crate::store::{CancelOutcome, IdOrigin, IdemBooked, Store};
use request::{self as booking, BookingRequest, KnownPlugins, Rules};
use serde_json::Value;

/// What a booking call stored.
#[derive(Debug)]
pub struct Booked {
    /// The Life that will fire, as it now stands: the new one, or the pending Life of
    /// the same debounce key that took this booking's action and time.
    pub life: NewLife,
    /// Whether this booking was merged into a pending Life of its debounce key.
    pub debounced: bool,
}

/// Most bookings one `POST /schedules/batch` takes.
pub const MAX_BATCH: usize = 1000;
/// Items of one batch booked at once: enough to keep Redis's pipeline full, few enough
/// that one batch does not crowd out other callers.
pub const BATCH_CONCURRENCY: usize = 64;

pub struct Bookings {
    pub config: Config,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub plugins: Registry,
    /// Refuses at booking a URL no DNS answer could make allowed (a literal address).
    pub policy: Arc<OutboundPolicy>,
}

impl Bookings {
    /// The validation rules at `now_ms`; `plugins` are the registered plugins the
    /// request names (see [`Bookings::registered_plugins`]).
    pub fn rules<'a>(&'a self, now_ms: i64, plugins: &'a KnownPlugins) -> Rules<'a> {
        Rules {
            timezone: self.config.timezone,
            minimum_life_term_ms: self.config.minimum_life_term.as_millis() as i64,
            execution_guard_ms: self.config.execution_guard_time.as_millis() as i64,
            now_ms,
            gateway_configured: self.config.gateway_url.is_some(),
            plugins,
            policy: Some(&self.policy),
            placement: self.store.placement(),
        }
    }

    /// The plugin specs of `request` that are registered, with their input schemas,
    /// looked up before validation so that an unknown plugin or an input that does not
    /// fit is a 400 in the table's order.
    pub async fn registered_plugins(
        &self,
        request: &BookingRequest,
    ) -> Result<KnownPlugins, ApiError> {
        self.plugins.registered(request.plugin_specs()).await
    }

    /// Validates and stores the body of a `POST /schedules`.
    /// Counts one follow-up booking by `plugin` in the current second (all hosts share
    /// the counter, `plugin-bookings:{name}:{second}`); false when that makes more than
    /// `limit`.
    pub async fn count_plugin_booking(&self, plugin: &str, limit: u64) -> Result<bool, ApiError> {
        let second = self.clock.now_ms().div_euclid(1000);
        let key = self.store.keys.plugin_bookings(plugin, second);
        let mut conn = self.store.conn();
        let (count, _): (u64, bool) = redis::pipe()
            .atomic()
            .incr(&key, 1)
            .expire(&key, 5)
            .query_async(&mut conn)
            .await?;
        Ok(count <= limit)
    }

    pub async fn book_json(&self, body: &[u8]) -> Result<NewLife, ApiError> {
        Ok(self.book_json_keyed(body, None).await?.life)
    }

    /// `book_json` for a call made with an `Idempotency-Key`: a Life id the body does not
    /// give comes from the key, and a Life already stored under that id exactly as this
    /// call would book it is this call's own (booked by an earlier try whose answer was
    /// lost), answered as booked.
    pub async fn book_json_keyed(
        &self,
        body: &[u8],
        key: Option<&str>,
    ) -> Result<Booked, ApiError> {
        // POST /schedules bodies are capped before they get here; a plugin's
        // `schedule.book` request is not, and would otherwise store any size in Redis.
        if body.len() > self.config.max_body_bytes {
            return Err(ApiError::new(
                http::StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                format!(
                    "the booking is larger than the limit of {} bytes",
                    self.config.max_body_bytes
                ),
            ));
        }
        let request = booking::parse_request(body)?;
        let known = self.registered_plugins(&request).await?;
        let now_ms = self.clock.now_ms();
        let origin = request.id_origin(key);
        let (life, debounce) = request.into_booking(&self.rules(now_ms, &known), key)?;
        match debounce {
            None => {
                self.store_keyed(&life, origin, now_ms, key).await?;
                Ok(Booked {
                    life,
                    debounced: false,
                })
            }
            Some(debounce) => {
                let (life, debounced) = self
                    .store
                    .book_debounced(
                        life,
                        &debounce.key,
                        debounce.max_wait_ms,
                        now_ms,
                        self.notify_before_ms(now_ms),
                    )
                    .await?;
                Ok(Booked { life, debounced })
            }
        }
    }

    /// `POST /schedules` under an `Idempotency-Key`, in one script when it can be
    /// (`Store::book_idempotent`: a plain Life, whose id the key places in its record's
    /// shard). None when the call must take the general way (`idempotency::run`): a body
    /// refused here (that way records the refusal), a debounce, a resource or a given
    /// life_uuid in another shard, or a record left by a call that died.
    pub async fn book_json_idempotent(
        &self,
        body: &[u8],
        key: &str,
        fingerprint: &str,
        ttl_ms: i64,
    ) -> Result<Option<idempotency::Answer>, ApiError> {
        if body.len() > self.config.max_body_bytes {
            return Ok(None);
        }
        let Ok(request) = booking::parse_request(body) else {
            return Ok(None);
        };
        let Ok(known) = self.registered_plugins(&request).await else {
            return Ok(None);
        };
        let now_ms = self.clock.now_ms();
        let Ok((life, None)) = request.into_booking(&self.rules(now_ms, &known), Some(key)) else {
            return Ok(None);
        };
        let view = crate::store::booked_view(&life, self.config.timezone);
        let booked = self
            .store
            .book_idempotent(
                &life,
                now_ms,
                self.config.execution_delay_guard_time.as_millis() as i64,
                self.notify_before_ms(now_ms),
                key,
                fingerprint,
                idempotency::PENDING_MS,
                ttl_ms,
                (200, &view.to_string()),
            )
            .await?;
        match booked {
            IdemBooked::Booked => Ok(Some(idempotency::Answer {
                status: http::StatusCode::OK,
                body: view,
                replayed: false,
            })),
            IdemBooked::Found(found) => idempotency::found_answer(found).map(Some),
            IdemBooked::TwoSteps => Ok(None),
        }
    }

    /// Books each item of a `POST /schedules/batch` as `POST /schedules` would, each
    /// whole or refused on its own, answers in the items' order. Up to
    /// [`BATCH_CONCURRENCY`] items are booked at once. Under an `Idempotency-Key`, item
    /// `i` is booked under the key `{key}#{i}`, so the ids a repeat of the batch derives
    /// are the first try's, and an item that try stored is found, not booked twice.
    pub async fn book_batch(
        &self,
        items: &[Value],
        key: Option<&str>,
    ) -> Vec<Result<Booked, ApiError>> {
        use futures_util::stream::{self, StreamExt};
        let calls: Vec<_> = items
            .iter()
            .enumerate()
            .map(|(i, item)| self.book_batch_item(item, key.map(|k| format!("{k}#{i}"))))
            .collect();
        stream::iter(calls)
            .buffered(BATCH_CONCURRENCY)
            .collect()
            .await
    }

    async fn book_batch_item(&self, item: &Value, key: Option<String>) -> Result<Booked, ApiError> {
        if !item.is_object() {
            return Err(ApiError::bad_request(
                "invalid_body",
                "a booking of the batch must be a JSON object",
            ));
        }
        let body = serde_json::to_vec(item).expect("a JSON value serializes");
        self.book_json_keyed(&body, key.as_deref()).await
    }

    /// Stores a validated booking; with an idempotency key, an identical Life already
    /// under its id counts as stored by this call (see `book_json_keyed`).
    pub async fn store_keyed(
        &self,
        life: &NewLife,
        origin: IdOrigin,
        now_ms: i64,
        key: Option<&str>,
    ) -> Result<(), ApiError> {
        match self.store(life, origin, now_ms).await {
            Err(e) if key.is_some() && e.code == "duplicate_life_uuid" => {
                match self.store.load_booking(&life.life_uuid).await? {
                    Some((stored, _, _)) if &stored == life => Ok(()),
                    _ => Err(e),
                }
            }
            other => other,
        }
    }

    /// Stores a validated booking (the 409 checks run in the store's script).
    pub async fn store(
        &self,
        life: &NewLife,
        origin: IdOrigin,
        now_ms: i64,
    ) -> Result<(), ApiError> {
        self.store
            .book(
                life,
                origin,
                now_ms,
                self.config.execution_delay_guard_time.as_millis() as i64,
                self.notify_before_ms(now_ms),
            )
            .await
    }

    /// Bookings due before this are announced to the schedulers at once.
    pub fn notify_before_ms(&self, now_ms: i64) -> i64 {
        now_ms + self.config.preset_execution_time.as_millis() as i64
    }

    /// Cancels a Life; the error codes of `DELETE /schedules/{id}`.
    pub async fn cancel(&self, life_uuid: &str, force: bool) -> Result<String, ApiError> {
        let now_ms = self.clock.now_ms();
        match self
            .store
            .cancel(life_uuid, force, now_ms, self.notify_before_ms(now_ms))
            .await?
        {
            CancelOutcome::Done(state) => Ok(state),
            CancelOutcome::Missing => Err(ApiError::not_found(format!("no Life `{life_uuid}`"))),
            CancelOutcome::Finished(state) => Err(ApiError::conflict(
                "life_finished",
                format!("Life `{life_uuid}` is already {state}"),
            )),
            CancelOutcome::Running => Err(ApiError::conflict(
                "plan_running",
                "an action of this Life is running now and cannot be stopped; try again once it returns",
            )),
        }
    }
}
