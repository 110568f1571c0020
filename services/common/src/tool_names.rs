//! The MCP tool names kgmesh's built-in tools use. A client sees one flat list of tool names,
//! so an ontology project may not generate one of these (the ontology service refuses such a
//! project; the gateway's registry test keeps this list true to its tools).

/// Every built-in tool but [`BUILTIN_UNPREFIXED`] starts with this.
pub const BUILTIN_PREFIX: &str = "kg_";

/// Built-in tools named without [`BUILTIN_PREFIX`].
pub const BUILTIN_UNPREFIXED: &[&str] = &["get_knowledge_graph"];

/// Whether `name` is, or could become, a built-in tool's name.
pub fn is_reserved(name: &str) -> bool {
    name.starts_with(BUILTIN_PREFIX) || BUILTIN_UNPREFIXED.contains(&name)
}
