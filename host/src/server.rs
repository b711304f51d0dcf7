//! `kairos serve`: wires configuration, Redis, the firing engine and the API together,
//! and shuts them down in order on SIGTERM or Ctrl-C.

use std::sync::Arc;

use anyhow::{bail, Context};
use tokio::sync::watch;

use crate::api::{self, App};
use crate::bookings::Bookings;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use crate::managed_redis::ManagedRedis;
use crate::outbound::OutboundPolicy;
use crate::plugins::{PluginRuntime, RuntimeSettings};
use crate::scheduler::Engine;
use crate::store::Store;

/// Runs a host until a shutdown signal, then stops gracefully: the API stops accepting,
/// the engine stops claiming, runs under way finish, held Plans go back to Redis, and a
/// self-managed redis-server is shut down last.
pub async fn serve(config: Config) -> anyhow::Result<()> {
    if config.refuses_open_listen() {
        bail!(
            "refusing to listen on {} without API tokens: set --api-tokens (KAIROS_API_TOKENS), listen on a loopback address, or pass --insecure",
            config.listen
        );
    }
    let managed = match &config.redis_url {
        Some(_) => None,
        None => {
            let managed = ManagedRedis::start(&config.data_dir).await?;
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
    let store = Store::connect(&redis_url, &config.key_prefix, config.timezone)
        .await
        .with_context(|| format!("cannot connect to Redis at {redis_url}"))?
        .with_runs_max_len(config.runs_stream_max_len);
    store.ping().await.context("Redis does not answer PING")?;

    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let tls = crate::actions::webhook::tls_config(config.tls_ca_file.as_deref())
        .map_err(anyhow::Error::msg)?;
    let metrics = Arc::new(crate::metrics::Metrics::default());
    let registry = crate::plugins::Registry::new(store.connection(), store.keys.clone());
    let bookings = Arc::new(Bookings {
        config: config.clone(),
        store: store.clone(),
        clock: clock.clone(),
        plugins: registry.clone(),
    });
    let plugins = PluginRuntime::new(
        registry,
        bookings.clone(),
        RuntimeSettings {
            instances: config.workers.clamp(1, 10_000) as u32,
            cache_dir: config.data_dir.join("plugin-cache"),
            policy: Arc::new(OutboundPolicy::new(
                config.allowed_hosts.clone(),
                config.gateway_url.as_deref(),
            )),
            client: crate::actions::webhook::pooled_client(tls.clone(), config.connect_timeout),
            response_limit: config.response_body_limit,
            request_timeout: config.request_timeout,
            keep_resident: crate::plugins::runtime::DEFAULT_KEEP_RESIDENT,
            pagemap_scan: true,
        },
    )
    .context("cannot start the plugin runtime")?;
    let engine = Engine::new(
        store.clone(),
        config.clone(),
        clock.clone(),
        metrics,
        tls,
        plugins.clone(),
    );
    let engine_done = engine.start(shutdown_rx.clone());

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
    });
    let mut api_shutdown = shutdown_rx.clone();
    let server = axum::serve(listener, api::router(app)).with_graceful_shutdown(async move {
        crate::scheduler::until_shutdown(&mut api_shutdown).await;
    });
    let signals = tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down: no new claims; finishing runs and handing Plans back");
        let _ = shutdown_tx.send(true);
    });
    server.await.context("the API server failed")?;
    signals.abort();
    engine_done.await.ok();
    if let Some(managed) = managed {
        managed.stop().await;
    }
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler installs");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
