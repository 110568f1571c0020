//! Validation and rewrite in one pass over the clauses, with a scope of what each variable is.
//!
//! Every Chunk, FileRef and OutlineNode variable and every REL edge gets the caller's access
//! predicate in the WHERE of the very clause that binds it (an OPTIONAL MATCH included), so no
//! later clause, aggregate or optional row can observe a denied row. [`verify`] re-parses the
//! printed text and checks that property independently; the fuzz target runs it.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::ast::*;
use super::parser::parse_statement;
use super::printer::print_statement;
use super::{Refusal, Rule};

/// Largest literal LIMIT on the final RETURN.
pub const MAX_LIMIT: i64 = 50;
/// Largest literal LIMIT on a WITH.
pub const MAX_WITH_LIMIT: i64 = 10_000;
/// Prefix reserved for the rewrite's variables and parameters.
pub const RESERVED_PREFIX: &str = "kg_";

/// Node labels a pattern may use.
pub const LABELS: &[&str] = &[
    "Chunk",
    "FileRef",
    "Entity",
    "EntityType",
    "OutlineNode",
    "Folder",
];
/// Relationship types a pattern may use.
pub const REL_TYPES: &[&str] = &[
    "PART_OF",
    "NEXT_CHUNK",
    "HAS_CHILD",
    "COVERS",
    "HAS_SUBSECTION",
    "MENTIONS",
    "INSTANCE_OF",
    "REL",
];
/// Aggregating functions (lowercase).
pub const AGGREGATES: &[&str] = &["count", "collect", "sum", "avg", "min", "max"];
/// Other functions (lowercase).
pub const FUNCTIONS: &[&str] = &[
    "tolower",
    "toupper",
    "trim",
    "ltrim",
    "rtrim",
    "size",
    "id",
    "labels",
    "type",
    "coalesce",
    "tostring",
    "tointeger",
    "tofloat",
    "toboolean",
    "substring",
    "left",
    "right",
    "replace",
    "split",
    "reverse",
    "head",
    "last",
    "abs",
    "round",
    "floor",
    "ceil",
    "sign",
    "keys",
    "properties",
];

/// What a guard predicate protects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A Chunk node (`path`).
    Chunk,
    /// A FileRef node (`vfsPath`).
    FileRef,
    /// An OutlineNode (`path`).
    OutlineNode,
    /// A REL edge (`path` of the stating file).
    Rel,
}

impl Target {
    /// The property holding the file path the access filter reads.
    pub fn path_property(self) -> &'static str {
        match self {
            Target::FileRef => "vfsPath",
            Target::Chunk | Target::OutlineNode | Target::Rel => "path",
        }
    }

    fn of_label(label: &str) -> Option<Target> {
        match label {
            "Chunk" => Some(Target::Chunk),
            "FileRef" => Some(Target::FileRef),
            "OutlineNode" => Some(Target::OutlineNode),
            _ => None,
        }
    }
}

/// Builds the access predicate over `var`. It must only mention `var` and reserved parameters.
pub trait Guard {
    /// The predicate expression for `var`.
    fn predicate(&self, var: &str, target: Target) -> Expr;
}

/// One output column.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Column {
    /// The column name FalkorDB reports (alias or printed expression).
    pub name: String,
    /// The node label when the column is a bare node variable.
    pub label: Option<&'static str>,
}

/// An accepted statement after the rewrite.
#[derive(Debug, Clone, PartialEq)]
pub struct Rewritten {
    /// The rewritten tree.
    pub statement: Statement,
    /// The rewritten statement as text.
    pub text: String,
    /// The RETURN columns.
    pub columns: Vec<Column>,
    /// The user parameters the statement references.
    pub params: Vec<String>,
    /// The final LIMIT.
    pub limit: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Node(&'static str),
    Rel,
    Value,
}

/// Parses, validates and rewrites `src` under `guard`.
pub fn rewrite(src: &str, guard: &dyn Guard) -> Result<Rewritten, Refusal> {
    let stmt = parse_statement(src)?;
    Checker {
        guard,
        scope: HashMap::new(),
        params: Vec::new(),
        fresh: 0,
    }
    .run(stmt)
}

struct Checker<'g> {
    guard: &'g dyn Guard,
    scope: HashMap<String, Kind>,
    params: Vec<String>,
    fresh: usize,
}

fn refuse(rule: Rule, message: impl Into<String>) -> Refusal {
    Refusal::new(rule, message)
}

