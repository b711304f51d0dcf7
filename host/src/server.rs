//! `kairos serve`: wires configuration, Redis, the firing engine and the API together,
//! and shuts them down in order on SIGTERM or Ctrl-C.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::sync::watch;

use crate::api::{self, App};
use crate::bookings::Bookings;
use crate::clock::{Clock, ManualClock, SystemClock};
use crate::config::Config;
use crate::engine::Engine;
use crate::managed_redis::ManagedRedis;
use crate::outbound::{OutboundPolicy, PolicyResolver};
use crate::plugins::{PluginRuntime, RuntimeSettings};
use crate::store::{OpenError, Store};

/// The `hash-max-listpack-value` kairos's own redis-server runs with (managed_redis.rs),
/// and below which a Redis brought by the user gets a warning at startup: a Life keeps
/// its actions and run records in its hash.
const LISTPACK_VALUE_ADVISED: u64 = crate::managed_redis::LISTPACK_VALUE;

/// Runs a host until a shutdown signal, then stops gracefully: the API stops accepting,
/// the engine stops claiming, runs under way finish, held Plans go back to Redis, and a
/// self-managed redis-server is shut down last.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    let open_files = crate::http_server::raise_open_files_limit();
    tracing::debug!(open_files, "open-file limit");
    if config.refuses_open_listen() {
        bail!(
            "refusing to listen on {} without API tokens: set --api-tokens (KAIROS_API_TOKENS), listen on a loopback address, or pass --insecure",
            config.listen
        );
    }
    let managed = match &config.redis_url {
        Some(_) => None,
        None => {
            let settings = crate::managed_redis::Settings::new(
                config.redis_maxmemory.clone(),
                &config.durability,
            );
            let managed = ManagedRedis::start(&config.data_dir, settings).await?;
            tracing::info!(
                data_dir = %managed.data_dir.display(),
                "started a redis-server of its own; inspect it with: redis-cli -s {}/redis.sock",
                managed.data_dir.display()
            );
            Some(managed)
        }
    };
    let redis_url = config
        .redis_url
        .clone()
        .or_else(|| managed.as_ref().map(|m| m.url.clone()))
        .expect("a Redis URL or a managed server");
    let store = match Store::connect(
        &redis_url,
        &config.key_prefix,
        config.timezone,
        config.shards,
    )
    .await
    {
        Ok(store) => store
            .with_runs_max_len(config.runs_stream_max_len)
            .with_min_replicas_ack(config.min_replicas_ack),
        Err(OpenError::Layout(why)) => bail!("{why}"),
        Err(OpenError::Redis(e)) => {
            return Err(e).with_context(|| format!("cannot connect to Redis at {redis_url}"))
        }
    };
    store.ping().await.context("Redis does not answer PING")?;
    check_redis(&store, &config).await?;
    tracing::info!(shards = store.shard_count(), "keyspace open");
    crate::timers::upgrade_legacy_schedules(&store)
        .await
        .map_err(|e| anyhow::anyhow!("cannot read timers to upgrade their schedules: {e}"))?;
    take_host_id(&store, &config).await?;

    let manual_clock = config
        .manual_clock
        .then(|| Arc::new(ManualClock::default()));
    let clock: Arc<dyn Clock> = match &manual_clock {
        Some(manual) => {
            tracing::warn!("the clock is manual (--clock manual): POST /clock moves it ahead");
            manual.clone()
        }
        None => Arc::new(SystemClock),
    };
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let tls = crate::actions::webhook::tls_config(config.tls_ca_file.as_deref())
        .map_err(anyhow::Error::msg)?;
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let registry = crate::plugins::Registry::new(store.conn(), store.keys.registry());
    let policy = Arc::new(OutboundPolicy::new(
        config.allowed_hosts.clone(),
        config.gateway_url.as_deref(),
    ));
    let bookings = Arc::new(Bookings {
        config: config.clone(),
        store: store.clone(),
        clock: clock.clone(),
        plugins: registry.clone(),
        policy: policy.clone(),
    });
    let plugins = PluginRuntime::new(
        registry,
        bookings.clone(),
        RuntimeSettings {
            instances: config.workers.clamp(1, 10_000) as u32,
            threads: config.plugin_threads,
            cache_dir: config.data_dir.join("plugin-cache"),
            policy: policy.clone(),
            client: crate::actions::webhook::pooled_client(
                tls.clone(),
                config.connect_timeout,
                PolicyResolver::new(policy.clone(), false),
            ),
            public_client: crate::actions::webhook::pooled_client(
                tls.clone(),
                config.connect_timeout,
                PolicyResolver::new(policy.clone(), true),
            ),
            response_limit: config.response_body_limit,
            request_timeout: config.request_timeout,
            keep_resident: crate::plugins::runtime::DEFAULT_KEEP_RESIDENT,
            pagemap_scan: true,
        },
    )
    .context("cannot start the plugin runtime")?;
    tokio::spawn(plugins.clone().keep_warm(shutdown_rx.clone()));
    let engine = Engine::new(
        store.clone(),
        config.clone(),
        clock.clone(),
        metrics,
        tls,
        plugins.clone(),
    );
    let engine_done = engine.start(shutdown_rx.clone());

    // Bound before the API's address, so that a client that finds the API up finds
    // /metrics up too.
    let metrics_listener = match config.metrics_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} for /metrics"))?,
        ),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    tracing::info!(listen = %listener.local_addr()?, host_id = %config.host_id, "kairos is serving");
    let app = Arc::new(App {
        config: config.clone(),
        store,
        clock,
        engine: engine.clone(),
        bookings,
        plugins,
        manual_clock,
    });
    if let Some(listener) = metrics_listener {
        tracing::info!(listen = %listener.local_addr()?, "serving /metrics without a token");
        let mut metrics_shutdown = shutdown_rx.clone();
        tokio::spawn(crate::http_server::serve(
            listener,
            api::metrics_router(app.clone()),
            async move {
                crate::engine::until_shutdown(&mut metrics_shutdown).await;
            },
            Duration::from_secs(1),
        ));
    }
    let mut api_shutdown = shutdown_rx.clone();
    let server = crate::http_server::serve(
        listener,
        api::router(app),
        async move {
            crate::engine::until_shutdown(&mut api_shutdown).await;
        },
        config.shutdown_timeout,
    );
    let (force_tx, force_rx) = tokio::sync::oneshot::channel::<()>();
    let hurried = engine.clone();
    let stop_limit = config.shutdown_timeout + STOP_GRACE;
    let signals = tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down: no new claims; finishing runs and handing Plans back (a second signal exits at once)");
        let _ = shutdown_tx.send(true);
        tokio::select! {
            _ = wait_for_signal() => {
                tracing::warn!("second signal: handing every Plan back now, runs under way included (they run again on another host), and exiting");
                // Handing back needs Redis; a Redis that is gone must not keep the
                // process alive (the leases run out and other hosts take the Plans).
                if tokio::time::timeout(HAND_BACK_LIMIT, hurried.hand_back_all()).await.is_err() {
                    tracing::warn!("could not hand the Plans back within {HAND_BACK_LIMIT:?} (is Redis reachable?); exiting: other hosts take them when this host's leases run out");
                }
            }
            _ = tokio::time::sleep(stop_limit) => {
                tracing::warn!("could not finish stopping within {stop_limit:?} (--shutdown-timeout and {STOP_GRACE:?} to hand back; is Redis reachable?); exiting: other hosts take this host's Plans when its leases run out");
            }
        }
        let _ = force_tx.send(());
    });
    let graceful = async {
        server.await;
        engine_done.await.ok();
    };
    tokio::select! {
        _ = graceful => {}
        _ = force_rx => {}
    }
    signals.abort();
    if let Some(managed) = managed {
        managed.stop().await;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Refuses a Redis that may evict keys (unless `--allow-eviction`), and says how it keeps
/// what it acknowledges.
async fn check_redis(store: &Store, config: &Config) -> anyhow::Result<()> {
    if config.redis_url.is_some()
        && (config.redis_maxmemory.is_some() || config.durability != "everysec")
    {
        tracing::warn!("--redis-maxmemory and --durability configure the redis-server kairos starts itself; with --redis-url, configure your Redis instead");
    }
    let seen = store
        .read_memory()
        .await
        .context("cannot read Redis's INFO memory")?;
    store.memory().record(&seen);
    if let Some(evicting) = seen.iter().find(|m| m.may_evict()) {
        if !config.allow_eviction {
            bail!(
                "Redis's maxmemory-policy is {}: a full Redis would delete keys, silently dropping pending bookings and resource locks. Set it to noeviction (`redis-cli CONFIG SET maxmemory-policy noeviction`, and in redis.conf), or pass --allow-eviction to run anyway",
                evicting.policy
            );
        }
        tracing::warn!(
            policy = %evicting.policy,
            "Redis may evict keys when it is full: pending bookings and resource locks can be lost (--allow-eviction)"
        );
    }
    if seen.iter().any(|m| m.max == 0) {
        tracing::info!("Redis has no maxmemory: kairos cannot keep headroom below it, and the machine's memory is the limit");
    }
    if let Some(limit) = store.listpack_value_limit().await {
        if limit < LISTPACK_VALUE_ADVISED {
            tracing::warn!(
                "Redis's hash-max-listpack-value is {limit}: a Life whose action or run record is longer than {limit} bytes is kept in Redis's larger hash encoding, which takes 1.4 to 1.7 times the memory (BENCHMARKS.md). Set it to {LISTPACK_VALUE_ADVISED} (`redis-cli CONFIG SET hash-max-listpack-value {LISTPACK_VALUE_ADVISED}`, and in redis.conf), as the redis-server kairos runs itself has it"
            );
        }
    }
    match store.durability().await {
        Ok(d) => {
            tracing::info!(appendonly = %d.appendonly, appendfsync = %d.appendfsync, "Redis durability");
            if d.appendonly != "yes" {
                tracing::warn!("Redis keeps no append-only file: a restart of Redis loses every booking since its last snapshot");
            }
            store.memory().set_durability(d);
        }
        Err(e) => tracing::warn!(error = %e, "cannot read Redis's persistence settings"),
    }
    Ok(())
}

/// Makes sure no live host uses this host id. A process restarted under the same id
/// takes its predecessor's shards at once (their leases name this id), handing back what
/// the predecessor had claimed.
///
/// A lease still current may be a crashed predecessor's: it is watched for up to two
/// lease periods. A live host renews it, and this one refuses to start; a dead one's
/// expires, and this one takes over.
async fn take_host_id(store: &Store, config: &Config) -> anyhow::Result<()> {
    let id = &config.host_id;
    let now = || chrono::Utc::now().timestamp_millis();
    if let Some(first) = store.host_alive_until(id).await? {
        if first > now() {
            let lease_ms = config.lease_ttl.as_millis() as i64;
            let watch_until = now() + 2 * lease_ms + 500;
            tracing::info!(host_id = %id, "this host id holds a current lease; waiting to see whether a live host renews it");
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                match store.host_alive_until(id).await? {
                    Some(deadline) if deadline > first => bail!(
                        "host id `{id}` is in use by a live host (its lease was renewed while this one waited); give this host another --host-id"
                    ),
                    Some(deadline) if deadline > now() && now() < watch_until => continue,
                    _ => break,
                }
            }
        }
    }
    Ok(())
}

/// How long a stopping host may take to hand its Plans back and give its shards up after
/// runs have ended (or `--shutdown-timeout` has passed): enough for a reachable Redis,
/// and a bound when Redis is gone.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// How long a second signal waits for the Plans to be handed back before exiting.
const HAND_BACK_LIMIT: Duration = Duration::from_secs(5);

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler installs");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
