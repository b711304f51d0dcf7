//! kairos: a scheduler host. People book actions at absolute times over REST; the host
//! keeps every booking in Redis sorted sets keyed by fire time and, at that time, runs the
//! action. Any number of hosts share one Redis and survive each other's crashes.
//!
//! The components, in the order a booking meets them (see `docs/ARCHITECTURE.md`):
//! - [`config`]: startup parameters from flags, `KAIROS_*` env vars and a TOML file.
//! - [`api`]: the REST routes, bearer-token scopes, the error body ([`error`]) and the
//!   OpenAPI document of the routes (`/openapi.json`).
//! - [`bookings`]: reading and validating a booking (`bookings::request`) into a
//!   [`model::NewLife`], and booking as a service shared by the API and plugins'
//!   follow-ups.
//! - [`store`]: the Redis layout and the Lua scripts through which every change goes.
//! - [`scheduler`]: claims due Plans into an in-memory timer and fires them.
//! - [`executor`]: runs one fired Plan and records its outcome.
//! - [`actions`]: what a Plan does: the built-in webhook.
//! - [`plugins`]: WebAssembly action plugins: registry, sandboxed runtime, routes.
//! - [`outbound`]: which targets actions may reach.
//! - [`supervisor`]: leases, takeover of crashed hosts' Plans, retention sweep.
//! - [`timers`]: recurring timers (SPEC 5) over the same Plans; [`schedule`]: cron and
//!   times-of-day schedules with their DST rule.
//! - [`queues`]: task queues (SPEC 6) with rate, concurrency and retry blocks.
//! - [`metrics`]: counters and the lateness histogram behind `/metrics`.
//! - [`managed_redis`]: the redis-server `kairos serve` runs when none is configured.
//! - [`server`]: wires it all together with graceful shutdown.
//! - [`cli`]: `kairos book|ls|show|cancel|timers|queues`, a client of the REST API.

pub mod actions;
pub mod api;
pub mod bookings;
pub mod cli;
pub mod clock;
pub mod config;
pub mod engine;
pub mod error;
pub mod executor;
pub mod http_server;
pub mod managed_redis;
pub mod metrics;
pub mod model;
pub mod outbound;
#[cfg(test)]
mod parser_fuzz;
pub mod plugins;
pub mod queues;
pub mod schedule;
pub mod scheduler;
pub mod server;
pub mod store;
pub mod supervisor;
pub mod time_travel;
pub mod timers;
