//! [`ServerIndex`]: the vector index in a Qdrant server, through qdrant-client (gRPC).
//!
//! Same payload schema and filters as [`EdgeIndex`](super::EdgeIndex). Requests are built
//! by plain functions so their shape is unit-tested without a server; the collection is
//! multi-tenant in Qdrant's recommended way (`namespace` keyword index with
//! `is_tenant`, HNSW graphs per tenant: `m = 0`, `payload_m = 16`).

use std::collections::HashMap;
use std::time::Duration;

use kg_proto::v1::AccessFilter;
use qdrant_client::Qdrant;
use qdrant_client::QdrantError;
use qdrant_client::qdrant::{
    self as client, CollectionExistsRequest, CountPoints, CreateCollection,
    CreateFieldIndexCollection, DeletePoints, FieldType, GetCollectionInfoRequest, HnswConfigDiff,
    KeywordIndexParams, PayloadIncludeSelector, PayloadIndexParams, PointStruct, PointsSelector,
    Query, QueryPoints, ScrollPoints, SetPayloadPoints, UpsertPoints, VectorParams, VectorsConfig,
    VectorsOutput, WithPayloadSelector, WithVectorsSelector, payload_index_params::IndexParams,
    points_selector::PointsSelectorOneOf, value::Kind, vectors_config, vectors_output,
    with_payload_selector::SelectorOptions, with_vectors_selector,
};

use super::edge::{INDEXED_FIELDS, IndexType};
use super::filter;
use super::{
    FieldValue, HIT_FIELDS, Scope, UPSERT_BATCH, VectorError, VectorHit, VectorPoint,
    payload_fields, schema, validate_point, validate_query,
};

/// Per-request deadline sent to the server.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The vector index in a Qdrant server. Cheap to clone.
#[derive(Clone)]
pub struct ServerIndex {
    client: std::sync::Arc<Qdrant>,
    collection: String,
    dimension: usize,
}

impl std::fmt::Debug for ServerIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The client holds the API key: never print it.
        f.debug_struct("ServerIndex")
            .field("collection", &self.collection)
            .field("dimension", &self.dimension)
            .finish_non_exhaustive()
    }
}

pub(crate) fn client_error(err: QdrantError) -> VectorError {
    match err {
        QdrantError::ResponseError { status } => match status.code() {
            tonic::Code::Unavailable | tonic::Code::Cancelled => VectorError::Unavailable {
                source: Box::new(status),
            },
            tonic::Code::DeadlineExceeded => VectorError::Timeout {
                source: Box::new(status),
            },
            // qdrant-client reports a refused connection as `Internal` with this text
            // (channel_pool.rs); it is the only sign that the server is down.
            tonic::Code::Internal if status.message().starts_with("Failed to connect to") => {
                VectorError::Unavailable {
                    source: Box::new(status),
                }
            }
            _ => VectorError::internal(format!("qdrant: {} {}", status.code(), status.message())),
        },
        QdrantError::ResourceExhaustedError { status, .. } => VectorError::Unavailable {
            source: Box::new(status),
        },
        QdrantError::InvalidUri(e) => VectorError::invalid("Qdrant URL", e.to_string()),
        other => VectorError::internal(format!("qdrant: {other}")),
    }
}

impl ServerIndex {
    /// A client for `collection` on the server at `url` (gRPC, usually port 6334).
    /// Connects lazily: call [`ensure_collection`](Self::ensure_collection) to reach it.
    pub fn connect(
        url: &str,
        api_key: Option<String>,
        collection: &str,
        dimension: usize,
    ) -> Result<Self, VectorError> {
        if dimension == 0 {
            return Err(VectorError::invalid("dimension", "must be at least 1"));
        }
        if collection.is_empty() {
            return Err(VectorError::invalid("collection", "empty name"));
        }
        let client = Qdrant::from_url(url)
            .api_key(api_key)
            .timeout(REQUEST_TIMEOUT)
            .skip_compatibility_check()
            .build()
            .map_err(client_error)?;
        Ok(ServerIndex {
            client: std::sync::Arc::new(client),
            collection: collection.to_owned(),
            dimension,
        })
    }

    /// Vector dimension.
    pub fn dimension(&self) -> usize {
        self.dimension
    }

    /// The collection name.
    pub fn collection(&self) -> &str {
        &self.collection
    }

