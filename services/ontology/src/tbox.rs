//! The TBox lifecycle of each namespace: a draft is put, reviewed by someone,
//! then published as the next version (kept in SQL, and put into the
//! `KG_TBOX` bucket the indexer reads).

use base64::Engine as _;
use kg_common::caller::now_ms;
use kg_common::tbox_patterns;
use kg_proto::v1::{PurgeTboxResponse, Tbox, TboxDraft};
use kg_stores::sql::SqlStore;
use kg_stores::tbox::{DEFAULT_MAX_TBOX_BYTES, TboxBucket};
use prost::Message as _;
use sqlx::Row as _;

use crate::error::{OntologyError, Result};

pub(crate) static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Draft, review and publish TBoxes.
#[derive(Clone, Debug)]
pub struct TboxStore {
    sql: SqlStore,
    bucket: Option<TboxBucket>,
}

fn encode(tbox: &Tbox) -> String {
    base64::engine::general_purpose::STANDARD.encode(tbox.encode_to_vec())
}

/// SHA-256 (hex) of a stored draft body: what a reviewer names to review exactly that draft.
fn digest(body: &str) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(body.as_bytes()))
}

fn decode(text: &str) -> Result<Tbox> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| OntologyError::Store(format!("tbox body: {e}")))?;
    Tbox::decode(bytes.as_slice()).map_err(|e| OntologyError::Store(format!("tbox body: {e}")))
}

/// Longest entity type id: it is part of every entity key of its type, which the services
/// cap at [`kg_proto::limits::MAX_KEY_BYTES`], so a long one would leave little for names.
const MAX_TYPE_ID_BYTES: usize = 64;

fn check(tbox: &Tbox) -> Result<()> {
    let mut problems = Vec::new();
    let mut ids = std::collections::BTreeSet::new();
    for t in &tbox.entity_types {
        if t.type_id.trim().is_empty() || t.label.trim().is_empty() {
            problems.push("every entity type needs a type_id and a label".to_owned());
        }
        if t.type_id.len() > MAX_TYPE_ID_BYTES {
            problems.push(format!(
                "entity type id `{}…` is longer than {MAX_TYPE_ID_BYTES} bytes; use a short id \
                 and put the words in its label",
                t.type_id.chars().take(32).collect::<String>()
            ));
        }
        if !ids.insert(t.type_id.clone()) {
            problems.push(format!("entity type `{}` is declared twice", t.type_id));
        }
        if let Some(problem) = id_problem("entity type id", &t.type_id) {
            problems.push(problem);
        }
        // Checked here as the indexer compiles them, which skips a pattern it cannot run
        // with a warning in its own log, where no one who published the TBox looks.
        for pattern in &t.patterns {
            if let Err(reason) = tbox_patterns::entity_pattern(pattern) {
                problems.push(format!(
                    "entity type `{}`: pattern `{}`: {reason}",
                    t.type_id,
                    clip(pattern)
                ));
            }
        }
    }
    let mut rels = std::collections::BTreeSet::new();
    for r in &tbox.relation_types {
        if r.relation_type_id.trim().is_empty() {
            problems.push("every relation type needs a relation_type_id".to_owned());
        }
        if let Some(problem) = id_problem("relation type id", &r.relation_type_id) {
            problems.push(problem);
        }
        for pattern in &r.patterns {
            if let Err(reason) = tbox_patterns::relation_form(pattern) {
                problems.push(format!(
                    "relation type `{}`: pattern `{}`: {reason}",
                    r.relation_type_id,
                    clip(pattern)
                ));
            }
        }
        if !rels.insert(r.relation_type_id.clone()) {
            problems.push(format!(
                "relation type `{}` is declared twice",
                r.relation_type_id
            ));
        }
        for end in [&r.source_type_id, &r.target_type_id] {
            if !end.is_empty() && !ids.contains(end) {
                problems.push(format!(
                    "relation type `{}` names the entity type `{end}`, which the draft does not declare",
                    r.relation_type_id
                ));
            }
        }
    }
    problems.extend(nul_characters(tbox));
    if problems.is_empty() {
        Ok(())
    } else {
        Err(OntologyError::InvalidTbox(problems))
    }
}

