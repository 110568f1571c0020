//! The syntax tree of the read subset of openCypher that kg_cypher accepts. Only what is
//! modelled here can be printed back, so anything the parser does not know never runs.

/// One statement: clauses in order, the last one a RETURN.
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    /// The clauses, in order.
    pub clauses: Vec<Clause>,
}

/// A read clause.
#[derive(Debug, Clone, PartialEq)]
pub enum Clause {
    /// `MATCH` or `OPTIONAL MATCH` with its patterns and `WHERE`.
    Match(Match),
    /// `UNWIND expr AS var`.
    Unwind {
        /// The list expression.
        expr: Expr,
        /// The variable each element binds.
        alias: String,
    },
    /// `WITH ...`.
    With(Projection),
    /// `RETURN ...`.
    Return(Projection),
}

/// A MATCH clause.
#[derive(Debug, Clone, PartialEq)]
pub struct Match {
    /// `OPTIONAL MATCH`.
    pub optional: bool,
    /// Comma-separated paths.
    pub patterns: Vec<Pattern>,
    /// The clause's `WHERE`.
    pub where_: Option<Expr>,
}

/// One comma-free path: a node, then hops.
#[derive(Debug, Clone, PartialEq)]
pub struct Pattern {
    /// The first node.
    pub start: NodePattern,
    /// Each relationship with the node it reaches.
    pub hops: Vec<(RelPattern, NodePattern)>,
}

/// `(var:Label {props})`.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePattern {
    /// The variable, if any.
    pub var: Option<String>,
    /// Labels as written (the validator allows one).
    pub labels: Vec<String>,
    /// Inline property map.
    pub props: Vec<(String, Expr)>,
}

/// Direction of a relationship as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// `-[]->`
    Right,
    /// `<-[]-`
    Left,
    /// `-[]-`
    Both,
}

/// `-[var:TYPE {props}]->`.
#[derive(Debug, Clone, PartialEq)]
pub struct RelPattern {
    /// The variable, if any.
    pub var: Option<String>,
    /// Types as written (`:A|B` gives two; the validator allows one).
    pub types: Vec<String>,
    /// Inline property map.
    pub props: Vec<(String, Expr)>,
    /// Direction.
    pub direction: Direction,
    /// A `*` range was written (refused by the validator).
    pub var_length: bool,
}

/// WITH or RETURN body.
#[derive(Debug, Clone, PartialEq)]
pub struct Projection {
    /// `DISTINCT`.
    pub distinct: bool,
    /// `*` was written (refused by the validator).
    pub star: bool,
    /// The projected items.
    pub items: Vec<Item>,
    /// `ORDER BY` keys: expression and descending flag.
    pub order: Vec<(Expr, bool)>,
    /// `SKIP` (refused by the validator).
    pub skip: Option<Expr>,
    /// `LIMIT`.
    pub limit: Option<Expr>,
    /// `WITH ... WHERE`.
    pub where_: Option<Expr>,
}

/// `expr [AS alias]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// The expression.
    pub expr: Expr,
    /// The alias, if written.
    pub alias: Option<String>,
}

/// Binary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    /// `OR`
    Or,
    /// `XOR`
    Xor,
    /// `AND`
    And,
    /// `=`
    Eq,
    /// `<>`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `IN`
    In,
    /// `STARTS WITH`
    StartsWith,
    /// `ENDS WITH`
    EndsWith,
    /// `CONTAINS`
    Contains,
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `%`
    Mod,
    /// `^`
    Pow,
}

/// Unary operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnOp {
    /// `NOT`
    Not,
    /// `-`
    Neg,
}

/// Literals. Numbers are never negative: `-1` is `Neg(1)`.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// `null`
    Null,
    /// `true` / `false`
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A finite float.
    Float(f64),
    /// A string.
    Str(String),
}

/// One entry of a map projection `v {.a, k: expr, .*}`.
#[derive(Debug, Clone, PartialEq)]
pub enum MapItem {
    /// `.key`
    Prop(String),
    /// `key: expr`
    Entry(String, Expr),
    /// `.*`
    AllProps,
}

/// Expressions.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A literal.
    Lit(Literal),
    /// `$name`
    Param(String),
    /// A variable.
    Var(String),
    /// `expr.key`
    Prop(Box<Expr>, String),
    /// `expr[index]`
    Index(Box<Expr>, Box<Expr>),
    /// A unary operator.
    Unary(UnOp, Box<Expr>),
    /// A binary operator.
    Binary(BinOp, Box<Expr>, Box<Expr>),
    /// `expr IS [NOT] NULL` (true = `IS NOT NULL`).
    IsNull(Box<Expr>, bool),
    /// `name([DISTINCT] args)`.
    Call {
        /// Function name as written.
        name: String,
        /// `DISTINCT` inside an aggregate.
        distinct: bool,
        /// Arguments.
        args: Vec<Expr>,
    },
    /// `count(*)`
    CountStar,
    /// `[a, b]`
    List(Vec<Expr>),
    /// `{k: v}`
    Map(Vec<(String, Expr)>),
    /// `var {.a, k: v}`
    MapProjection(String, Vec<MapItem>),
    /// `CASE [operand] WHEN .. THEN .. [ELSE ..] END`
    Case {
        /// The simple-form operand.
        operand: Option<Box<Expr>>,
        /// `WHEN` / `THEN` pairs.
        whens: Vec<(Expr, Expr)>,
        /// `ELSE`.
        otherwise: Option<Box<Expr>>,
    },
}

impl Expr {
    /// `a AND b`.
    pub fn and(a: Expr, b: Expr) -> Expr {
        Expr::Binary(BinOp::And, Box::new(a), Box::new(b))
    }
}
