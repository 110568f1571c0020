//! A TBox as the admin REST reads and writes it (camelCase JSON), which is also the file
//! `kgmesh tbox draft --file` reads (YAML or JSON; snake_case names are taken too, so a file
//! written either way works in both places), with its conversions to and from `kg.v1`.

use kg_proto::v1::{EntityInstance, EntityType, RelationType};
use serde::{Deserialize, Serialize};

/// An entity type.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EntityTypeJson {
    #[serde(alias = "type_id")]
    type_id: String,
    label: String,
    #[serde(default)]
    aliases: Vec<String>,
    #[serde(default)]
    patterns: Vec<String>,
    #[serde(default)]
    side: String,
    #[serde(default)]
    instances: Vec<InstanceJson>,
}

/// A known instance of an entity type: its canonical name and other surface forms.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InstanceJson {
    name: String,
    #[serde(default)]
    aliases: Vec<String>,
}

/// A relation type; `patterns` are its templates (`"{source} works at {target}"`).
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RelationTypeJson {
    #[serde(alias = "relation_type_id")]
    relation_type_id: String,
    label: String,
    #[serde(default, alias = "source_type_id")]
    source_type_id: String,
    #[serde(default, alias = "target_type_id")]
    target_type_id: String,
    #[serde(default)]
    patterns: Vec<String>,
}

impl From<EntityType> for EntityTypeJson {
    fn from(t: EntityType) -> Self {
        Self {
            type_id: t.type_id,
            label: t.label,
            aliases: t.aliases,
            patterns: t.patterns,
            side: t.side,
            instances: t
                .instances
                .into_iter()
                .map(|i| InstanceJson {
                    name: i.name,
                    aliases: i.aliases,
                })
                .collect(),
        }
    }
}

impl From<EntityTypeJson> for EntityType {
    fn from(t: EntityTypeJson) -> Self {
        Self {
            type_id: t.type_id,
            label: t.label,
            aliases: t.aliases,
            patterns: t.patterns,
            side: t.side,
            instances: t
                .instances
                .into_iter()
                .map(|i| EntityInstance {
                    name: i.name,
                    aliases: i.aliases,
                })
                .collect(),
        }
    }
}

impl From<RelationType> for RelationTypeJson {
    fn from(r: RelationType) -> Self {
        Self {
            relation_type_id: r.relation_type_id,
            label: r.label,
            source_type_id: r.source_type_id,
            target_type_id: r.target_type_id,
            patterns: r.patterns,
        }
    }
}

impl From<RelationTypeJson> for RelationType {
    fn from(r: RelationTypeJson) -> Self {
        Self {
            relation_type_id: r.relation_type_id,
            label: r.label,
            source_type_id: r.source_type_id,
            target_type_id: r.target_type_id,
            patterns: r.patterns,
        }
    }
}

/// The body of `PUT .../tbox/draft`, and the file `kgmesh tbox draft --file` reads.
#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TboxBody {
    #[serde(default, alias = "entity_types")]
    pub entity_types: Vec<EntityTypeJson>,
    #[serde(default, alias = "relation_types")]
    pub relation_types: Vec<RelationTypeJson>,
}
