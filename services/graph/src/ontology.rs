//! Ontology: the published TBox of a namespace, read from the `KG_TBOX` bucket.

use kg_proto::v1::{CallerContext, OntologyRequest, OntologyResponse};

use crate::error::{GraphError, Result};
use crate::service::GraphService;

impl GraphService {
    /// The namespace's published entity and relation types (relation source and target
    /// types are its PATTERN endpoints). Nothing published is a valid, empty answer.
    pub async fn ontology_for(
        &self,
        caller: &CallerContext,
        request: OntologyRequest,
    ) -> Result<OntologyResponse> {
        let scope = self.scope(caller, &request.namespace)?;
        let bucket = self.tbox.as_ref().ok_or_else(|| {
            GraphError::Unavailable(
                "the published-TBox store is not connected to this graph service".to_owned(),
            )
        })?;
        let Some(tbox) = bucket.get(scope.namespace).await? else {
            return Ok(OntologyResponse {
                namespace: scope.namespace.to_owned(),
                ..Default::default()
            });
        };
        Ok(OntologyResponse {
            namespace: scope.namespace.to_owned(),
            published: true,
            version: tbox.version,
            published_at_ms: tbox.published_at_ms,
            entity_types: tbox.entity_types,
            relation_types: tbox.relation_types,
        })
    }
}
