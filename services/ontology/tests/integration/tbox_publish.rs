//! Publishing a TBox against real SQLite and a real nats-server: a draft too large for the
//! event bus is refused when it is put, with what to change, and a publish the bus does not
//! take records no version.

use kg_common::error::{ErrorCode, ErrorExt};
use kg_ontology::TboxStore;
use kg_proto::v1::{EntityInstance, EntityType, Tbox};
use kg_stores::embedded::{EmbeddedNats, find_venv};
use kg_stores::events;
use kg_stores::sql::SqlStore;
use kg_stores::tbox::TboxBucket;

fn tbox(instances: usize) -> Tbox {
    Tbox {
        namespace: "plants".into(),
        entity_types: vec![EntityType {
            type_id: "plant".into(),
            label: "Plant".into(),
            instances: (0..instances)
                .map(|i| EntityInstance {
                    name: format!("Fabrikam turbine plant number {i:06}"),
                    aliases: vec![format!("FTP-{i:06}")],
                })
                .collect(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// A real nats-server (its `KG_TBOX` bucket open) and a TBox store on SQLite, in one temp dir.
struct Fixture {
    store: TboxStore,
    bucket: TboxBucket,
    js: async_nats::jetstream::Context,
    nats: EmbeddedNats,
    _dir: tempfile::TempDir,
}

async fn fixture() -> Fixture {
    let venv = find_venv().unwrap_or_else(|err| panic!("{err}"));
    let dir = tempfile::tempdir().unwrap();
    let nats = EmbeddedNats::start(&venv, &dir.path().join("nats"))
        .await
        .unwrap();
    let js = events::connect(&nats.url).await.unwrap();
    let bucket = TboxBucket::open(&js).await.unwrap();
    let sql = SqlStore::connect(&format!(
        "sqlite://{}",
        dir.path().join("meta.db").display()
    ))
    .await
    .unwrap();
    let store = TboxStore::open(sql, Some(bucket.clone())).await.unwrap();
    Fixture {
        store,
        bucket,
        js,
        nats,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tbox_the_bus_cannot_carry_is_refused_and_a_failed_publish_records_nothing() {
    // Bound, not dropped: the temp dir holds the database.
    let Fixture {
        store,
        bucket,
        nats,
        _dir: _kept,
        ..
    } = fixture().await;
    assert_eq!(
        bucket.max_tbox_bytes(),
        1024 * 1024 - 4096,
        "nats-server's default limit"
    );

    // About 1.6 MB encoded: refused at once, and no draft is kept.
    let huge = tbox(30_000);
    let err = store.put_draft(&huge, "usr_admin").await.unwrap_err();
    assert_eq!(err.code(), ErrorCode::InvalidArgument, "{err}");
    assert!(
        err.to_string().contains("at most 1044480 can be published")
            && err.to_string().contains("max_payload"),
        "{err}"
    );
    assert_eq!(
        store.draft("plants").await.unwrap_err().code(),
        ErrorCode::NotFound
    );

    // Drafts put at once all land, the last one kept, its review cleared.
    let puts = (1..=6).map(|n| {
        let store = &store;
        async move { store.put_draft(&tbox(n), "usr_admin").await }
    });
    for put in futures::future::join_all(puts).await {
        put.unwrap();
    }
    store.review("plants", "usr_reviewer", None).await.unwrap();
    store.put_draft(&tbox(2), "usr_admin").await.unwrap();
    let draft = store.draft("plants").await.unwrap();
    assert!(
        draft.reviewed_by.is_empty(),
        "a new draft needs a new review"
    );
    assert_eq!(draft.entity_types[0].instances.len(), 2);

    // A review naming the digest it read applies to that draft only.
    let read = store.draft("plants").await.unwrap();
    store.put_draft(&tbox(3), "usr_other_admin").await.unwrap();
    let stale = store
        .review("plants", "usr_reviewer", Some(&read.digest))
        .await
        .unwrap_err();
    assert_eq!(stale.code(), ErrorCode::FailedPrecondition, "{stale}");
    assert!(
        stale.to_string().contains("changed since you read it"),
        "{stale}"
    );
    let current = store.draft("plants").await.unwrap();
    assert!(
        current.reviewed_by.is_empty(),
        "the changed draft was marked reviewed"
    );
    assert_ne!(current.digest, read.digest);
    let reviewed = store
        .review(
            "plants",
            "usr_reviewer",
            Some(&current.digest.to_uppercase()),
        )
        .await
        .unwrap();
    assert_eq!(reviewed.reviewed_by, "usr_reviewer");
    assert_eq!(
        reviewed.digest, current.digest,
        "a review does not change the digest"
    );

    // A TBox of a few thousand instances publishes, and the bus holds it.
    store.put_draft(&tbox(5_000), "usr_admin").await.unwrap();
    store.review("plants", "usr_reviewer", None).await.unwrap();
    let first = store.publish("plants", "usr_admin").await.unwrap();
    assert_eq!(first.version, 1);
    assert_eq!(bucket.get("plants").await.unwrap().unwrap().version, 1);

    // With the bus gone, publishing fails as unavailable and records no version 2.
    store.put_draft(&tbox(10), "usr_admin").await.unwrap();
    store.review("plants", "usr_reviewer", None).await.unwrap();
    drop(nats);
    let err = store.publish("plants", "usr_admin").await.unwrap_err();
    assert!(
        matches!(err.code(), ErrorCode::Unavailable | ErrorCode::Timeout),
        "{err}"
    );
    assert!(!err.to_string().contains("127.0.0.1"), "{err}");
    assert_eq!(store.published("plants").await.unwrap().version, 1);
    let draft = store.draft("plants").await.unwrap();
    assert_eq!(draft.next_version, 2, "the failed publish took no version");
    assert_eq!(
        draft.reviewed_by, "usr_reviewer",
        "the draft stays, ready to publish again"
    );
}

/// SQL is the record of what is published; the bus's bucket is the indexers' copy. When NATS
/// loses it (restarted without its volume), the ontology service puts every namespace's latest
/// TBox back; one the bucket holds at an older version (a bus restored from an old backup) is
/// replaced when versions are compared; and what the bucket holds current is left alone.
/// Drafts, reviews and publishes a TBox of `instances` plants as `namespace`'s next version.
async fn publish(store: &TboxStore, namespace: &str, instances: usize) -> Tbox {
    let draft = Tbox {
        namespace: namespace.into(),
        ..tbox(instances)
    };
    store.put_draft(&draft, "usr_admin").await.unwrap();
    store.review(namespace, "usr_reviewer", None).await.unwrap();
    store.publish(namespace, "usr_admin").await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_tboxes_the_bus_lost_are_put_back() {
    let Fixture {
        store,
        bucket,
        js,
        nats: _running,
        _dir: _kept,
    } = fixture().await;
    publish(&store, "plants", 2).await;
    publish(&store, "plants", 3).await;
    publish(&store, "ships", 1).await;
    assert!(store.restore_bus_copies(true).await.unwrap().is_empty());

    // NATS loses the bucket with both TBoxes.
    js.delete_key_value("KG_TBOX").await.unwrap();
    assert!(bucket.get("plants").await.is_err(), "the bucket is gone");
    assert_eq!(
        store.restore_bus_copies(false).await.unwrap(),
        ["plants", "ships"]
    );
    let plants = bucket.get("plants").await.unwrap().unwrap();
    assert_eq!(plants.version, 2);
    assert_eq!(plants.entity_types[0].instances.len(), 3);
    assert_eq!(bucket.get("ships").await.unwrap().unwrap().version, 1);

    // An older copy is replaced only when versions are compared (at the service's start).
    let older = Tbox {
        version: 1,
        ..plants.clone()
    };
    bucket.put(&older).await.unwrap();
    assert!(store.restore_bus_copies(false).await.unwrap().is_empty());
    assert_eq!(store.restore_bus_copies(true).await.unwrap(), ["plants"]);
    assert_eq!(bucket.get("plants").await.unwrap().unwrap().version, 2);
    assert!(store.restore_bus_copies(true).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_namespace_takes_its_tbox_with_it() {
    let Fixture {
        store,
        bucket,
        nats: _running,
        _dir: _kept,
        ..
    } = fixture().await;
    publish(&store, "plants", 1).await;
    publish(&store, "plants", 2).await;
    publish(&store, "ships", 1).await;
    // A draft of a third version beside the two published.
    store.put_draft(&tbox(3), "usr_admin").await.unwrap();

    let purged = store.purge("plants").await.unwrap();
    assert_eq!((purged.versions_removed, purged.draft_removed), (2, true));
    assert_eq!(bucket.get("plants").await.unwrap(), None);
    let draft = store.draft("plants").await.unwrap_err();
    assert_eq!(draft.code(), ErrorCode::NotFound, "{draft}");
    let published = store.published("plants").await.unwrap_err();
    assert_eq!(published.code(), ErrorCode::NotFound, "{published}");
    // Nothing to put back: SQL no longer lists it.
    assert!(store.restore_bus_copies(true).await.unwrap().is_empty());
    assert_eq!(bucket.get("plants").await.unwrap(), None);
    // The other namespace keeps its TBox; purging again changes nothing.
    assert_eq!(bucket.get("ships").await.unwrap().unwrap().version, 1);
    let again = store.purge("plants").await.unwrap();
    assert_eq!((again.versions_removed, again.draft_removed), (0, false));
}