    /// Creates the collection and payload indexes when missing; checks the vector size
    /// and distance of an existing collection.
    pub async fn ensure_collection(&self) -> Result<(), VectorError> {
        let exists = self
            .client
            .collection_exists(CollectionExistsRequest {
                collection_name: self.collection.clone(),
            })
            .await
            .map_err(client_error)?;
        if exists {
            let info = self
                .client
                .collection_info(GetCollectionInfoRequest {
                    collection_name: self.collection.clone(),
                })
                .await
                .map_err(client_error)?;
            let params = info
                .result
                .and_then(|r| r.config)
                .and_then(|c| c.params)
                .and_then(|p| p.vectors_config)
                .and_then(|v| v.config);
            check_existing(params.as_ref(), self.dimension)?;
        } else {
            self.client
                .create_collection(create_collection_request(&self.collection, self.dimension))
                .await
                .map_err(client_error)?;
        }
        // Creating an index that exists is a no-op on the server.
        for request in field_index_requests(&self.collection) {
            self.client
                .create_field_index(request)
                .await
                .map_err(client_error)?;
        }
        Ok(())
    }

    /// Inserts or replaces points, [`UPSERT_BATCH`] per request, each acknowledged
    /// once applied (`wait = true`).
    pub async fn upsert(&self, points: Vec<VectorPoint>) -> Result<(), VectorError> {
        for point in &points {
            validate_point(point, self.dimension)?;
        }
        for request in upsert_requests(&self.collection, &points) {
            self.client
                .upsert_points(request)
                .await
                .map_err(client_error)?;
        }
        Ok(())
    }

    /// Deletes every point of a file.
    pub async fn delete_file(&self, namespace: &str, file_id: &str) -> Result<(), VectorError> {
        self.client
            .delete_points(delete_file_request(&self.collection, namespace, file_id))
            .await
            .map_err(client_error)?;
        Ok(())
    }

    /// [`super::VectorIndex::replace_file`]: the new points, then one delete of the file's
    /// others.
    pub async fn replace_file(
        &self,
        namespace: &str,
        file_id: &str,
        points: Vec<VectorPoint>,
    ) -> Result<(), VectorError> {
        let keep = super::replacement_ids(namespace, file_id, &points, self.dimension)?;
        self.upsert(points).await?;
        self.client
            .delete_points(prune_file_request(
                &self.collection,
                namespace,
                file_id,
                &keep,
            ))
            .await
            .map_err(client_error)?;
        Ok(())
    }

    /// Deletes every point of a namespace.
    pub async fn delete_namespace(&self, namespace: &str) -> Result<(), VectorError> {
        self.client
            .delete_points(delete_namespace_request(&self.collection, namespace))
            .await
            .map_err(client_error)?;
        Ok(())
    }

    /// Sets the enabled and hidden flags on every point of a file.
    pub async fn set_file_flags(
        &self,
        namespace: &str,
        file_id: &str,
        enabled: bool,
        hidden: bool,
    ) -> Result<(), VectorError> {
        self.client
            .set_payload(set_flags_request(
                &self.collection,
                namespace,
                file_id,
                enabled,
                hidden,
            ))
            .await
            .map_err(client_error)?;
        Ok(())
    }

    /// The `limit` nearest points that `access` and `scope` admit, best first.
    pub async fn search(
        &self,
        access: &AccessFilter,
        scope: &Scope,
        vector: Vec<f32>,
        limit: usize,
    ) -> Result<Vec<VectorHit>, VectorError> {
        validate_query(&vector, self.dimension, limit)?;
        if limit == 0 {
            return Ok(Vec::new());
        }
        let response = self
            .client
            .query(query_request(
                &self.collection,
                access,
                scope,
                vector,
                limit,
            ))
            .await
            .map_err(client_error)?;
        response
            .result
            .into_iter()
            .map(|point| {
                super::hit_from(
                    |key| match point.payload.get(key).and_then(|v| v.kind.as_ref()) {
                        Some(Kind::StringValue(s)) => Some(s.clone()),
                        _ => None,
                    },
                    point.score,
                )
            })
            .collect()
    }

    /// How many points `access` and `scope` admit (exact count).
    pub async fn count(&self, access: &AccessFilter, scope: &Scope) -> Result<u64, VectorError> {
        let response = self
            .client
            .count(count_request(&self.collection, access, scope))
            .await
            .map_err(client_error)?;
        Ok(response.result.map(|r| r.count).unwrap_or(0))
    }

