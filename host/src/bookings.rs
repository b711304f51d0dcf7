//! Booking as a service: what `POST /schedules`, `/defer` and a plugin's follow-up
//! bookings share (validation in the spec's order, the plugin registry check, the store).

use std::collections::HashSet;
use std::sync::Arc;

use crate::booking::{self, BookingRequest, NewLife, Rules};
use crate::clock::Clock;
use crate::config::Config;
use crate::error::ApiError;
use crate::plugins::Registry;
use crate::store::{CancelOutcome, Store};

pub struct Bookings {
    pub config: Config,
    pub store: Store,
    pub clock: Arc<dyn Clock>,
    pub plugins: Registry,
}

impl Bookings {
    /// The validation rules at `now_ms`; `plugin_exists` answers for plugin names.
    pub fn rules<'a>(&self, now_ms: i64, plugin_exists: &'a dyn Fn(&str) -> bool) -> Rules<'a> {
        Rules {
            timezone: self.config.timezone,
            minimum_life_term_ms: self.config.minimum_life_term.as_millis() as i64,
            execution_guard_ms: self.config.execution_guard_time.as_millis() as i64,
            now_ms,
            gateway_configured: self.config.gateway_url.is_some(),
            plugin_exists,
        }
    }

    /// The plugin specs of `request` that are registered, looked up before validation
    /// so that an unknown plugin is a 400 in the table's order.
    pub async fn registered_plugins(
        &self,
        request: &BookingRequest,
    ) -> Result<HashSet<String>, ApiError> {
        self.plugins.registered(request.plugin_specs()).await
    }

    /// Validates and stores the body of a `POST /schedules`.
    /// Counts one follow-up booking by `plugin` in the current second (all hosts share
    /// the counter, `plugin-bookings:{name}:{second}`); false when that makes more than
    /// `limit`.
    pub async fn count_plugin_booking(&self, plugin: &str, limit: u64) -> Result<bool, ApiError> {
        let second = self.clock.now_ms().div_euclid(1000);
        let key = format!(
            "{}plugin-bookings:{plugin}:{second}",
            self.store.keys.prefix
        );
        let mut conn = self.store.connection();
        let (count, _): (u64, bool) = redis::pipe()
            .atomic()
            .incr(&key, 1)
            .expire(&key, 5)
            .query_async(&mut conn)
            .await?;
        Ok(count <= limit)
    }

    pub async fn book_json(&self, body: &[u8]) -> Result<NewLife, ApiError> {
        // POST /schedules bodies are capped before they get here; a plugin's
        // `schedule.book` request is not, and would otherwise store any size in Redis.
        if body.len() > self.config.max_body_bytes {
            return Err(ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
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
        let exists = |spec: &str| known.contains(spec);
        let life = request.into_new_life(&self.rules(now_ms, &exists))?;
        self.store(&life, now_ms).await?;
        Ok(life)
    }

    /// Stores a validated booking (the 409 checks run in the store's script).
    pub async fn store(&self, life: &NewLife, now_ms: i64) -> Result<(), ApiError> {
        self.store
            .book(
                life,
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
