//! The plugin registry's versions that compile in the background, against a real
//! redis-server: a `compiling` version leaves the name naming the version before until it
//! is promoted; promoted ready it becomes the latest with its schema, failed it keeps its
//! error and the latest stays; a promote after a DELETE, or a second one, writes nothing.

use kairos::plugins::registry::{PluginState, UploadLimits};
use kairos::plugins::Registry;

mod common;
use common::Redis;

fn limits() -> UploadLimits {
    UploadLimits {
        allowed_hosts: Vec::new(),
        memory_mb: 16,
        timeout_ms: 1_000,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compiling_version_is_promoted_or_failed_once() {
    let redis = Redis::start();
    let store = redis.store().await;
    let reg = Registry::new(store.conn(), store.keys.registry());
    let put = |bytes: &'static [u8], state: PluginState| {
        let reg = reg.clone();
        async move {
            reg.put("p", bytes, None, state, &limits(), "t", 1)
                .await
                .unwrap()
        }
    };

    // A new name whose only version compiles: no latest yet, listed as compiling.
    let v1 = put(b"one", PluginState::Compiling).await;
    assert_eq!((v1.version, v1.state), (1, PluginState::Compiling));
    assert!(reg.resolve("p").await.unwrap().is_none());
    assert_eq!(reg.list().await.unwrap()[0].state, PluginState::Compiling);
    // Ready: the latest, with its schema; a second promote finds it done.
    let schema = r#"{"type":"object"}"#;
    assert!(reg
        .promote("p", 1, &v1.digest, Ok(Some(schema)))
        .await
        .unwrap());
    assert!(!reg.promote("p", 1, &v1.digest, Err("late")).await.unwrap());
    let latest = reg.resolve("p").await.unwrap().unwrap();
    assert_eq!((latest.version, latest.state), (1, PluginState::Ready));
    assert_eq!(latest.input_schema.as_deref(), Some(schema));
    assert!(reg
        .registered(vec!["p".into()])
        .await
        .unwrap()
        .contains("p"));

    // Version 2 compiles and fails: `p` goes on naming version 1.
    let v2 = put(b"two", PluginState::Compiling).await;
    assert_eq!(reg.resolve("p").await.unwrap().unwrap().version, 1);
    assert!(!reg
        .promote("p", 2, "another digest", Ok(None))
        .await
        .unwrap());
    assert!(reg
        .promote("p", 2, &v2.digest, Err("does not link"))
        .await
        .unwrap());
    assert_eq!(reg.resolve("p").await.unwrap().unwrap().version, 1);
    let versions = reg.versions("p").await.unwrap();
    assert_eq!(versions.len(), 2);
    assert_eq!(versions[1].state, PluginState::Failed);
    assert_eq!(versions[1].error.as_deref(), Some("does not link"));
    assert!(!reg
        .registered(vec!["p@2".into()])
        .await
        .unwrap()
        .contains("p@2"));

    // A ready upload is the latest at once; a compile that ends after a newer one was
    // made latest leaves the newer one latest.
    let v3 = put(b"three", PluginState::Compiling).await;
    let v4 = put(b"four", PluginState::Ready).await;
    assert_eq!(reg.resolve("p").await.unwrap().unwrap().version, v4.version);
    assert!(reg.promote("p", 3, &v3.digest, Ok(None)).await.unwrap());
    assert_eq!(reg.resolve("p").await.unwrap().unwrap().version, v4.version);
    assert_eq!(
        reg.versions("p").await.unwrap()[2].state,
        PluginState::Ready
    );

    // A promote after DELETE writes nothing back.
    let v5 = put(b"five", PluginState::Compiling).await;
    reg.delete("p", true, 0).await.unwrap();
    assert!(!reg.promote("p", 5, &v5.digest, Ok(None)).await.unwrap());
    assert!(reg.list().await.unwrap().is_empty());
    let mut conn = redis.conn().await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*{plugins}*plugin:p*")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.is_empty(), "{keys:?}");
}