    /// The file vector of `file_id` when its file point passes `access` (see
    /// [`VectorIndex::file_vector`](super::VectorIndex::file_vector)).
    pub async fn file_vector(
        &self,
        access: &AccessFilter,
        file_id: &str,
    ) -> Result<Option<Vec<f32>>, VectorError> {
        let response = self
            .client
            .scroll(file_vector_request(&self.collection, access, file_id))
            .await
            .map_err(client_error)?;
        let Some(point) = response.result.into_iter().next() else {
            return Ok(None);
        };
        dense_vector(point.vectors).map(Some)
    }
    /// The vectors of the chunk points `selection` picks, by embed hash, a page of
    /// [`UPSERT_BATCH`] per request (see
    /// [`VectorIndex::stored_chunk_vectors`](super::VectorIndex::stored_chunk_vectors)).
    pub(crate) async fn stored_vectors(
        &self,
        selection: &filter::Clause,
    ) -> Result<HashMap<String, Vec<f32>>, VectorError> {
        let mut stored = HashMap::new();
        let mut offset = None;
        loop {
            let response = self
                .client
                .scroll(stored_vectors_request(&self.collection, selection, offset))
                .await
                .map_err(client_error)?;
            for point in response.result {
                let hash = match point
                    .payload
                    .get(schema::EMBED_HASH)
                    .and_then(|v| v.kind.as_ref())
                {
                    Some(Kind::StringValue(hash)) => hash.clone(),
                    _ => continue,
                };
                // A point without a dense vector is embedded again, not an error.
                if let Ok(vector) = dense_vector(point.vectors) {
                    stored.insert(hash, vector);
                }
            }
            match response.next_page_offset {
                Some(next) => offset = Some(next),
                None => return Ok(stored),
            }
        }
    }
}

fn check_existing(
    config: Option<&vectors_config::Config>,
    dimension: usize,
) -> Result<(), VectorError> {
    let wanted = format!("dimension {dimension} (Cosine)");
    match config {
        Some(vectors_config::Config::Params(p))
            if p.size == dimension as u64 && p.distance == client::Distance::Cosine as i32 =>
        {
            Ok(())
        }
        Some(vectors_config::Config::Params(p)) => Err(VectorError::Incompatible {
            existing: format!(
                "dimension {} ({:?})",
                p.size,
                client::Distance::try_from(p.distance).unwrap_or(client::Distance::UnknownDistance)
            ),
            wanted,
        }),
        _ => Err(VectorError::Incompatible {
            existing: "no unnamed dense vector".to_owned(),
            wanted,
        }),
    }
}

pub(crate) fn create_collection_request(collection: &str, dimension: usize) -> CreateCollection {
    CreateCollection {
        collection_name: collection.to_owned(),
        vectors_config: Some(VectorsConfig {
            config: Some(vectors_config::Config::Params(VectorParams {
                size: dimension as u64,
                distance: client::Distance::Cosine as i32,
                ..Default::default()
            })),
        }),
        // One graph per tenant instead of a global one: every search filters by namespace.
        hnsw_config: Some(HnswConfigDiff {
            m: Some(0),
            payload_m: Some(16),
            ..Default::default()
        }),
        // Storage placement (RAM, disk) is left to the server's defaults and its operator.
        ..Default::default()
    }
}

pub(crate) fn field_index_requests(collection: &str) -> Vec<CreateFieldIndexCollection> {
    INDEXED_FIELDS
        .iter()
        .map(|(field, kind)| {
            let (field_type, params) = match kind {
                IndexType::Keyword => (
                    FieldType::Keyword,
                    (*field == schema::NAMESPACE).then(|| PayloadIndexParams {
                        index_params: Some(IndexParams::KeywordIndexParams(KeywordIndexParams {
                            is_tenant: Some(true),
                            ..Default::default()
                        })),
                    }),
                ),
                IndexType::Bool => (FieldType::Bool, None),
            };
            CreateFieldIndexCollection {
                collection_name: collection.to_owned(),
                wait: Some(true),
                field_name: (*field).to_owned(),
                field_type: Some(field_type as i32),
                field_index_params: params,
                ..Default::default()
            }
        })
        .collect()
}

