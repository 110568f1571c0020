//! The co_annotation lane against a real FalkorDB: span linking, roles, the chosen pair,
//! directCount / bridgeCount, reasons, and no leak from files the caller may not read.

use crate::common;

use common::*;
use kg_indexer::document::DocumentMeta;
use kg_proto::v1::{Grounding, SearchResponse};

const NS: &str = "coann";

async fn corpus(env: &Env) -> (String, String, String, String) {
    let s = &env.store;
    entity_index(s, NS).await;
    let m = DocumentMeta::default;
    write(
        s,
        NS,
        "both",
        "docs/both.md",
        &[
            "Acme Corporation acquired Globex in 2021.",
            "Unrelated paragraph.",
        ],
        m(),
    )
    .await;
    write(
        s,
        NS,
        "bridge",
        "docs/bridge.md",
        &["Acme signed a deal with Initech."],
        m(),
    )
    .await;
    write(
        s,
        NS,
        "rel",
        "docs/rel.md",
        &["Initech is a subsidiary of Globex."],
        m(),
    )
    .await;
    write(
        s,
        NS,
        "secret",
        "secret/s.md",
        &["Acme and Globex secretly merged."],
        m(),
    )
    .await;
    let texts: Vec<String> = (0..30)
        .map(|i| format!("Cloud platform note {i}."))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    write(s, NS, "cloud", "docs/cloud.md", &refs, m()).await;

    let acme = entity(s, NS, "org", "Acme Corporation", &["Acme"]).await;
    let globex = entity(s, NS, "org", "Globex", &[]).await;
    let initech = entity(s, NS, "org", "Initech", &[]).await;
    let cloud = entity(s, NS, "product", "Cloud", &[]).await;
    // Known only from the denied file: must never be grounded for a restricted caller.
    let hidden = entity(s, NS, "org", "Umbrella", &[]).await;
    mention(s, NS, "both#0", &acme).await;
    mention(s, NS, "both#0", &globex).await;
    mention(s, NS, "bridge#0", &acme).await;
    mention(s, NS, "bridge#0", &initech).await;
    mention(s, NS, "rel#0", &initech).await;
    mention(s, NS, "rel#0", &globex).await;
    rel(s, NS, &initech, "subsidiary_of", &globex, "rel#0").await;
    mention(s, NS, "secret#0", &acme).await;
    mention(s, NS, "secret#0", &globex).await;
    mention(s, NS, "secret#0", &hidden).await;
    for i in 0..30 {
        mention(s, NS, &format!("cloud#{i}"), &cloud).await;
    }
    (acme, globex, initech, cloud)
}

fn grounding(response: &SearchResponse) -> &Grounding {
    response
        .grounding
        .as_ref()
        .expect("grounding when co_annotation ran")
}

#[tokio::test]
async fn co_annotation_against_real_falkordb() {
    let env = start().await;
    let (acme, globex, _initech, cloud) = corpus(&env).await;
    let full = caller(NS, |_| {});
    let ask = |q: &str| search(NS, q, &["co_annotation"]);

    // Default lanes leave it off: no grounding.
    let plain = env
        .service
        .search_for(&full, search(NS, "Acme Globex", &[]))
        .await
        .unwrap();
    assert!(plain.grounding.is_none());
    assert!(plain.lanes.iter().all(|l| l.lane != "co_annotation"));

    let response = env
        .service
        .search_for(&full, ask("How did Acme Corporation and Globex combine?"))
        .await
        .unwrap();
    let g = grounding(&response);
    assert_eq!(g.namespace, NS);
    assert_eq!(g.reason, "");
    let linked: Vec<(&str, &str, &str)> = g
        .entities
        .iter()
        .map(|e| (e.entity_key.as_str(), e.phrase.as_str(), e.role.as_str()))
        .collect();
    // The long name wins over its alias inside it; both are bridges.
    assert_eq!(
        linked,
        [
            (acme.as_str(), "acme corporation", "bridge"),
            (globex.as_str(), "globex", "bridge")
        ]
    );
    // Equal roles and degrees: key order decides.
    assert_eq!(g.pair, [acme.clone(), globex.clone()]);
    // Full reader: both#0 and secret#0 co-mention; bridge#0 reaches Globex via Initech.
    assert_eq!((g.direct_count, g.bridge_count), (2, 1));
    assert_eq!(keys(&response), ["both#0", "secret#0", "bridge#0"]);
    let degrees: Vec<u64> = g.entities.iter().map(|e| e.degree).collect();
    assert_eq!(degrees, [3, 3]);

    // Restricted: the denied file counts nowhere, not even in degree.
    let limited = env
        .service
        .search_for(
            &restricted(NS),
            ask("How did Acme Corporation and Globex combine with Umbrella?"),
        )
        .await
        .unwrap();
    no_secret(&limited);
    let g = grounding(&limited);
    assert_eq!((g.direct_count, g.bridge_count), (1, 1));
    assert!(
        g.entities.iter().all(|e| e.name != "Umbrella"),
        "{:?}",
        g.entities
    );
    assert!(g.entities.iter().all(|e| e.degree == 2));
    assert_eq!(keys(&limited), ["both#0", "bridge#0"]);

    // The alias links too.
    let alias = env
        .service
        .search_for(&full, ask("acme globex"))
        .await
        .unwrap();
    assert_eq!(grounding(&alias).direct_count, 2);

    // Reasons.
    let none = env
        .service
        .search_for(&full, ask("weather tomorrow"))
        .await
        .unwrap();
    assert_eq!(grounding(&none).reason, "no_grounded_entities");
    assert!(none.hits.is_empty());
    let one = env
        .service
        .search_for(&full, ask("Globex history"))
        .await
        .unwrap();
    assert_eq!(grounding(&one).reason, "too_few_bridges");
    assert!(grounding(&one).pair.is_empty());
    // Cloud (30 chunks) is a filter; with only it and no bridge, no pair.
    let filter_only = env.service.search_for(&full, ask("cloud")).await.unwrap();
    let g = grounding(&filter_only);
    assert_eq!(g.entities[0].entity_key, cloud);
    assert_eq!(g.entities[0].role, "filter");
    assert_eq!(g.reason, "too_few_bridges");
    // A plural in the question links the entity; the phrase is the question's own word.
    let plural = env.service.search_for(&full, ask("clouds")).await.unwrap();
    let g = grounding(&plural);
    assert_eq!(
        (
            g.entities[0].entity_key.as_str(),
            g.entities[0].phrase.as_str()
        ),
        (cloud.as_str(), "clouds")
    );
    // A bridge and a filter pair up, but nothing connects them.
    let apart = env
        .service
        .search_for(&full, ask("Globex cloud"))
        .await
        .unwrap();
    let g = grounding(&apart);
    assert_eq!(g.pair.len(), 2);
    assert_eq!(
        (g.direct_count, g.bridge_count, g.reason.as_str()),
        (0, 0, "no_evidence")
    );
    // Restricted caller naming only the hidden entity: nothing grounded.
    let hidden = env
        .service
        .search_for(&restricted(NS), ask("Umbrella"))
        .await
        .unwrap();
    assert_eq!(grounding(&hidden).reason, "no_grounded_entities");
    assert!(grounding(&hidden).entities.is_empty());
}
