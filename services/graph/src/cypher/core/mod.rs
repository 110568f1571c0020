//! The kg_cypher language core: lexer, parser, validator/rewriter and printer for the read
//! subset of openCypher. It depends on nothing but `std`, so the fuzz target compiles it alone.

pub mod ast;
pub mod check;
pub mod lexer;
pub mod parser;
pub mod printer;

use std::fmt;

pub use check::{Column, Guard, Rewritten, Target, rewrite, verify};

/// The rule a refused statement broke. `as_str` is stable and appears in every message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// The text is not in the accepted grammar.
    Syntax,
    /// Too long or nested too deep.
    Size,
    /// More than one statement (`;`, UNION).
    OneStatement,
    /// A write clause or a clause that reads outside the graph.
    ReadOnly,
    /// CALL, namespaced functions or procedures.
    Procedures,
    /// A node without exactly one allowed label.
    Label,
    /// A relationship without exactly one allowed type.
    RelationshipType,
    /// `*` ranges, shortestPath.
    VariableLength,
    /// Named paths and patterns inside expressions.
    Path,
    /// The final RETURN has no literal LIMIT from 1 to 50.
    Limit,
    /// SKIP (use keyset paging).
    Skip,
    /// An Entity, OutlineNode or Folder not reached from a Chunk or FileRef.
    Anchor,
    /// A name or parameter in the rewrite's reserved `kg_` space.
    ReservedName,
    /// A function outside the allowlist, or an aggregate where none may be.
    Function,
    /// An unknown, rebound or mistyped variable.
    Variable,
    /// Clause order and projection rules (RETURN last, aliases, `*`).
    Projection,
}

impl Rule {
    /// The stable rule name.
    pub fn as_str(self) -> &'static str {
        match self {
            Rule::Syntax => "syntax",
            Rule::Size => "size",
            Rule::OneStatement => "one_statement",
            Rule::ReadOnly => "read_only",
            Rule::Procedures => "no_procedures",
            Rule::Label => "node_label",
            Rule::RelationshipType => "relationship_type",
            Rule::VariableLength => "one_hop",
            Rule::Path => "no_paths",
            Rule::Limit => "limit",
            Rule::Skip => "no_skip",
            Rule::Anchor => "anchor",
            Rule::ReservedName => "reserved_name",
            Rule::Function => "function",
            Rule::Variable => "variable",
            Rule::Projection => "projection",
        }
    }
}

/// Why a statement was refused: the rule and how to fix the query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The rule broken.
    pub rule: Rule,
    /// What was wrong and how to fix it.
    pub message: String,
}

impl Refusal {
    /// A refusal of `rule`.
    pub fn new(rule: Rule, message: impl Into<String>) -> Self {
        Refusal {
            rule,
            message: message.into(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kg_cypher rule `{}`: {}",
            self.rule.as_str(),
            self.message
        )
    }
}

impl std::error::Error for Refusal {}