fn reserved_name(name: &str, what: &str) -> Result<(), Refusal> {
    if name.len() >= RESERVED_PREFIX.len()
        && name[..RESERVED_PREFIX.len()].eq_ignore_ascii_case(RESERVED_PREFIX)
    {
        return Err(refuse(
            Rule::ReservedName,
            format!(
                "{what} `{name}` starts with `{RESERVED_PREFIX}`, which the access rewrite reserves; rename it"
            ),
        ));
    }
    Ok(())
}

const SKIP_HELP: &str = "SKIP is not accepted: page with a key instead. Return ID(n) AS id, ORDER BY ID(n), and for the next page add WHERE ID(n) > $afterId with params {\"afterId\": <last id>}";

impl Checker<'_> {
    fn run(mut self, stmt: Statement) -> Result<Rewritten, Refusal> {
        let count = stmt.clauses.len();
        let mut out = Vec::with_capacity(count);
        let mut columns = Vec::new();
        let mut limit = 0;
        for (i, clause) in stmt.clauses.into_iter().enumerate() {
            let last = i + 1 == count;
            let clause = match clause {
                Clause::Match(m) => Clause::Match(self.match_clause(m)?),
                Clause::Unwind { expr, alias } => {
                    self.expr(&expr, false)?;
                    self.bind_value(&alias)?;
                    Clause::Unwind { expr, alias }
                }
                Clause::With(mut p) => {
                    self.projection(&p, true)?;
                    // FalkorDB moves a WITH's WHERE down to where its variables are bound,
                    // possibly before an earlier MATCH's guards; a value this WITH computes
                    // keeps it here, after every guard of the clauses before.
                    if let Some(user) = p.where_.take() {
                        let mut conjuncts = Vec::new();
                        flatten_and(&user, &mut conjuncts);
                        p.where_ = if conjuncts.iter().all(|c| cannot_fail(c)) {
                            Some(user)
                        } else {
                            let barrier = self.fresh("w");
                            p.items.push(Item {
                                expr: Expr::Lit(Literal::Bool(true)),
                                alias: Some(barrier.clone()),
                            });
                            fail_only_when_bound(&[barrier], user)
                        };
                    }
                    Clause::With(p)
                }
                Clause::Return(p) => {
                    if !last {
                        return Err(refuse(
                            Rule::Projection,
                            "RETURN must be the last clause; use WITH to pass rows on to later clauses",
                        ));
                    }
                    (columns, limit) = self.projection(&p, false)?;
                    Clause::Return(p)
                }
            };
            out.push(clause);
        }
        if !matches!(out.last(), Some(Clause::Return(_))) {
            return Err(refuse(
                Rule::Projection,
                "the statement must end with RETURN ... LIMIT n (n from 1 to 50)",
            ));
        }
        let statement = Statement { clauses: out };
        let text = print_statement(&statement);
        Ok(Rewritten {
            statement,
            text,
            columns,
            params: self.params,
            limit,
        })
    }

    fn bind_value(&mut self, name: &str) -> Result<(), Refusal> {
        reserved_name(name, "variable")?;
        if self.scope.contains_key(name) {
            return Err(refuse(
                Rule::Variable,
                format!("variable `{name}` is already bound; pick another name"),
            ));
        }
        self.scope.insert(name.to_owned(), Kind::Value);
        Ok(())
    }

    fn fresh(&mut self, kind: &str) -> String {
        self.fresh += 1;
        format!("{RESERVED_PREFIX}{kind}{}", self.fresh)
    }

    fn match_clause(&mut self, mut m: Match) -> Result<Match, Refusal> {
        // Node slots of this clause: key -> (label, bound before this clause).
        let mut slots: BTreeMap<String, (&'static str, bool)> = BTreeMap::new();
        let mut order: Vec<String> = Vec::new();
        let mut edges: Vec<(String, String, &'static str, Direction)> = Vec::new();
        let mut guards: Vec<(String, Target)> = Vec::new();
        let mut rel_guards: Vec<(String, Target)> = Vec::new();
        let mut new_rels: HashSet<String> = HashSet::new();
        let mut anon = 0usize;

        for pattern in &mut m.patterns {
            let mut prev = self.node_slot(&mut pattern.start, &mut slots, &mut order, &mut anon)?;
            for (rel, node) in &mut pattern.hops {
                let rel_type = self.rel_check(rel)?;
                let next = self.node_slot(node, &mut slots, &mut order, &mut anon)?;
                if let Some(v) = &rel.var {
                    reserved_name(v, "variable")?;
                }
                if rel_type == "REL" && rel.var.is_none() {
                    rel.var = Some(self.fresh("r"));
                }
                if let Some(v) = &rel.var {
                    if self.scope.contains_key(v) || !new_rels.insert(v.clone()) {
                        return Err(refuse(
                            Rule::Variable,
                            format!(
                                "relationship variable `{v}` is already bound; give each relationship its own name"
                            ),
                        ));
                    }
                    if rel_type == "REL" {
                        rel_guards.push((v.clone(), Target::Rel));
                    }
                }
                edges.push((prev.clone(), next.clone(), rel_type, rel.direction));
                prev = next;
            }
        }

        // Anchoring: grow the set of nodes reached from a readable Chunk or FileRef.
        let mut ok: HashSet<String> = slots
            .iter()
            .filter(|(_, (label, before))| {
                *before || matches!(*label, "Chunk" | "FileRef" | "EntityType")
            })
            .map(|(k, _)| k.clone())
            .collect();
        loop {
            let mut grew = false;
            for (a, b, t, dir) in &edges {
                let la = slots.get(a).map_or("", |s| s.0);
                let lb = slots.get(b).map_or("", |s| s.0);
                for (x, lx, y, ly, x_is_source) in [
                    (a, la, b, lb, *dir != Direction::Left),
                    (b, lb, a, la, *dir == Direction::Left),
                ] {
                    if ok.contains(y) {
                        continue;
                    }
                    let reached = match (*t, lx, ly) {
                        ("MENTIONS", "Chunk", "Entity") => true,
                        ("REL", "Entity", "Entity") => ok.contains(x),
                        ("COVERS", "Chunk", "OutlineNode") => true,
                        ("HAS_SUBSECTION", "OutlineNode", "OutlineNode") => ok.contains(x),
                        // A folder is readable as the parent of a readable file or folder.
                        ("HAS_CHILD", "FileRef", "Folder") => {
                            *dir == Direction::Both || !x_is_source
                        }
                        ("HAS_CHILD", "Folder", "Folder") => {
                            ok.contains(x) && *dir != Direction::Both && !x_is_source
                        }
                        _ => false,
                    };
                    if reached {
                        ok.insert(y.clone());
                        grew = true;
                    }
                }
            }
            if !grew {
                break;
            }
        }
        for key in &order {
            if ok.contains(key) {
                continue;
            }
            let label = slots.get(key).map_or("", |s| s.0);
            let name = if key.starts_with('#') {
                format!("an anonymous {label} node")
            } else {
                format!("{label} `{key}`")
            };
            let how = match label {
                "Entity" => {
                    "reach it from a chunk: (c:Chunk)-[:MENTIONS]->(e:Entity), or through a REL from such an entity"
                }
                "OutlineNode" => {
                    "reach it from a chunk: (o:OutlineNode)-[:COVERS]->(c:Chunk), or through HAS_SUBSECTION from such a heading"
                }
                "Folder" => {
                    "reach it as the parent of a file: (d:Folder)-[:HAS_CHILD]->(f:FileRef), or as the parent of such a folder"
                }
                _ => "connect it to a Chunk or FileRef in the same pattern",
            };
            return Err(refuse(
                Rule::Anchor,
                format!(
                    "{name} is not connected to a readable Chunk or FileRef in this MATCH; {how}"
                ),
            ));
        }

        // Pattern property maps may only read what was bound before this clause: a value read
        // from a node of this same pattern would be compared wherever FalkorDB binds both,
        // which can be before the guards run.
        for pattern in &m.patterns {
            for props in std::iter::once(&pattern.start.props)
                .chain(pattern.hops.iter().flat_map(|(r, n)| [&r.props, &n.props]))
            {
                for (_, e) in props {
                    if let Some(v) = vars_of(e).into_iter().find(|v| {
                        slots.get(v).is_some_and(|(_, before)| !before) || new_rels.contains(v)
                    }) {
                        return Err(refuse(
                            Rule::Variable,
                            format!(
                                "a property map in this MATCH reads `{v}`, which the same MATCH binds; compare the two in WHERE instead"
                            ),
                        ));
                    }
                }
            }
        }

        // New Chunk / FileRef / OutlineNode variables get the predicate in this clause.
        for key in &order {
            if let Some((label, before)) = slots.get(key)
                && !before
                && let Some(target) = Target::of_label(label)
            {
                guards.push((key.clone(), target));
            }
        }
        guards.extend(rel_guards);
        for (key, (label, before)) in &slots {
            if !before && !key.starts_with('#') {
                self.scope.insert(key.clone(), Kind::Node(label));
            }
        }
        for v in &new_rels {
            self.scope.insert(v.clone(), Kind::Rel);
        }
        // Pattern property maps may only read what is bound.
        for pattern in &m.patterns {
            for props in std::iter::once(&pattern.start.props)
                .chain(pattern.hops.iter().flat_map(|(r, n)| [&r.props, &n.props]))
            {
                for (_, e) in props {
                    self.expr(e, false)?;
                }
            }
        }
        if let Some(w) = &m.where_ {
            self.expr(w, false)?;
        }
        // One flat conjunction: guards first, then the user's WHERE as a single operand.
        let mut predicate: Option<Expr> = None;
        for (var, target) in &guards {
            let p = self.guard.predicate(var, *target);
            let mut parts = Vec::new();
            flatten_and(&p, &mut parts);
            for part in parts {
                predicate = Some(match predicate {
                    None => part.clone(),
                    Some(acc) => Expr::and(acc, part.clone()),
                });
            }
        }
        // FalkorDB places each top-level conjunct where its variables are first bound and
        // evaluates both arms of AND and CASE, so a condition on an entity alone can run on
        // entities no readable chunk mentions, before the chunk's guard. A condition that
        // cannot fail only filters rows the guards drop anyway; one that can fail (a division
        // by zero, a type mismatch) would answer whether such an entity exists, so those are
        // tied to every variable of the pattern: they run on whole matches only, after the
        // guards, which come first where both land together.
        let pattern_vars = pattern_variables(&m);
        let user = m
            .where_
            .take()
            .and_then(|user| fail_only_when_bound(&pattern_vars, user));
        m.where_ = match (predicate, user) {
            (Some(p), Some(user)) => Some(Expr::and(p, user)),
            (p, user) => p.or(user),
        };
        Ok(m)
    }

    /// Checks one node pattern and returns its slot key (the variable, or a fresh one).
    fn node_slot(
        &mut self,
        node: &mut NodePattern,
        slots: &mut BTreeMap<String, (&'static str, bool)>,
        order: &mut Vec<String>,
        anon: &mut usize,
    ) -> Result<String, Refusal> {
        if node.labels.len() > 1 {
            return Err(refuse(
                Rule::Label,
                format!(
                    "a node has {} labels; give each node exactly one of {}",
                    node.labels.len(),
                    LABELS.join(", ")
                ),
            ));
        }
        let written = match node.labels.first() {
            Some(l) => match LABELS.iter().find(|x| **x == l.as_str()) {
                Some(x) => Some(*x),
                None => {
                    return Err(refuse(
                        Rule::Label,
                        format!(
                            "label `{l}` is not in the graph; use one of {} (labels are case-sensitive)",
                            LABELS.join(", ")
                        ),
                    ));
                }
            },
            None => None,
        };
        let Some(var) = node.var.clone() else {
            let Some(label) = written else {
                return Err(refuse(
                    Rule::Label,
                    format!(
                        "a node pattern has no label; write e.g. (c:Chunk) with one of {}",
                        LABELS.join(", ")
                    ),
                ));
            };
            if Target::of_label(label).is_some() {
                // Anonymous readable nodes still need a name for their predicate.
                let v = self.fresh("n");
                node.var = Some(v.clone());
                slots.insert(v.clone(), (label, false));
                order.push(v.clone());
                return Ok(v);
            }
            *anon += 1;
            let key = format!("#{anon}");
            slots.insert(key.clone(), (label, false));
            order.push(key.clone());
            return Ok(key);
        };
        reserved_name(&var, "variable")?;
        let known = match self.scope.get(&var) {
            Some(Kind::Node(l)) => Some((*l, true)),
            Some(_) => {
                return Err(refuse(
                    Rule::Variable,
                    format!(
                        "`{var}` is not a node here (it holds a value or a relationship); give the node its own variable and label"
                    ),
                ));
            }
            None => slots.get(&var).map(|(l, b)| (*l, *b)),
        };
        match (known, written) {
            (Some((l, _)), Some(w)) if l != w => Err(refuse(
                Rule::Label,
                format!("`{var}` is a {l} node; it cannot also be labelled {w}"),
            )),
            (Some((l, before)), _) => {
                if before && !slots.contains_key(&var) {
                    slots.insert(var.clone(), (l, true));
                }
                Ok(var)
            }
            (None, Some(w)) => {
                slots.insert(var.clone(), (w, false));
                order.push(var.clone());
                Ok(var)
            }
            (None, None) => Err(refuse(
                Rule::Label,
                format!(
                    "node `{var}` has no label; label it with one of {} (a variable bound earlier may omit it)",
                    LABELS.join(", ")
                ),
            )),
        }
    }

    fn rel_check(&mut self, rel: &RelPattern) -> Result<&'static str, Refusal> {
        if rel.var_length {
            return Err(refuse(
                Rule::VariableLength,
                "variable-length relationships (`*`) are not accepted; follow one relationship per hop, e.g. (a)-[:NEXT_CHUNK]->(b)-[:NEXT_CHUNK]->(c)",
            ));
        }
        let [t] = rel.types.as_slice() else {
            return Err(refuse(
                Rule::RelationshipType,
                format!(
                    "each relationship needs exactly one type, e.g. -[:PART_OF]->; types: {}",
                    REL_TYPES.join(", ")
                ),
            ));
        };
        match REL_TYPES.iter().find(|x| **x == t.as_str()) {
            Some(x) => Ok(*x),
            None => Err(refuse(
                Rule::RelationshipType,
                format!(
                    "relationship type `{t}` is not in the graph; use one of {}",
                    REL_TYPES.join(", ")
                ),
            )),
        }
    }

    /// Checks a WITH or RETURN; returns the columns and literal limit of a RETURN.
    fn projection(&mut self, p: &Projection, is_with: bool) -> Result<(Vec<Column>, i64), Refusal> {
        let kw = if is_with { "WITH" } else { "RETURN" };
        if p.star {
            return Err(refuse(
                Rule::Projection,
                format!(
                    "{kw} * is not accepted; list the values you need, e.g. {kw} c.text AS text"
                ),
            ));
        }
        if p.skip.is_some() {
            return Err(refuse(Rule::Skip, SKIP_HELP));
        }
        let mut columns = Vec::new();
        let mut next_scope: HashMap<String, Kind> = HashMap::new();
        for item in &p.items {
            self.expr(&item.expr, true)?;
            let name = match (&item.alias, &item.expr) {
                (Some(a), _) => {
                    reserved_name(a, "alias")?;
                    a.clone()
                }
                (None, Expr::Var(v)) => v.clone(),
                (None, e) if is_with => {
                    return Err(refuse(
                        Rule::Projection,
                        format!(
                            "WITH {} needs an alias; write WITH {} AS name",
                            super::printer::print_expr(e),
                            super::printer::print_expr(e)
                        ),
                    ));
                }
                (None, e) => super::printer::print_expr(e),
            };
            let kind = match &item.expr {
                Expr::Var(v) => self.scope.get(v).copied().unwrap_or(Kind::Value),
                _ => Kind::Value,
            };
            columns.push(Column {
                name: name.clone(),
                label: match kind {
                    Kind::Node(l) => Some(l),
                    _ => None,
                },
            });
            next_scope.insert(name, kind);
        }
        // ORDER BY may read both the projected names and the clause's inputs.
        let before = self.scope.clone();
        self.scope.extend(next_scope.clone());
        for (e, _) in &p.order {
            self.expr(e, true)?;
        }
        self.scope = before;
        let limit = match &p.limit {
            None if is_with => 0,
            None => {
                return Err(refuse(
                    Rule::Limit,
                    "the final RETURN needs a literal LIMIT from 1 to 50, e.g. RETURN c.text AS text LIMIT 10",
                ));
            }
            Some(Expr::Lit(Literal::Int(n))) => {
                let max = if is_with { MAX_WITH_LIMIT } else { MAX_LIMIT };
                if *n < 1 || *n > max {
                    return Err(refuse(
                        Rule::Limit,
                        format!("{kw} LIMIT {n} is out of range; use a literal from 1 to {max}"),
                    ));
                }
                *n
            }
            Some(_) => {
                return Err(refuse(
                    Rule::Limit,
                    format!(
                        "{kw} LIMIT must be a literal integer (1 to 50 on the final RETURN), not a parameter or expression"
                    ),
                ));
            }
        };
        if is_with {
            self.scope = next_scope;
            if let Some(w) = &p.where_ {
                self.expr(w, false)?;
            }
        }
        Ok((columns, limit))
    }

    fn expr(&mut self, e: &Expr, agg_ok: bool) -> Result<(), Refusal> {
        match e {
            Expr::Lit(_) => Ok(()),
            Expr::Param(p) => {
                reserved_name(p, "parameter")?;
                if !self.params.contains(p) {
                    self.params.push(p.clone());
                }
                Ok(())
            }
            Expr::Var(v) => self.known(v),
            Expr::Prop(b, _) => self.expr(b, agg_ok),
            Expr::Index(b, i) => {
                self.expr(b, agg_ok)?;
                self.expr(i, agg_ok)
            }
            Expr::Unary(_, x) | Expr::IsNull(x, _) => self.expr(x, agg_ok),
            Expr::Binary(_, l, r) => {
                self.expr(l, agg_ok)?;
                self.expr(r, agg_ok)
            }
            Expr::Call {
                name,
                distinct,
                args,
            } => {
                let lower = name.to_ascii_lowercase();
                let aggregate = AGGREGATES.contains(&lower.as_str());
                if !aggregate && !FUNCTIONS.contains(&lower.as_str()) {
                    return Err(refuse(
                        Rule::Function,
                        format!(
                            "function `{name}` is not allowed; use one of {}, {}",
                            AGGREGATES.join(", "),
                            FUNCTIONS.join(", ")
                        ),
                    ));
                }
                if aggregate && !agg_ok {
                    return Err(refuse(
                        Rule::Function,
                        format!(
                            "aggregate `{name}` is only allowed in WITH or RETURN items; aggregate in a WITH, then filter with WITH ... WHERE"
                        ),
                    ));
                }
                if *distinct && !aggregate {
                    return Err(refuse(
                        Rule::Function,
                        format!("DISTINCT only goes inside an aggregate, not `{name}`"),
                    ));
                }
                // An aggregate's arguments cannot hold another aggregate.
                for a in args {
                    self.expr(a, agg_ok && !aggregate)?;
                }
                Ok(())
            }
            Expr::CountStar => {
                if agg_ok {
                    Ok(())
                } else {
                    Err(refuse(
                        Rule::Function,
                        "count(*) is only allowed in WITH or RETURN items",
                    ))
                }
            }
            Expr::List(items) => items.iter().try_for_each(|x| self.expr(x, agg_ok)),
            Expr::Map(entries) => entries.iter().try_for_each(|(_, x)| self.expr(x, agg_ok)),
            Expr::MapProjection(v, items) => {
                self.known(v)?;
                for item in items {
                    if let MapItem::Entry(_, x) = item {
                        self.expr(x, agg_ok)?;
                    }
                }
                Ok(())
            }
            Expr::Case {
                operand,
                whens,
                otherwise,
            } => {
                if let Some(o) = operand {
                    self.expr(o, agg_ok)?;
                }
                for (w, t) in whens {
                    self.expr(w, agg_ok)?;
                    self.expr(t, agg_ok)?;
                }
                if let Some(o) = otherwise {
                    self.expr(o, agg_ok)?;
                }
                Ok(())
            }
        }
    }

    fn known(&self, v: &str) -> Result<(), Refusal> {
        reserved_name(v, "variable")?;
        if self.scope.contains_key(v) {
            Ok(())
        } else {
            Err(refuse(
                Rule::Variable,
                format!(
                    "variable `{v}` is not defined here; bind it in a MATCH or UNWIND, and carry it through every WITH"
                ),
            ))
        }
    }
}

/// Re-parses `text` (a [`rewrite`] output) and checks that every Chunk, FileRef and
/// OutlineNode variable and every REL edge has its guard as a top-level conjunct of the WHERE
/// of the clause that binds it, and that no such node or edge is anonymous.
pub fn verify(text: &str, guard: &dyn Guard) -> Result<(), String> {
    let stmt = parse_statement(text).map_err(|r| format!("rewritten text does not parse: {r}"))?;
    let mut bound: HashSet<String> = HashSet::new();
    for clause in &stmt.clauses {
        match clause {
            Clause::Match(m) => {
                let mut required: Vec<Expr> = Vec::new();
                let mut new_here: HashSet<String> = HashSet::new();
                for p in &m.patterns {
                    let nodes = std::iter::once(&p.start).chain(p.hops.iter().map(|(_, n)| n));
                    for n in nodes {
                        let target = n.labels.iter().find_map(|l| Target::of_label(l));
                        match (&n.var, target) {
                            (None, Some(_)) => {
                                return Err(format!("anonymous guarded node in `{text}`"));
                            }
                            (None, None) => {}
                            (Some(v), t) => {
                                if !bound.contains(v) && new_here.insert(v.clone()) {
                                    match t {
                                        Some(t) => required.push(guard.predicate(v, t)),
                                        None if n.labels.is_empty() => {
                                            return Err(format!(
                                                "unlabelled new node `{v}` in `{text}`"
                                            ));
                                        }
                                        None => {}
                                    }
                                }
                            }
                        }
                    }
                    for (r, _) in &p.hops {
                        if r.types.iter().any(|t| t == "REL") {
                            let Some(v) = &r.var else {
                                return Err(format!("anonymous REL edge in `{text}`"));
                            };
                            if !bound.contains(v) {
                                required.push(guard.predicate(v, Target::Rel));
                            }
                        }
                        if let Some(v) = &r.var {
                            new_here.insert(v.clone());
                        }
                    }
                }
                let mut conjuncts = Vec::new();
                if let Some(w) = &m.where_ {
                    flatten_and(w, &mut conjuncts);
                }
                let mut guard_parts = Vec::new();
                for r in &required {
                    let mut parts = Vec::new();
                    flatten_and(r, &mut parts);
                    if parts.iter().any(|p| !conjuncts.contains(p)) {
                        return Err(format!(
                            "missing guard {} in `{text}`",
                            super::printer::print_expr(r)
                        ));
                    }
                    guard_parts.extend(parts.into_iter().cloned());
                }
                // Every other condition cannot fail, or waits for the whole pattern.
                let all_bound = pattern_variables(m);
                for c in conjuncts {
                    if !guard_parts.contains(c) && !cannot_fail(c) && !tied_to(c, &all_bound) {
                        return Err(format!(
                            "condition {} in `{text}` can fail before the guards run",
                            super::printer::print_expr(c)
                        ));
                    }
                }
                bound.extend(new_here);
            }
            Clause::Unwind { alias, .. } => {
                bound.insert(alias.clone());
            }
            Clause::With(p) => {
                if let Some(w) = &p.where_ {
                    let computed: Vec<String> = p
                        .items
                        .iter()
                        .filter(|i| !matches!(i.expr, Expr::Var(_)))
                        .filter_map(|i| i.alias.clone())
                        .collect();
                    let mut conjuncts = Vec::new();
                    flatten_and(w, &mut conjuncts);
                    if let Some(c) = conjuncts.iter().find(|c| {
                        !cannot_fail(c)
                            && !computed.iter().any(|a| tied_to(c, std::slice::from_ref(a)))
                    }) {
                        return Err(format!(
                            "WITH condition {} in `{text}` can move before the guards",
                            super::printer::print_expr(c)
                        ));
                    }
                }
                let mut next = HashSet::new();
                for item in &p.items {
                    match (&item.alias, &item.expr) {
                        (Some(a), _) => next.insert(a.clone()),
                        (None, Expr::Var(v)) => next.insert(v.clone()),
                        _ => false,
                    };
                }
                if p.star {
                    next.extend(bound.iter().cloned());
                }
                bound = next;
            }
            Clause::Return(_) => {}
        }
    }
    Ok(())
}

/// Every variable a MATCH's patterns name (the fresh ones the rewrite gave included).
fn pattern_variables(m: &Match) -> Vec<String> {
    let mut vars = Vec::new();
    for pattern in &m.patterns {
        vars.extend(pattern.start.var.clone());
        for (rel, node) in &pattern.hops {
            vars.extend(rel.var.clone());
            vars.extend(node.var.clone());
        }
    }
    vars.sort();
    vars.dedup();
    vars
}

/// `cond`'s conjuncts that [cannot fail](cannot_fail) as they are, then the others as one
/// `CASE WHEN v1 IS NOT NULL AND … THEN … ELSE false END`, an operand FalkorDB can evaluate
/// only once every `v` is bound. Each `v` is bound on any row a clause yields, so the value
/// is `cond`'s.
fn fail_only_when_bound(vars: &[String], cond: Expr) -> Option<Expr> {
    let mut conjuncts = Vec::new();
    flatten_and(&cond, &mut conjuncts);
    let (safe, can_fail): (Vec<&Expr>, Vec<&Expr>) =
        conjuncts.into_iter().partition(|c| cannot_fail(c));
    let can_fail = can_fail.into_iter().cloned().reduce(Expr::and);
    let bound = vars
        .iter()
        .map(|v| Expr::IsNull(Box::new(Expr::Var(v.clone())), true))
        .reduce(Expr::and);
    let tied = match (can_fail, bound) {
        (Some(c), Some(bound)) => Some(Expr::Case {
            operand: None,
            whens: vec![(bound, c)],
            otherwise: Some(Box::new(Expr::Lit(Literal::Bool(false)))),
        }),
        (c, _) => c,
    };
    safe.into_iter().cloned().chain(tied).reduce(Expr::and)
}

/// Whether `c` is `CASE WHEN` a conjunction of `v IS NOT NULL` naming every one of `vars`.
fn tied_to(c: &Expr, vars: &[String]) -> bool {
    let Expr::Case {
        operand: None,
        whens,
        ..
    } = c
    else {
        return false;
    };
    let [(when, _)] = whens.as_slice() else {
        return false;
    };
    let mut parts = Vec::new();
    flatten_and(when, &mut parts);
    vars.iter().all(|v| {
        parts
            .iter()
            .any(|p| matches!(p, Expr::IsNull(e, true) if matches!(&**e, Expr::Var(x) if x == v)))
    })
}

/// A condition FalkorDB evaluates without an error whatever the values: comparisons, `IN`
/// a list and `IS NULL` over literals, parameters, variables, properties and `ID(n)` (a
/// comparison of different types is null, not an error), and `NOT`, `AND`, `OR` and `XOR` of
/// such. `STARTS WITH` and arithmetic
/// fail on a value of the wrong type, so they are not among them.
fn cannot_fail(e: &Expr) -> bool {
    fn atom(e: &Expr) -> bool {
        match e {
            Expr::Lit(_) | Expr::Param(_) | Expr::Var(_) => true,
            Expr::Prop(base, _) => matches!(**base, Expr::Var(_)),
            Expr::Call { name, args, .. } => {
                name.eq_ignore_ascii_case("id") && matches!(args.as_slice(), [Expr::Var(_)])
            }
            _ => false,
        }
    }
    match e {
        Expr::Binary(
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge,
            a,
            b,
        ) => atom(a) && atom(b),
        Expr::Binary(BinOp::In, a, b) => {
            atom(a) && matches!(&**b, Expr::List(items) if items.iter().all(atom))
        }
        Expr::Lit(Literal::Bool(_) | Literal::Null) => true,
        Expr::IsNull(a, _) => atom(a),
        Expr::Unary(UnOp::Not, a) => cannot_fail(a),
        Expr::Binary(BinOp::And | BinOp::Or | BinOp::Xor, a, b) => cannot_fail(a) && cannot_fail(b),
        _ => false,
    }
}

/// The variables an expression reads.
fn vars_of(e: &Expr) -> Vec<String> {
    fn walk(e: &Expr, out: &mut Vec<String>) {
        match e {
            Expr::Var(v) => out.push(v.clone()),
            Expr::MapProjection(v, items) => {
                out.push(v.clone());
                for item in items {
                    if let MapItem::Entry(_, e) = item {
                        walk(e, out);
                    }
                }
            }
            Expr::Lit(_) | Expr::Param(_) | Expr::CountStar => {}
            Expr::Prop(e, _) | Expr::Unary(_, e) | Expr::IsNull(e, _) => walk(e, out),
            Expr::Index(a, b) | Expr::Binary(_, a, b) => {
                walk(a, out);
                walk(b, out);
            }
            Expr::Call { args, .. } | Expr::List(args) => args.iter().for_each(|a| walk(a, out)),
            Expr::Map(entries) => entries.iter().for_each(|(_, e)| walk(e, out)),
            Expr::Case {
                operand,
                whens,
                otherwise,
            } => {
                operand
                    .iter()
                    .chain(otherwise.iter())
                    .for_each(|e| walk(e, out));
                for (w, t) in whens {
                    walk(w, out);
                    walk(t, out);
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(e, &mut out);
    out
}

fn flatten_and<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    if let Expr::Binary(BinOp::And, l, r) = e {
        flatten_and(l, out);
        flatten_and(r, out);
    } else {
        out.push(e);
    }
}