fn to_value(value: FieldValue) -> client::Value {
    match value {
        FieldValue::Str(s) => client::Value::from(s),
        FieldValue::Bool(b) => client::Value::from(b),
        FieldValue::List(items) => client::Value::from(items),
    }
}

pub(crate) fn upsert_requests(collection: &str, points: &[VectorPoint]) -> Vec<UpsertPoints> {
    points
        .chunks(UPSERT_BATCH)
        .map(|batch| UpsertPoints {
            collection_name: collection.to_owned(),
            wait: Some(true),
            points: batch
                .iter()
                .map(|point| {
                    let payload: HashMap<String, client::Value> = payload_fields(point)
                        .into_iter()
                        .map(|(k, v)| (k.to_owned(), to_value(v)))
                        .collect();
                    PointStruct {
                        id: Some(client::PointId::from(point.id().to_string())),
                        payload,
                        vectors: Some(client::Vectors::from(point.vector.clone())),
                    }
                })
                .collect(),
            ..Default::default()
        })
        .collect()
}

fn file_selector(namespace: &str, file_id: &str) -> PointsSelector {
    PointsSelector {
        points_selector_one_of: Some(PointsSelectorOneOf::Filter(filter::to_client(
            &filter::file_clause(namespace, file_id),
        ))),
    }
}

pub(crate) fn delete_namespace_request(collection: &str, namespace: &str) -> DeletePoints {
    DeletePoints {
        collection_name: collection.to_owned(),
        wait: Some(true),
        points: Some(PointsSelector {
            points_selector_one_of: Some(PointsSelectorOneOf::Filter(filter::to_client(
                &filter::namespace_clause(namespace),
            ))),
        }),
        ..Default::default()
    }
}

pub(crate) fn delete_file_request(
    collection: &str,
    namespace: &str,
    file_id: &str,
) -> DeletePoints {
    DeletePoints {
        collection_name: collection.to_owned(),
        wait: Some(true),
        points: Some(file_selector(namespace, file_id)),
        ..Default::default()
    }
}

/// Deletes the points of a file but `keep` (the ones a replacement just wrote).
pub(crate) fn prune_file_request(
    collection: &str,
    namespace: &str,
    file_id: &str,
    keep: &[uuid::Uuid],
) -> DeletePoints {
    DeletePoints {
        collection_name: collection.to_owned(),
        wait: Some(true),
        points: Some(PointsSelector {
            points_selector_one_of: Some(PointsSelectorOneOf::Filter(filter::to_client(
                &filter::file_points_except(namespace, file_id, keep),
            ))),
        }),
        ..Default::default()
    }
}

pub(crate) fn set_flags_request(
    collection: &str,
    namespace: &str,
    file_id: &str,
    enabled: bool,
    hidden: bool,
) -> SetPayloadPoints {
    SetPayloadPoints {
        collection_name: collection.to_owned(),
        wait: Some(true),
        payload: HashMap::from([
            (schema::ENABLED.to_owned(), client::Value::from(enabled)),
            (schema::HIDDEN.to_owned(), client::Value::from(hidden)),
        ]),
        points_selector: Some(file_selector(namespace, file_id)),
        ..Default::default()
    }
}

pub(crate) fn query_request(
    collection: &str,
    access: &AccessFilter,
    scope: &Scope,
    vector: Vec<f32>,
    limit: usize,
) -> QueryPoints {
    QueryPoints {
        collection_name: collection.to_owned(),
        query: Some(Query::new_nearest(vector)),
        filter: Some(filter::to_client(&filter::scoped_clause(access, scope))),
        limit: Some(limit as u64),
        with_payload: Some(WithPayloadSelector {
            selector_options: Some(SelectorOptions::Include(PayloadIncludeSelector {
                fields: HIT_FIELDS.iter().map(|f| (*f).to_owned()).collect(),
            })),
        }),
        ..Default::default()
    }
}

pub(crate) fn file_vector_request(
    collection: &str,
    access: &AccessFilter,
    file_id: &str,
) -> ScrollPoints {
    ScrollPoints {
        collection_name: collection.to_owned(),
        filter: Some(filter::to_client(&filter::file_point_clause(
            access, file_id,
        ))),
        limit: Some(1),
        with_payload: Some(WithPayloadSelector {
            selector_options: Some(SelectorOptions::Enable(false)),
        }),
        with_vectors: Some(WithVectorsSelector {
            selector_options: Some(with_vectors_selector::SelectorOptions::Enable(true)),
        }),
        ..Default::default()
    }
}

