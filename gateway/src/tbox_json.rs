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
    #[serde(default, deserialize_with = "objects")]
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
    #[serde(default, alias = "entity_types", deserialize_with = "objects")]
    pub entity_types: Vec<EntityTypeJson>,
    #[serde(default, alias = "relation_types", deserialize_with = "objects")]
    pub relation_types: Vec<RelationTypeJson>,
}

/// A list whose entries are objects of named fields. serde reads a struct from an array too,
/// so `"entityTypes": [["person", "Person"]]` was taken field by field and saved.
fn objects<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Entry<T>(T);
    impl<'de, T: Deserialize<'de>> Deserialize<'de> for Entry<T> {
        fn deserialize<E: serde::Deserializer<'de>>(entry: E) -> Result<Self, E::Error> {
            struct Fields<T>(std::marker::PhantomData<T>);
            impl<'de, T: Deserialize<'de>> serde::de::Visitor<'de> for Fields<T> {
                type Value = T;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("an object of named fields")
                }
                fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                    T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                }
            }
            entry
                .deserialize_map(Fields(std::marker::PhantomData))
                .map(Entry)
        }
    }
    let entries = Vec::<Entry<T>>::deserialize(deserializer)?;
    Ok(entries.into_iter().map(|Entry(entry)| entry).collect())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn entries_are_objects_never_arrays_read_field_by_field() {
        let body = json!({
            "entityTypes": [{"typeId": "org", "label": "Organization",
                             "instances": [{"name": "Acme"}]}],
            "relationTypes": [{"relationTypeId": "owns", "label": "owns"}],
        });
        let read: TboxBody = serde_json::from_value(body).unwrap();
        assert_eq!(read.entity_types[0].instances[0].name, "Acme");
        for positional in [
            json!({"entityTypes": [["person", "Person"]]}),
            json!({"relationTypes": [["a", "b", "c", "d"]]}),
            json!({"entityTypes": [{"typeId": "org", "label": "O", "instances": [["Acme"]]}]}),
        ] {
            let err = serde_json::from_value::<TboxBody>(positional.clone())
                .err()
                .unwrap_or_else(|| panic!("{positional} was read"));
            assert!(
                err.to_string().contains("an object of named fields"),
                "{err}"
            );
        }
    }
}
