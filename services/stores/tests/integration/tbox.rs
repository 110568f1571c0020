//! The `KG_TBOX` bucket against a real nats-server from the dev-deps virtualenv.

use std::time::Duration;

use kg_common::error::{ErrorCode, ErrorExt};
use kg_proto::v1::{EntityInstance, EntityType, Tbox};
use kg_stores::embedded::{EmbeddedNats, find_venv};
use kg_stores::events;
use kg_stores::tbox::TboxBucket;

fn tbox(namespace: &str, version: i64) -> Tbox {
    Tbox {
        namespace: namespace.into(),
        version,
        entity_types: vec![EntityType {
            type_id: "Person".into(),
            label: "Person".into(),
            aliases: vec!["human".into()],
            patterns: vec![],
            side: "published".into(),
            instances: vec![EntityInstance {
                name: "Ada Lovelace".into(),
                aliases: vec!["Ada".into()],
            }],
        }],
        relation_types: vec![],
        published_at_ms: 1_700_000_000_000,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_tboxes_round_trip_and_the_cache_expires() {
    let venv = find_venv().unwrap_or_else(|err| panic!("{err}"));
    let dir = tempfile::tempdir().unwrap();
    let nats = EmbeddedNats::start(&venv, dir.path()).await.unwrap();
    let js = events::connect(&nats.url).await.unwrap();

    let bucket = TboxBucket::open(&js).await.unwrap();
    assert_eq!(bucket.get("handbook").await.unwrap(), None);
    assert!(bucket.get_cached("handbook").await.unwrap().is_none());

    let first = bucket.put(&tbox("handbook", 1)).await.unwrap();
    assert_eq!(
        bucket.get("handbook").await.unwrap(),
        Some(tbox("handbook", 1))
    );
    // The writer's own handle sees its publish without waiting for the TTL.
    assert_eq!(
        bucket
            .get_cached("handbook")
            .await
            .unwrap()
            .unwrap()
            .version,
        1
    );

    // A second process (another handle, opened again: idempotent) with a short TTL.
    let reader = TboxBucket::open(&js)
        .await
        .unwrap()
        .with_cache_ttl(Duration::from_millis(200));
    assert_eq!(
        reader
            .get_cached("handbook")
            .await
            .unwrap()
            .unwrap()
            .version,
        1
    );
    let second = bucket.put(&tbox("handbook", 2)).await.unwrap();
    assert!(second > first, "revisions grow: {first} then {second}");
    assert_eq!(
        reader
            .get_cached("handbook")
            .await
            .unwrap()
            .unwrap()
            .version,
        1,
        "inside the TTL the cached TBox answers"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        reader
            .get_cached("handbook")
            .await
            .unwrap()
            .unwrap()
            .version,
        2
    );

    // Namespaces are separate keys.
    assert_eq!(reader.get("other").await.unwrap(), None);

    let err = bucket.put(&tbox("Not.Valid", 1)).await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument);
    assert_eq!(
        bucket.get("a.b").await.unwrap_err().code(),
        ErrorCode::InvalidArgument
    );
}