pub(crate) fn stored_vectors_request(
    collection: &str,
    selection: &filter::Clause,
    offset: Option<client::PointId>,
) -> ScrollPoints {
    ScrollPoints {
        collection_name: collection.to_owned(),
        filter: Some(filter::to_client(selection)),
        offset,
        limit: Some(UPSERT_BATCH as u32),
        with_payload: Some(WithPayloadSelector {
            selector_options: Some(SelectorOptions::Include(PayloadIncludeSelector {
                fields: vec![schema::EMBED_HASH.to_owned()],
            })),
        }),
        with_vectors: Some(WithVectorsSelector {
            selector_options: Some(with_vectors_selector::SelectorOptions::Enable(true)),
        }),
        ..Default::default()
    }
}

/// The unnamed dense vector of a retrieved point.
fn dense_vector(vectors: Option<VectorsOutput>) -> Result<Vec<f32>, VectorError> {
    match vectors.and_then(|v| v.vectors_options) {
        Some(vectors_output::VectorsOptions::Vector(output)) => match output.into_vector() {
            client::vector_output::Vector::Dense(dense) => Ok(dense.data),
            _ => Err(VectorError::internal("a file point without a dense vector")),
        },
        _ => Err(VectorError::internal("a file point without a dense vector")),
    }
}