/// Why `id` cannot name a type (it is part of entity keys and graph properties), if it
/// cannot: letters, digits, `_`, `-` and `.`, starting with a letter or digit.
fn id_problem(what: &str, id: &str) -> Option<String> {
    let ok = id.starts_with(|c: char| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    (!ok && !id.trim().is_empty()).then(|| {
        format!(
            "{what} `{}` may hold only letters, digits, `_`, `-` and `.`, starting with a letter or digit",
            clip(id)
        )
    })
}

/// At most 80 characters of a value quoted in a problem.
fn clip(text: &str) -> String {
    let mut clipped: String = text.chars().take(80).collect();
    if clipped.len() < text.len() {
        clipped.push('…');
    }
    clipped
}

/// Where the TBox holds a NUL character. Its names become graph properties and the
/// patterns regexes, and no document text holds a NUL for either to match; the gateway
/// refuses NUL in tool arguments the same way.
fn nul_characters(tbox: &Tbox) -> Vec<String> {
    let mut fields: Vec<(String, &str)> = Vec::new();
    for (i, t) in tbox.entity_types.iter().enumerate() {
        let at = format!("entity_types[{i}]");
        fields.push((format!("{at}.type_id"), &t.type_id));
        fields.push((format!("{at}.label"), &t.label));
        fields.push((format!("{at}.side"), &t.side));
        for (j, a) in t.aliases.iter().enumerate() {
            fields.push((format!("{at}.aliases[{j}]"), a));
        }
        for (j, p) in t.patterns.iter().enumerate() {
            fields.push((format!("{at}.patterns[{j}]"), p));
        }
        for (j, instance) in t.instances.iter().enumerate() {
            fields.push((format!("{at}.instances[{j}].name"), &instance.name));
            for (k, a) in instance.aliases.iter().enumerate() {
                fields.push((format!("{at}.instances[{j}].aliases[{k}]"), a));
            }
        }
    }
    for (i, r) in tbox.relation_types.iter().enumerate() {
        let at = format!("relation_types[{i}]");
        fields.push((format!("{at}.relation_type_id"), &r.relation_type_id));
        fields.push((format!("{at}.label"), &r.label));
        fields.push((format!("{at}.source_type_id"), &r.source_type_id));
        fields.push((format!("{at}.target_type_id"), &r.target_type_id));
        for (j, p) in r.patterns.iter().enumerate() {
            fields.push((format!("{at}.patterns[{j}]"), p));
        }
    }
    fields
        .into_iter()
        .filter(|(_, value)| value.contains('\0'))
        .map(|(at, _)| format!("`{at}` holds a NUL character (U+0000); remove it"))
        .collect()
}

impl TboxStore {
    /// Runs the migrations; `bucket` receives published TBoxes (None: SQL only).
    pub async fn open(sql: SqlStore, bucket: Option<TboxBucket>) -> Result<Self> {
        sql.migrate(&MIGRATOR).await?;
        Ok(Self { sql, bucket })
    }

    async fn latest_version(&self, namespace: &str) -> Result<i64> {
        let row = sqlx::query("SELECT MAX(version) FROM kg_tbox_versions WHERE namespace = $1")
            .bind(namespace.to_owned())
            .fetch_one(self.sql.pool())
            .await?;
        Ok(row.try_get::<Option<i64>, _>(0)?.unwrap_or(0))
    }

    /// Largest encoded TBox that can be published: the event bus carries it to the indexers
    /// in one message.
    fn max_tbox_bytes(&self) -> usize {
        self.bucket
            .as_ref()
            .map_or(DEFAULT_MAX_TBOX_BYTES, TboxBucket::max_tbox_bytes)
    }

    /// Replaces the draft of `tbox.namespace`; clears any review. A draft too large to
    /// publish is refused here, not at publish time.
    pub async fn put_draft(&self, tbox: &Tbox, by: &str) -> Result<TboxDraft> {
        check(tbox)?;
        // Publishing adds a version and a time, a few bytes the bus's headroom covers.
        let size = tbox.encoded_len();
        let max = self.max_tbox_bytes();
        if size > max {
            return Err(OntologyError::BadRequest(format!(
                "the TBox is {size} bytes encoded; at most {max} can be published, as the event \
                 bus carries it in one message: drop instances, aliases or patterns, or raise \
                 the NATS server's max_payload"
            )));
        }
        let now = now_ms();
        // One statement: two puts at once both land (the later wins) instead of the second
        // breaking the primary key between a delete and an insert.
        sqlx::query(
            "INSERT INTO kg_tbox_drafts (namespace, body, updated_by, updated_at_ms, reviewed_by, reviewed_at_ms) \
             VALUES ($1, $2, $3, $4, NULL, NULL) \
             ON CONFLICT (namespace) DO UPDATE SET body = excluded.body, updated_by = excluded.updated_by, \
             updated_at_ms = excluded.updated_at_ms, reviewed_by = NULL, reviewed_at_ms = NULL",
        )
        .bind(tbox.namespace.clone())
        .bind(encode(tbox))
        .bind(by.to_owned())
        .bind(now)
        .execute(self.sql.pool())
        .await?;
        self.draft(&tbox.namespace).await
    }

    /// The draft of `namespace`.
    pub async fn draft(&self, namespace: &str) -> Result<TboxDraft> {
        let row = sqlx::query(
            "SELECT body, updated_by, updated_at_ms, reviewed_by, reviewed_at_ms FROM kg_tbox_drafts WHERE namespace = $1",
        )
        .bind(namespace.to_owned())
        .fetch_optional(self.sql.pool())
        .await?
        .ok_or_else(|| OntologyError::NotFound(format!("namespace `{namespace}` has no TBox draft; put one first")))?;
        let body = row.try_get::<String, _>(0)?;
        let tbox = decode(&body)?;
        Ok(TboxDraft {
            digest: digest(&body),
            namespace: namespace.to_owned(),
            entity_types: tbox.entity_types,
            relation_types: tbox.relation_types,
            updated_by: row.try_get(1)?,
            updated_at_ms: row.try_get(2)?,
            reviewed_by: row.try_get::<Option<String>, _>(3)?.unwrap_or_default(),
            reviewed_at_ms: row.try_get(4)?,
            next_version: self.latest_version(namespace).await? + 1,
        })
    }

    /// Marks the draft reviewed by `by`. With `expected_digest` (the [`TboxDraft::digest`] the
    /// reviewer read), only if the draft is still that one: the body is compared in the UPDATE
    /// itself, so a put between the read and the review is never marked reviewed.
    pub async fn review(
        &self,
        namespace: &str,
        by: &str,
        expected_digest: Option<&str>,
    ) -> Result<TboxDraft> {
        let missing =
            || OntologyError::NotFound(format!("namespace `{namespace}` has no TBox draft"));
        let changed = || {
            OntologyError::Conflict(format!(
                "the TBox draft of `{namespace}` changed since you read it; show it again \
                 (kgmesh tbox show) and review what it says now"
            ))
        };
        let done = match expected_digest {
            None => {
                sqlx::query(
                    "UPDATE kg_tbox_drafts SET reviewed_by = $1, reviewed_at_ms = $2 WHERE namespace = $3",
                )
                .bind(by.to_owned())
                .bind(now_ms())
                .bind(namespace.to_owned())
                .execute(self.sql.pool())
                .await?
            }
            Some(expected) => {
                let body: String =
                    sqlx::query("SELECT body FROM kg_tbox_drafts WHERE namespace = $1")
                        .bind(namespace.to_owned())
                        .fetch_optional(self.sql.pool())
                        .await?
                        .ok_or_else(missing)?
                        .try_get(0)?;
                if digest(&body) != expected.trim().to_ascii_lowercase() {
                    return Err(changed());
                }
                let done = sqlx::query(
                    "UPDATE kg_tbox_drafts SET reviewed_by = $1, reviewed_at_ms = $2 \
                     WHERE namespace = $3 AND body = $4",
                )
                .bind(by.to_owned())
                .bind(now_ms())
                .bind(namespace.to_owned())
                .bind(body)
                .execute(self.sql.pool())
                .await?;
                if done.rows_affected() == 0 {
                    return Err(changed());
                }
                done
            }
        };
        if done.rows_affected() == 0 {
            return Err(missing());
        }
        self.draft(namespace).await
    }

    /// Publishes the reviewed draft as the next version.
    pub async fn publish(&self, namespace: &str, by: &str) -> Result<Tbox> {
        let draft = self.draft(namespace).await?;
        if draft.reviewed_by.is_empty() {
            return Err(OntologyError::Conflict(format!(
                "the TBox draft of `{namespace}` is not reviewed; review it (kgmesh tbox review) before publishing"
            )));
        }
        let now = now_ms();
        let tbox = Tbox {
            namespace: namespace.to_owned(),
            version: draft.next_version,
            entity_types: draft.entity_types,
            relation_types: draft.relation_types,
            published_at_ms: now,
        };
        // The version is recorded only once the bus holds it: a put that fails rolls the
        // insert back, so SQL never lists a version the indexers were not given.
        let mut tx = self.sql.begin_write().await?;
        sqlx::query(
            "INSERT INTO kg_tbox_versions (namespace, version, body, published_by, reviewed_by, published_at_ms) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(namespace.to_owned())
        .bind(tbox.version)
        .bind(encode(&tbox))
        .bind(by.to_owned())
        .bind(draft.reviewed_by)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if let Some(bucket) = &self.bucket {
            bucket.put(&tbox).await?;
        }
        tx.commit().await?;
        tracing::info!(namespace, version = tbox.version, by, "tbox published");
        Ok(tbox)
    }

    /// Removes the namespace's draft, every published version and the bus's copy (the namespace
    /// is being deleted). The SQL rows go only once the bus's copy is gone, so a failure leaves
    /// both and the call can run again; the copy goes once more after the commit, against a
    /// concurrent [`TboxStore::restore_bus_copies`].
    pub async fn purge(&self, namespace: &str) -> Result<PurgeTboxResponse> {
        kg_common::access::validate_namespace(namespace)
            .map_err(|err| OntologyError::BadRequest(err.to_string()))?;
        let mut tx = self.sql.begin_write().await?;
        let versions_removed = sqlx::query("DELETE FROM kg_tbox_versions WHERE namespace = $1")
            .bind(namespace.to_owned())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        let drafts_removed = sqlx::query("DELETE FROM kg_tbox_drafts WHERE namespace = $1")
            .bind(namespace.to_owned())
            .execute(&mut *tx)
            .await?
            .rows_affected();
        if let Some(bucket) = &self.bucket {
            bucket.remove(namespace).await?;
        }
        tx.commit().await?;
        // Once more after the commit: a restore that read SQL before it may have put the copy
        // back since (it checks SQL again after each put, so one after this finds nothing).
        if let Some(bucket) = &self.bucket {
            bucket.remove(namespace).await?;
        }
        tracing::info!(
            namespace,
            versions_removed,
            "tbox of a deleted namespace removed"
        );
        Ok(PurgeTboxResponse {
            versions_removed: i64::try_from(versions_removed).unwrap_or(i64::MAX),
            draft_removed: drafts_removed > 0,
        })
    }

    /// Puts back into `KG_TBOX` each namespace's latest published TBox the bucket lacks (NATS
    /// lost its state, or the bucket was deleted) or, with `compare_versions`, holds at an
    /// older version than SQL's latest (a bus restored from an older backup). SQL is the
    /// record, the bucket the indexers' copy. A publish landing meanwhile is never overwritten
    /// (each put expects the entry it read). Returns the namespaces put back.
    pub async fn restore_bus_copies(&self, compare_versions: bool) -> Result<Vec<String>> {
        let Some(bucket) = &self.bucket else {
            return Ok(Vec::new());
        };
        // Made again only when it cannot be listed: a stream update every check is noise.
        let listed = match bucket.namespaces().await {
            Ok(listed) => listed,
            Err(_) => {
                bucket.ensure().await?;
                bucket.namespaces().await?
            }
        };
        let held: std::collections::HashSet<String> = listed.into_iter().collect();
        let rows = sqlx::query(
            "SELECT namespace, MAX(version) FROM kg_tbox_versions GROUP BY namespace ORDER BY namespace",
        )
        .fetch_all(self.sql.pool())
        .await?;
        let mut restored = Vec::new();
        for row in rows {
            let namespace: String = row.try_get(0)?;
            let latest: i64 = row.try_get(1)?;
            if held.contains(&namespace) && !compare_versions {
                continue;
            }
            let current = bucket.held(&namespace).await?;
            if current.is_some_and(|c| c.version >= latest) {
                continue;
            }
            let tbox = match self.published(&namespace).await {
                Ok(tbox) => tbox,
                // Purged since the listing: the namespace is being deleted.
                Err(OntologyError::NotFound(_)) => continue,
                Err(err) => return Err(err),
            };
            if bucket.replace(&tbox, current).await? {
                // A purge that committed meanwhile left nothing in SQL: its removal may have
                // come before this put, so the copy goes again (see `purge`).
                if self.latest_version(&namespace).await? == 0 {
                    bucket.remove(&namespace).await?;
                    continue;
                }
                tracing::warn!(
                    namespace,
                    version = tbox.version,
                    was = current.map(|c| c.version),
                    "the event bus lacked this namespace's published TBox; put it back"
                );
                restored.push(namespace);
            }
        }
        Ok(restored)
    }

    /// Runs [`TboxStore::restore_bus_copies`] at once (comparing versions) and then every
    /// `every` (only what the bucket lacks, which costs one key listing), until `shutdown`.
    pub async fn keep_bus_copies(
        &self,
        every: std::time::Duration,
        shutdown: tokio_util::sync::CancellationToken,
    ) {
        let mut compare_versions = true;
        loop {
            if let Err(err) = self.restore_bus_copies(compare_versions).await {
                tracing::warn!(error = %kg_common::error::detail(&err), "checking the event bus's copies of the published TBoxes failed; trying again");
            } else {
                compare_versions = false;
            }
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
        }
    }

    /// The latest published TBox (SQL is the record; the bucket is the indexer's copy).
    pub async fn published(&self, namespace: &str) -> Result<Tbox> {
        let row = sqlx::query(
            "SELECT body FROM kg_tbox_versions WHERE namespace = $1 ORDER BY version DESC LIMIT 1",
        )
        .bind(namespace.to_owned())
        .fetch_optional(self.sql.pool())
        .await?
        .ok_or_else(|| {
            OntologyError::NotFound(format!("namespace `{namespace}` has no published TBox"))
        })?;
        decode(&row.try_get::<String, _>(0)?)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use kg_proto::v1::EntityType;

    use super::*;

    #[test]
    fn a_type_id_longer_than_an_entity_key_allows_is_refused() {
        let tbox = |type_id: String| Tbox {
            entity_types: vec![EntityType {
                type_id,
                label: "Plant".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(check(&tbox("p".repeat(MAX_TYPE_ID_BYTES))).is_ok());
        let Err(OntologyError::InvalidTbox(problems)) =
            check(&tbox("p".repeat(MAX_TYPE_ID_BYTES + 1)))
        else {
            panic!("a 65-byte type id passed");
        };
        assert_eq!(problems.len(), 1);
        assert!(problems[0].contains("longer than 64 bytes"), "{problems:?}");
    }

    #[test]
    fn patterns_the_indexer_cannot_run_and_odd_ids_are_refused_at_draft() {
        let tbox = Tbox {
            entity_types: vec![EntityType {
                type_id: "Bad Id!".into(),
                label: "Ticket".into(),
                patterns: vec![r"\bOPS-(\d+\b".into(), ".*".into(), r"\bOPS-\d+\b".into()],
                ..Default::default()
            }],
            relation_types: vec![kg_proto::v1::RelationType {
                relation_type_id: "files".into(),
                patterns: vec!["no placeholders".into(), "{source} filed {target}".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let Err(err @ OntologyError::InvalidTbox(_)) = check(&tbox) else {
            panic!("a TBox with broken patterns passed");
        };
        let text = err.to_string();
        assert!(
            text.starts_with("the TBox draft has 4 problem(s)"),
            "{text}"
        );
        for problem in [
            "entity type id `Bad Id!` may hold only letters",
            "pattern `\\bOPS-(\\d+\\b`: regex parse error",
            "pattern `.*`: it matches empty text",
            "relation type `files`: pattern `no placeholders`: a template needs {source} and {target}",
        ] {
            assert!(text.contains(problem), "{problem}: {text}");
        }
    }

    #[test]
    fn a_nul_character_anywhere_in_a_tbox_is_refused_saying_where() {
        let tbox = Tbox {
            entity_types: vec![EntityType {
                type_id: "plant".into(),
                label: "Plant".into(),
                instances: vec![kg_proto::v1::EntityInstance {
                    name: "Main plant".into(),
                    aliases: vec!["ok".into(), "Ma\0in".into()],
                }],
                ..Default::default()
            }],
            relation_types: vec![kg_proto::v1::RelationType {
                relation_type_id: "feeds".into(),
                patterns: vec!["{source} feeds\0 {target}".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let Err(OntologyError::InvalidTbox(problems)) = check(&tbox) else {
            panic!("a TBox with NUL characters passed");
        };
        assert_eq!(
            problems,
            [
                "`entity_types[0].instances[0].aliases[1]` holds a NUL character (U+0000); remove it",
                "`relation_types[0].patterns[0]` holds a NUL character (U+0000); remove it",
            ]
        );
    }
}