pub(crate) fn count_request(collection: &str, access: &AccessFilter, scope: &Scope) -> CountPoints {
    CountPoints {
        collection_name: collection.to_owned(),
        filter: Some(filter::to_client(&filter::scoped_clause(access, scope))),
        exact: Some(true),
        ..Default::default()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::vector::PointKind;

    fn point(i: usize) -> VectorPoint {
        VectorPoint {
            text_hash: None,
            embed_hash: None,
            namespace: "alpha".into(),
            kind: PointKind::Chunk,
            chunk_key: format!("c{i}"),
            file_id: "f1".into(),
            path: "guides/intro.md".into(),
            enabled: true,
            hidden: false,
            collections: vec!["hr".into()],
            document_date: Some("2024-05-01".into()),
            vector: vec![1.0, 0.0, 0.5],
        }
    }

    fn string(v: &client::Value) -> Option<&str> {
        match v.kind.as_ref()? {
            Kind::StringValue(s) => Some(s),
            _ => None,
        }
    }

    #[test]
    fn collection_is_cosine_multitenant() {
        let c = create_collection_request("kg", 384);
        let Some(vectors_config::Config::Params(p)) = c.vectors_config.and_then(|v| v.config)
        else {
            panic!("no vector params")
        };
        assert_eq!(p.size, 384);
        assert_eq!(p.distance, client::Distance::Cosine as i32);
        assert_eq!(c.hnsw_config.unwrap().payload_m, Some(16));
        let indexes = field_index_requests("kg");
        assert_eq!(indexes.len(), INDEXED_FIELDS.len());
        let ns = indexes
            .iter()
            .find(|r| r.field_name == schema::NAMESPACE)
            .unwrap();
        assert!(matches!(
            ns.field_index_params
                .as_ref()
                .and_then(|p| p.index_params.as_ref()),
            Some(IndexParams::KeywordIndexParams(KeywordIndexParams {
                is_tenant: Some(true),
                ..
            }))
        ));
        assert!(
            !indexes
                .iter()
                .any(|r| r.field_name == schema::ANCHORED_PATH)
        );
        let hidden = indexes
            .iter()
            .find(|r| r.field_name == schema::HIDDEN)
            .unwrap();
        assert_eq!(hidden.field_type, Some(FieldType::Bool as i32));
    }

    #[test]
    fn upserts_are_batched_with_the_shared_payload() {
        let points: Vec<_> = (0..UPSERT_BATCH * 2 + 3).map(point).collect();
        let requests = upsert_requests("kg", &points);
        assert_eq!(
            requests.iter().map(|r| r.points.len()).collect::<Vec<_>>(),
            vec![UPSERT_BATCH, UPSERT_BATCH, 3]
        );
        assert!(requests.iter().all(|r| r.wait == Some(true)));
        let first = &requests[0].points[0];
        let id = first
            .id
            .as_ref()
            .unwrap()
            .point_id_options
            .as_ref()
            .unwrap();
        assert_eq!(
            id,
            &client::point_id::PointIdOptions::Uuid(points[0].id().to_string())
        );
        let get = |k: &str| first.payload.get(k).and_then(string);
        assert_eq!(get(schema::NAMESPACE), Some("alpha"));
        assert_eq!(get(schema::CHUNK_KEY), Some("c0"));
        assert_eq!(get(schema::FOLDER_PATH), Some("guides/"));
        assert_eq!(get(schema::ANCHORED_PATH), Some("\u{1}guides/intro.md"));
        assert_eq!(get(schema::KIND), Some("chunk"));
        assert_eq!(get(schema::DOCUMENT_DATE), Some("2024-05-01"));
        let Some(Kind::ListValue(prefixes)) = first
            .payload
            .get(schema::FOLDER_PREFIXES)
            .and_then(|v| v.kind.clone())
        else {
            panic!("folderPrefixes is not a list")
        };
        assert_eq!(
            prefixes.iter().filter_map(string).collect::<Vec<_>>(),
            vec!["guides/"]
        );
        assert_eq!(
            first
                .payload
                .get(schema::ENABLED)
                .and_then(|v| v.kind.clone()),
            Some(Kind::BoolValue(true))
        );
    }

    #[test]
    fn queries_carry_the_compiled_access_filter() {
        let access = AccessFilter {
            namespace: "alpha".into(),
            allow_prefixes: vec!["guides/".into()],
            deny_file_ids: vec!["f9".into()],
            enabled_only: true,
            ..Default::default()
        };
        let scope = Scope::files();
        let q = query_request("kg", &access, &scope, vec![1.0, 0.0, 0.0], 7);
        assert_eq!(q.limit, Some(7));
        assert_eq!(
            q.filter,
            Some(filter::to_client(&filter::scoped_clause(&access, &scope)))
        );
        let Some(SelectorOptions::Include(fields)) =
            q.with_payload.and_then(|w| w.selector_options)
        else {
            panic!("payload selector")
        };
        assert_eq!(fields.fields, HIT_FIELDS.map(str::to_owned).to_vec());
        let c = count_request("kg", &access, &scope);
        assert_eq!(c.exact, Some(true));
        assert_eq!(c.filter, q.filter);
        // The access part alone is what access_filter_server returns.
        let must = &c.filter.unwrap().must;
        assert!(must.len() > filter::access_filter_server(&access).must.len());
    }

    #[test]
    fn file_operations_select_by_namespace_and_file() {
        let want = Some(PointsSelector {
            points_selector_one_of: Some(PointsSelectorOneOf::Filter(filter::to_client(
                &filter::file_clause("alpha", "f1"),
            ))),
        });
        let d = delete_file_request("kg", "alpha", "f1");
        assert_eq!(d.points, want);
        assert_eq!(d.wait, Some(true));
        // A replacement's prune: the same file, less the points just written.
        let keep = [crate::vector::point_id("alpha", PointKind::Chunk, "k1")];
        let p = prune_file_request("kg", "alpha", "f1", &keep);
        assert_eq!((p.collection_name.as_str(), p.wait), ("kg", Some(true)));
        assert_eq!(
            p.points,
            Some(PointsSelector {
                points_selector_one_of: Some(PointsSelectorOneOf::Filter(filter::to_client(
                    &filter::file_points_except("alpha", "f1", &keep),
                ))),
            })
        );
        // A namespace's deletion selects by the namespace alone.
        let n = delete_namespace_request("kg", "alpha");
        let Some(PointsSelectorOneOf::Filter(by_namespace)) =
            n.points.and_then(|p| p.points_selector_one_of)
        else {
            panic!("a namespace is deleted by filter");
        };
        assert_eq!(
            (
                by_namespace.must.len(),
                by_namespace.should.len(),
                by_namespace.must_not.len()
            ),
            (1, 0, 0)
        );
        assert_eq!((n.collection_name.as_str(), n.wait), ("kg", Some(true)));
        let s = set_flags_request("kg", "alpha", "f1", false, true);
        assert_eq!(s.points_selector, want);
        assert_eq!(
            s.payload.get(schema::ENABLED).and_then(|v| v.kind.clone()),
            Some(Kind::BoolValue(false))
        );
        assert_eq!(
            s.payload.get(schema::HIDDEN).and_then(|v| v.kind.clone()),
            Some(Kind::BoolValue(true))
        );
    }

    #[test]
    fn file_vectors_are_read_under_the_access_filter() {
        let access = AccessFilter {
            namespace: "alpha".into(),
            allow_prefixes: vec!["guides/".into()],
            enabled_only: true,
            ..Default::default()
        };
        let r = file_vector_request("kg", &access, "f1");
        assert_eq!(r.limit, Some(1));
        assert_eq!(
            r.filter,
            Some(filter::to_client(&filter::file_point_clause(&access, "f1")))
        );
        let text = format!("{:?}", r.filter);
        assert!(
            text.contains("\"file\"") && text.contains("\"f1\""),
            "{text}"
        );
        assert!(text.contains("guides/"), "{text}");
        assert_eq!(
            r.with_vectors.and_then(|w| w.selector_options),
            Some(with_vectors_selector::SelectorOptions::Enable(true))
        );
        let output = |vector| {
            Some(VectorsOutput {
                vectors_options: Some(vectors_output::VectorsOptions::Vector(
                    client::VectorOutput {
                        vector: Some(vector),
                        ..Default::default()
                    },
                )),
            })
        };
        let dense = client::vector_output::Vector::Dense(client::DenseVector {
            data: vec![0.5, 0.5],
        });
        assert_eq!(dense_vector(output(dense)).unwrap(), vec![0.5, 0.5]);
        let sparse = client::vector_output::Vector::Sparse(client::SparseVector::default());
        assert!(dense_vector(output(sparse)).is_err());
        assert!(dense_vector(None).is_err());
    }

    #[test]
    fn a_files_stored_vectors_are_paged_with_their_embed_hash() {
        let first = stored_vectors_request("kg", &filter::file_chunks_clause("alpha", "f1"), None);
        assert_eq!(first.collection_name, "kg");
        assert_eq!(
            first.filter,
            Some(filter::to_client(&filter::file_chunks_clause(
                "alpha", "f1"
            )))
        );
        let text = format!("{:?}", first.filter);
        for value in ["\"alpha\"", "\"f1\"", "\"chunk\""] {
            assert!(text.contains(value), "{value} in {text}");
        }
        assert_eq!(
            (first.offset, first.limit),
            (None, Some(UPSERT_BATCH as u32))
        );
        assert_eq!(
            first.with_payload.and_then(|w| w.selector_options),
            Some(SelectorOptions::Include(PayloadIncludeSelector {
                fields: vec![schema::EMBED_HASH.to_owned()],
            }))
        );
        assert_eq!(
            first.with_vectors.and_then(|w| w.selector_options),
            Some(with_vectors_selector::SelectorOptions::Enable(true))
        );
        let next = client::PointId::from("0190a3c2-0000-7000-8000-000000000000".to_owned());
        let second = stored_vectors_request(
            "kg",
            &filter::file_chunks_clause("alpha", "f1"),
            Some(next.clone()),
        );
        assert_eq!(second.offset, Some(next));
    }

    #[test]
    fn existing_collections_are_checked() {
        let ok = vectors_config::Config::Params(VectorParams {
            size: 4,
            distance: client::Distance::Cosine as i32,
            ..Default::default()
        });
        assert!(check_existing(Some(&ok), 4).is_ok());
        assert!(matches!(
            check_existing(Some(&ok), 8),
            Err(VectorError::Incompatible { .. })
        ));
        let dot = vectors_config::Config::Params(VectorParams {
            size: 4,
            distance: client::Distance::Dot as i32,
            ..Default::default()
        });
        assert!(check_existing(Some(&dot), 4).is_err());
        assert!(check_existing(None, 4).is_err());
    }

    #[tokio::test]
    async fn an_unreachable_server_is_unavailable_not_empty() {
        // Nothing listens on port 1: the call must fail, never return no hits.
        let index = ServerIndex::connect("http://127.0.0.1:1", None, "kg", 3).unwrap();
        let err = index
            .search(
                &AccessFilter {
                    namespace: "alpha".into(),
                    allow_prefixes: vec![String::new()],
                    ..Default::default()
                },
                &Scope::chunks(),
                vec![1.0, 0.0, 0.0],
                5,
            )
            .await
            .unwrap_err();
        assert!(matches!(err, VectorError::Unavailable { .. }), "{err:?}");
        assert!(format!("{index:?}").contains("kg"));
    }
}
