//! Recursive-descent parser from tokens to [`Statement`]. Write clauses, procedures and
//! other constructs outside the read subset are refused here by name, with the fix.

use super::ast::*;
use super::lexer::{Spanned, Tok, lex};
use super::{Refusal, Rule};

/// Deepest expression or pattern nesting accepted (keeps the recursion bounded).
pub const MAX_DEPTH: usize = 40;
/// Most expression nodes in one statement: a left-nested chain (`a AND b AND ...`) is as deep
/// as it is long, and the printer and validator recurse over it.
pub const MAX_EXPR_NODES: usize = 1_500;

/// Words that cannot be used as a bare variable, alias or key start of a clause.
pub const RESERVED: &[&str] = &[
    "ALL",
    "AND",
    "AS",
    "ASC",
    "ASCENDING",
    "BY",
    "CALL",
    "CASE",
    "CONTAINS",
    "CREATE",
    "DELETE",
    "DESC",
    "DESCENDING",
    "DETACH",
    "DISTINCT",
    "ELSE",
    "END",
    "ENDS",
    "EXISTS",
    "FALSE",
    "FOREACH",
    "IN",
    "IS",
    "LIMIT",
    "LOAD",
    "MATCH",
    "MERGE",
    "NOT",
    "NULL",
    "ON",
    "OPTIONAL",
    "OR",
    "ORDER",
    "REMOVE",
    "RETURN",
    "SET",
    "SKIP",
    "STARTS",
    "THEN",
    "TRUE",
    "UNION",
    "UNWIND",
    "WHEN",
    "WHERE",
    "WITH",
    "XOR",
    "YIELD",
    "USE",
    "EXPLAIN",
    "PROFILE",
];

/// Parses one statement.
pub fn parse_statement(src: &str) -> Result<Statement, Refusal> {
    let mut p = Parser::new(lex(src)?);
    let stmt = p.statement()?;
    Ok(stmt)
}

/// Parses one expression (used for the trusted access predicates).
pub fn parse_expression(src: &str) -> Result<Expr, Refusal> {
    let mut p = Parser::new(lex(src)?);
    let e = p.expr()?;
    if p.pos < p.toks.len() {
        return Err(p.unexpected("the end of the expression"));
    }
    Ok(e)
}

struct Parser {
    toks: Vec<Spanned>,
    pos: usize,
    depth: usize,
    nodes: usize,
}

fn refuse(rule: Rule, message: impl Into<String>) -> Refusal {
    Refusal::new(rule, message)
}

impl Parser {
    fn new(toks: Vec<Spanned>) -> Self {
        Parser {
            toks,
            pos: 0,
            depth: 0,
            nodes: 0,
        }
    }

    fn peek(&self) -> Option<&Tok> {
        self.toks.get(self.pos).map(|t| &t.tok)
    }

    fn peek_at(&self, n: usize) -> Option<&Tok> {
        self.toks.get(self.pos + n).map(|t| &t.tok)
    }

    fn at_offset(&self) -> usize {
        self.toks
            .get(self.pos)
            .map_or_else(|| self.toks.last().map_or(0, |t| t.at), |t| t.at)
    }

    fn unexpected(&self, wanted: &str) -> Refusal {
        let found = match self.peek() {
            None => "the end of the statement".to_owned(),
            Some(Tok::Ident(s)) | Some(Tok::Quoted(s)) => format!("`{s}`"),
            Some(Tok::Str(_)) => "a string".to_owned(),
            Some(Tok::Int(n)) => format!("`{n}`"),
            Some(Tok::Float(f)) => format!("`{f}`"),
            Some(Tok::Param(p)) => format!("`${p}`"),
            Some(Tok::Sym(s)) => format!("`{s}`"),
        };
        refuse(
            Rule::Syntax,
            format!(
                "at byte {}: expected {wanted}, found {found}",
                self.at_offset()
            ),
        )
    }

    fn is_kw_at(&self, n: usize, kw: &str) -> bool {
        matches!(self.peek_at(n), Some(Tok::Ident(s)) if s.eq_ignore_ascii_case(kw))
    }

    fn is_kw(&self, kw: &str) -> bool {
        self.is_kw_at(0, kw)
    }

    fn eat_kw(&mut self, kw: &str) -> bool {
        if self.is_kw(kw) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect_kw(&mut self, kw: &str) -> Result<(), Refusal> {
        if self.eat_kw(kw) {
            Ok(())
        } else {
            Err(self.unexpected(&format!("`{kw}`")))
        }
    }

    fn is_sym(&self, sym: &str) -> bool {
        matches!(self.peek(), Some(Tok::Sym(s)) if *s == sym)
    }

    fn eat_sym(&mut self, sym: &str) -> bool {
        if self.is_sym(sym) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect_sym(&mut self, sym: &str) -> Result<(), Refusal> {
        if self.eat_sym(sym) {
            Ok(())
        } else {
            Err(self.unexpected(&format!("`{sym}`")))
        }
    }

    fn enter(&mut self) -> Result<(), Refusal> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(refuse(
                Rule::Size,
                format!("the statement nests deeper than {MAX_DEPTH} levels; flatten it"),
            ));
        }
        Ok(())
    }

    fn grow(&mut self) -> Result<(), Refusal> {
        self.nodes += 1;
        if self.nodes > MAX_EXPR_NODES {
            return Err(refuse(
                Rule::Size,
                format!(
                    "the statement has more than {MAX_EXPR_NODES} expression terms; shorten it"
                ),
            ));
        }
        Ok(())
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    /// A variable, alias, label or key: a bare non-reserved name or a backtick name.
    fn name(&mut self, what: &str) -> Result<String, Refusal> {
        match self.peek() {
            Some(Tok::Quoted(s)) => {
                let s = s.clone();
                self.pos += 1;
                Ok(s)
            }
            Some(Tok::Ident(s)) if !is_reserved(s) => {
                let s = s.clone();
                self.pos += 1;
                Ok(s)
            }
            _ => Err(self.unexpected(what)),
        }
    }

    /// A property key or label: any identifier, reserved words included.
    fn key(&mut self, what: &str) -> Result<String, Refusal> {
        match self.peek() {
            Some(Tok::Quoted(s)) | Some(Tok::Ident(s)) => {
                let s = s.clone();
                self.pos += 1;
                Ok(s)
            }
            _ => Err(self.unexpected(what)),
        }
    }

    fn statement(&mut self) -> Result<Statement, Refusal> {
        let mut clauses = Vec::new();
        loop {
            if self.peek().is_none() {
                break;
            }
            if self.eat_sym(";") {
                if self.peek().is_some() {
                    return Err(refuse(
                        Rule::OneStatement,
                        "only one statement per call: remove the `;` and everything after it, and send the next statement in its own call",
                    ));
                }
                break;
            }
            clauses.push(self.clause()?);
        }
        if clauses.is_empty() {
            return Err(refuse(
                Rule::Syntax,
                "the statement is empty; write MATCH ... RETURN ... LIMIT n",
            ));
        }
        Ok(Statement { clauses })
    }

    fn clause(&mut self) -> Result<Clause, Refusal> {
        if self.eat_kw("MATCH") {
            return self.match_clause(false);
        }
        if self.is_kw("OPTIONAL") && self.is_kw_at(1, "MATCH") {
            self.pos += 2;
            return self.match_clause(true);
        }
        if self.eat_kw("UNWIND") {
            let expr = self.expr()?;
            self.expect_kw("AS")?;
            let alias = self.name("a variable name after AS")?;
            return Ok(Clause::Unwind { expr, alias });
        }
        if self.eat_kw("WITH") {
            return Ok(Clause::With(self.projection(true)?));
        }
        if self.eat_kw("RETURN") {
            return Ok(Clause::Return(self.projection(false)?));
        }
        let word = match self.peek() {
            Some(Tok::Ident(s)) => s.to_ascii_uppercase(),
            _ => {
                return Err(
                    self.unexpected("a clause (MATCH, OPTIONAL MATCH, WITH, UNWIND, RETURN)")
                );
            }
        };
        Err(match word.as_str() {
            "CREATE" | "MERGE" | "SET" | "DELETE" | "DETACH" | "REMOVE" | "FOREACH" => refuse(
                Rule::ReadOnly,
                format!(
                    "{word} writes to the graph; kg_cypher is read-only. Use only MATCH, OPTIONAL MATCH, WHERE, WITH, UNWIND, RETURN, ORDER BY and LIMIT"
                ),
            ),
            "LOAD" => refuse(
                Rule::ReadOnly,
                "LOAD CSV reads outside the graph; kg_cypher only reads the namespace graph. Use kg_file to read a CSV file",
            ),
            "CALL" => refuse(
                Rule::Procedures,
                "CALL (procedures and subqueries) is not allowed: it reaches the raw graph around the access filter. Write the pattern with MATCH instead; use kg_search for full-text search",
            ),
            "UNION" => refuse(
                Rule::OneStatement,
                "UNION combines two statements; send each part as its own kg_cypher call",
            ),
            "USE" | "EXPLAIN" | "PROFILE" => refuse(
                Rule::ReadOnly,
                format!(
                    "{word} is not accepted; the namespace argument selects the graph. Start the statement with MATCH"
                ),
            ),
            _ => self.unexpected("a clause (MATCH, OPTIONAL MATCH, WITH, UNWIND, RETURN)"),
        })
    }

    fn match_clause(&mut self, optional: bool) -> Result<Clause, Refusal> {
        let mut patterns = vec![self.pattern()?];
        while self.eat_sym(",") {
            patterns.push(self.pattern()?);
        }
        let where_ = if self.eat_kw("WHERE") {
            Some(self.expr()?)
        } else {
            None
        };
        Ok(Clause::Match(Match {
            optional,
            patterns,
            where_,
        }))
    }

    fn pattern(&mut self) -> Result<Pattern, Refusal> {
        // `p = (...)`: named paths would hand back nodes the printer cannot see into.
        if matches!(self.peek(), Some(Tok::Ident(_)) | Some(Tok::Quoted(_)))
            && matches!(self.peek_at(1), Some(Tok::Sym("=")))
        {
            return Err(refuse(
                Rule::Path,
                "named paths (`p = (...)`) are not accepted; alias the nodes and relationships you need and return their properties",
            ));
        }
        if let Some(Tok::Ident(s)) = self.peek()
            && (s.eq_ignore_ascii_case("shortestPath")
                || s.eq_ignore_ascii_case("allShortestPaths"))
        {
            return Err(refuse(
                Rule::VariableLength,
                "shortestPath / allShortestPaths are not accepted; follow one relationship per hop with an explicit type",
            ));
        }
        let start = self.node()?;
        let mut hops = Vec::new();
        while self.is_sym("-")
            || (self.is_sym("<") && matches!(self.peek_at(1), Some(Tok::Sym("-"))))
        {
            let rel = self.rel()?;
            let node = self.node()?;
            hops.push((rel, node));
            if hops.len() > MAX_DEPTH {
                return Err(refuse(
                    Rule::Size,
                    format!("a path has more than {MAX_DEPTH} hops; split it"),
                ));
            }
        }
        Ok(Pattern { start, hops })
    }

    fn node(&mut self) -> Result<NodePattern, Refusal> {
        self.expect_sym("(")?;
        let var = match self.peek() {
            Some(Tok::Quoted(_)) => Some(self.name("a variable")?),
            Some(Tok::Ident(s)) if !is_reserved(s) => Some(self.name("a variable")?),
            _ => None,
        };
        let mut labels = Vec::new();
        while self.eat_sym(":") {
            labels.push(self.key("a label after `:`")?);
            if self.is_sym("|") {
                return Err(refuse(
                    Rule::Label,
                    "label alternatives (`:A|B`) are not accepted; label each node with exactly one of Chunk, FileRef, Entity, EntityType, OutlineNode, Folder",
                ));
            }
        }
        let props = if self.is_sym("{") {
            self.map_entries()?
        } else {
            Vec::new()
        };
        if self.is_kw("WHERE") {
            return Err(refuse(
                Rule::Syntax,
                "a WHERE inside a node pattern is not accepted; move the condition to the clause's WHERE",
            ));
        }
        self.expect_sym(")")?;
        Ok(NodePattern { var, labels, props })
    }

    fn rel(&mut self) -> Result<RelPattern, Refusal> {
        let left = self.eat_sym("<");
        self.expect_sym("-")?;
        let mut var = None;
        let mut types = Vec::new();
        let mut props = Vec::new();
        let mut var_length = false;
        if self.eat_sym("[") {
            var = match self.peek() {
                Some(Tok::Quoted(_)) => Some(self.name("a variable")?),
                Some(Tok::Ident(s)) if !is_reserved(s) => Some(self.name("a variable")?),
                _ => None,
            };
            if self.eat_sym(":") {
                types.push(self.key("a relationship type after `:`")?);
                while self.eat_sym("|") {
                    self.eat_sym(":");
                    types.push(self.key("a relationship type after `|`")?);
                }
            }
            if self.eat_sym("*") {
                var_length = true;
                // Consume the range so the refusal is about the rule, not the syntax.
                while matches!(self.peek(), Some(Tok::Int(_)) | Some(Tok::Sym(".."))) {
                    self.pos += 1;
                }
            }
            if self.is_sym("{") {
                props = self.map_entries()?;
            }
            self.expect_sym("]")?;
        }
        self.expect_sym("-")?;
        let right = self.eat_sym(">");
        let direction = match (left, right) {
            (true, false) => Direction::Left,
            (false, true) => Direction::Right,
            (false, false) => Direction::Both,
            (true, true) => {
                return Err(refuse(
                    Rule::Syntax,
                    "a relationship cannot point both ways (`<-[]->`); use `-[]->`, `<-[]-` or `-[]-`",
                ));
            }
        };
        Ok(RelPattern {
            var,
            types,
            props,
            direction,
            var_length,
        })
    }

    fn projection(&mut self, is_with: bool) -> Result<Projection, Refusal> {
        let distinct = self.eat_kw("DISTINCT");
        let mut star = false;
        let mut items = Vec::new();
        if self.eat_sym("*") {
            star = true;
            if self.eat_sym(",") {
                items = self.items()?;
            }
        } else {
            items = self.items()?;
        }
        let mut order = Vec::new();
        if self.is_kw("ORDER") {
            self.pos += 1;
            self.expect_kw("BY")?;
            loop {
                let e = self.expr()?;
                let desc = if self.eat_kw("DESC") || self.eat_kw("DESCENDING") {
                    true
                } else {
                    let _ = self.eat_kw("ASC") || self.eat_kw("ASCENDING");
                    false
                };
                order.push((e, desc));
                if !self.eat_sym(",") {
                    break;
                }
            }
        }
        let skip = if self.eat_kw("SKIP") {
            Some(self.expr()?)
        } else {
            None
        };
        let limit = if self.eat_kw("LIMIT") {
            Some(self.expr()?)
        } else {
            None
        };
        let where_ = if is_with && self.eat_kw("WHERE") {
            Some(self.expr()?)
        } else {
            None
        };
        Ok(Projection {
            distinct,
            star,
            items,
            order,
            skip,
            limit,
            where_,
        })
    }

    fn items(&mut self) -> Result<Vec<Item>, Refusal> {
        let mut items = Vec::new();
        loop {
            let expr = self.expr()?;
            let alias = if self.eat_kw("AS") {
                Some(self.name("an alias after AS")?)
            } else {
                None
            };
            items.push(Item { expr, alias });
            if !self.eat_sym(",") {
                return Ok(items);
            }
        }
    }

    fn map_entries(&mut self) -> Result<Vec<(String, Expr)>, Refusal> {
        self.expect_sym("{")?;
        let mut entries = Vec::new();
        if !self.eat_sym("}") {
            loop {
                let k = self.key("a map key")?;
                self.expect_sym(":")?;
                let v = self.expr()?;
                entries.push((k, v));
                if self.eat_sym("}") {
                    break;
                }
                self.expect_sym(",")?;
            }
        }
        Ok(entries)
    }

    /// Expression entry point.
    pub fn expr(&mut self) -> Result<Expr, Refusal> {
        self.enter()?;
        let e = self.or();
        self.leave();
        e
    }

    fn or(&mut self) -> Result<Expr, Refusal> {
        let mut e = self.xor()?;
        while self.eat_kw("OR") {
            let r = self.xor()?;
            self.grow()?;
            e = Expr::Binary(BinOp::Or, Box::new(e), Box::new(r));
        }
        Ok(e)
    }

    fn xor(&mut self) -> Result<Expr, Refusal> {
        let mut e = self.and()?;
        while self.eat_kw("XOR") {
            let r = self.and()?;
            self.grow()?;
            e = Expr::Binary(BinOp::Xor, Box::new(e), Box::new(r));
        }
        Ok(e)
    }

    fn and(&mut self) -> Result<Expr, Refusal> {
        let mut e = self.not()?;
        while self.eat_kw("AND") {
            let r = self.not()?;
            self.grow()?;
            e = Expr::Binary(BinOp::And, Box::new(e), Box::new(r));
        }
        Ok(e)
    }

    fn not(&mut self) -> Result<Expr, Refusal> {
        if self.eat_kw("NOT") {
            self.enter()?;
            let e = self.not();
            self.leave();
            return Ok(Expr::Unary(UnOp::Not, Box::new(e?)));
        }
        self.comparison()
    }

    fn comparison(&mut self) -> Result<Expr, Refusal> {
        let mut e = self.predicate()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Sym("=")) => BinOp::Eq,
                Some(Tok::Sym("<>")) => BinOp::Ne,
                Some(Tok::Sym("<")) => BinOp::Lt,
                Some(Tok::Sym("<=")) => BinOp::Le,
                Some(Tok::Sym(">")) => BinOp::Gt,
                Some(Tok::Sym(">=")) => BinOp::Ge,
                Some(Tok::Sym("=~")) => {
                    return Err(refuse(
                        Rule::Function,
                        "regular expressions (`=~`) are not accepted; use CONTAINS, STARTS WITH or ENDS WITH (with toLower() for case)",
                    ));
                }
                _ => return Ok(e),
            };
            self.pos += 1;
            let r = self.predicate()?;
            self.grow()?;
            e = Expr::Binary(op, Box::new(e), Box::new(r));
        }
    }

    fn predicate(&mut self) -> Result<Expr, Refusal> {
        let mut e = self.additive()?;
        loop {
            if self.is_kw("STARTS") && self.is_kw_at(1, "WITH") {
                self.pos += 2;
                let r = self.additive()?;
                self.grow()?;
                e = Expr::Binary(BinOp::StartsWith, Box::new(e), Box::new(r));
            } else if self.is_kw("ENDS") && self.is_kw_at(1, "WITH") {
                self.pos += 2;
                let r = self.additive()?;
                self.grow()?;
                e = Expr::Binary(BinOp::EndsWith, Box::new(e), Box::new(r));
            } else if self.eat_kw("CONTAINS") {
                let r = self.additive()?;
                self.grow()?;
                e = Expr::Binary(BinOp::Contains, Box::new(e), Box::new(r));
            } else if self.eat_kw("IN") {
                let r = self.additive()?;
                self.grow()?;
                e = Expr::Binary(BinOp::In, Box::new(e), Box::new(r));
            } else if self.is_kw("IS") {
                self.pos += 1;
                let negated = self.eat_kw("NOT");
                self.expect_kw("NULL")?;
                self.grow()?;
                e = Expr::IsNull(Box::new(e), negated);
            } else {
                return Ok(e);
            }
        }
    }

    fn additive(&mut self) -> Result<Expr, Refusal> {
        let mut e = self.multiplicative()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Sym("+")) => BinOp::Add,
                Some(Tok::Sym("-")) => BinOp::Sub,
                _ => return Ok(e),
            };
            self.pos += 1;
            let r = self.multiplicative()?;
            self.grow()?;
            e = Expr::Binary(op, Box::new(e), Box::new(r));
        }
    }

    fn multiplicative(&mut self) -> Result<Expr, Refusal> {
        let mut e = self.power()?;
        loop {
            let op = match self.peek() {
                Some(Tok::Sym("*")) => BinOp::Mul,
                Some(Tok::Sym("/")) => BinOp::Div,
                Some(Tok::Sym("%")) => BinOp::Mod,
                _ => return Ok(e),
            };
            self.pos += 1;
            let r = self.power()?;
            self.grow()?;
            e = Expr::Binary(op, Box::new(e), Box::new(r));
        }
    }

    fn power(&mut self) -> Result<Expr, Refusal> {
        let mut e = self.unary()?;
        while self.eat_sym("^") {
            let r = self.unary()?;
            self.grow()?;
            e = Expr::Binary(BinOp::Pow, Box::new(e), Box::new(r));
        }
        Ok(e)
    }

    fn unary(&mut self) -> Result<Expr, Refusal> {
        if self.eat_sym("-") {
            self.enter()?;
            let e = self.unary();
            self.leave();
            return Ok(Expr::Unary(UnOp::Neg, Box::new(e?)));
        }
        if self.eat_sym("+") {
            self.enter()?;
            let e = self.unary();
            self.leave();
            return e;
        }
        self.postfix()
    }

    fn postfix(&mut self) -> Result<Expr, Refusal> {
        let mut e = self.atom()?;
        loop {
            if self.eat_sym(".") {
                let k = self.key("a property name after `.`")?;
                self.grow()?;
                e = Expr::Prop(Box::new(e), k);
            } else if self.is_sym("[") {
                self.pos += 1;
                let i = self.expr()?;
                if self.is_sym("..") {
                    return Err(refuse(
                        Rule::Syntax,
                        "list slices (`[a..b]`) are not accepted; use substring(), left() or head()",
                    ));
                }
                self.expect_sym("]")?;
                self.grow()?;
                e = Expr::Index(Box::new(e), Box::new(i));
            } else if self.is_sym(":") {
                return Err(refuse(
                    Rule::Label,
                    "label tests in expressions (`n:Label`) are not accepted; put the label on the node pattern",
                ));
            } else {
                return Ok(e);
            }
        }
    }

    fn atom(&mut self) -> Result<Expr, Refusal> {
        self.grow()?;
        let Some(tok) = self.peek().cloned() else {
            return Err(self.unexpected("an expression"));
        };
        match tok {
            Tok::Int(n) => {
                self.pos += 1;
                Ok(Expr::Lit(Literal::Int(n)))
            }
            Tok::Float(f) => {
                self.pos += 1;
                Ok(Expr::Lit(Literal::Float(f)))
            }
            Tok::Str(s) => {
                self.pos += 1;
                Ok(Expr::Lit(Literal::Str(s)))
            }
            Tok::Param(p) => {
                self.pos += 1;
                Ok(Expr::Param(p))
            }
            Tok::Sym("(") => {
                // `(a)-[..]->(b)` in an expression is a pattern predicate.
                self.pos += 1;
                let e = self.expr()?;
                self.expect_sym(")")?;
                let arrow =
                    |n: usize| matches!(self.peek_at(n), Some(Tok::Sym("[")) | Some(Tok::Sym("-")));
                // `-[` may be list arithmetic; `--` and `<-` never follow `)` in printed text.
                if (self.is_sym("-") && matches!(self.peek_at(1), Some(Tok::Sym("-"))))
                    || (self.is_sym("<")
                        && matches!(self.peek_at(1), Some(Tok::Sym("-")))
                        && arrow(2))
                {
                    return Err(pattern_in_expression());
                }
                Ok(e)
            }
            Tok::Sym("[") => {
                // `[:TYPE]` after `-` is a relationship inside an expression.
                if matches!(self.peek_at(1), Some(Tok::Sym(":")) | Some(Tok::Sym("*"))) {
                    return Err(pattern_in_expression());
                }
                self.pos += 1;
                let mut items = Vec::new();
                if !self.eat_sym("]") {
                    loop {
                        items.push(self.expr()?);
                        if self.is_sym("|") || self.is_kw("IN") && items.len() == 1 {
                            return Err(refuse(
                                Rule::Syntax,
                                "list comprehensions are not accepted; use UNWIND and collect()",
                            ));
                        }
                        if self.eat_sym("]") {
                            break;
                        }
                        self.expect_sym(",")?;
                    }
                }
                Ok(Expr::List(items))
            }
            Tok::Sym("{") => Ok(Expr::Map(self.map_entries()?)),
            Tok::Quoted(_) => {
                let v = self.name("a variable")?;
                self.after_variable(v)
            }
            Tok::Ident(word) => self.word_atom(&word),
            Tok::Sym(_) => Err(self.unexpected("an expression")),
        }
    }

    fn word_atom(&mut self, word: &str) -> Result<Expr, Refusal> {
        let upper = word.to_ascii_uppercase();
        match upper.as_str() {
            "TRUE" => {
                self.pos += 1;
                return Ok(Expr::Lit(Literal::Bool(true)));
            }
            "FALSE" => {
                self.pos += 1;
                return Ok(Expr::Lit(Literal::Bool(false)));
            }
            "NULL" => {
                self.pos += 1;
                return Ok(Expr::Lit(Literal::Null));
            }
            "CASE" => {
                self.pos += 1;
                return self.case();
            }
            "EXISTS" => {
                return Err(refuse(
                    Rule::Function,
                    "EXISTS subqueries and exists() are not accepted; MATCH the pattern (or OPTIONAL MATCH it and test IS NOT NULL)",
                ));
            }
            "ALL" | "ANY" | "NONE" | "SINGLE" | "REDUCE"
                if matches!(self.peek_at(1), Some(Tok::Sym("("))) =>
            {
                return Err(refuse(
                    Rule::Function,
                    format!("{upper}(...) is not accepted; UNWIND the list and filter with WHERE"),
                ));
            }
            "COUNT" if matches!(self.peek_at(1), Some(Tok::Sym("{"))) => {
                return Err(pattern_in_expression());
            }
            _ => {}
        }
        // A keyword is never a function name (`NOT(x)` is NOT applied to `(x)`).
        if is_reserved(word) {
            return Err(self.unexpected("an expression"));
        }
        if matches!(self.peek_at(1), Some(Tok::Sym("("))) {
            return self.call(word);
        }
        // `a.b(` is a namespaced function or procedure.
        if self.namespaced_call() {
            return Err(refuse(
                Rule::Procedures,
                format!(
                    "namespaced functions and procedures (`{word}.…(`) are not accepted; they reach the raw graph. Use the functions listed in the tool description"
                ),
            ));
        }
        if is_reserved(word) {
            return Err(self.unexpected("an expression"));
        }
        let v = self.name("a variable")?;
        self.after_variable(v)
    }

    /// `a.b(` or `a.b.c(`: a namespaced function or procedure call starts here.
    fn namespaced_call(&self) -> bool {
        let mut n = 1;
        while matches!(self.peek_at(n), Some(Tok::Sym(".")))
            && matches!(self.peek_at(n + 1), Some(Tok::Ident(_)))
        {
            n += 2;
        }
        n > 1 && matches!(self.peek_at(n), Some(Tok::Sym("(")))
    }

    fn after_variable(&mut self, var: String) -> Result<Expr, Refusal> {
        if !self.is_sym("{") {
            return Ok(Expr::Var(var));
        }
        self.pos += 1;
        let mut items = Vec::new();
        if !self.eat_sym("}") {
            loop {
                if self.eat_sym(".") {
                    if self.eat_sym("*") {
                        items.push(MapItem::AllProps);
                    } else {
                        items.push(MapItem::Prop(self.key("a property name")?));
                    }
                } else {
                    let k = self.key("a map projection key")?;
                    self.expect_sym(":")?;
                    items.push(MapItem::Entry(k, self.expr()?));
                }
                if self.eat_sym("}") {
                    break;
                }
                self.expect_sym(",")?;
            }
        }
        Ok(Expr::MapProjection(var, items))
    }

    fn call(&mut self, name: &str) -> Result<Expr, Refusal> {
        let name = name.to_owned();
        self.pos += 2; // name, `(`
        if name.eq_ignore_ascii_case("count") && self.is_sym("*") {
            self.pos += 1;
            self.expect_sym(")")?;
            return Ok(Expr::CountStar);
        }
        let distinct = self.eat_kw("DISTINCT");
        let mut args = Vec::new();
        if !self.eat_sym(")") {
            loop {
                args.push(self.expr()?);
                if self.eat_sym(")") {
                    break;
                }
                self.expect_sym(",")?;
            }
        }
        Ok(Expr::Call {
            name,
            distinct,
            args,
        })
    }

    fn case(&mut self) -> Result<Expr, Refusal> {
        let operand = if self.is_kw("WHEN") {
            None
        } else {
            Some(Box::new(self.expr()?))
        };
        let mut whens = Vec::new();
        while self.eat_kw("WHEN") {
            let w = self.expr()?;
            self.expect_kw("THEN")?;
            let t = self.expr()?;
            whens.push((w, t));
        }
        if whens.is_empty() {
            return Err(self.unexpected("WHEN"));
        }
        let otherwise = if self.eat_kw("ELSE") {
            Some(Box::new(self.expr()?))
        } else {
            None
        };
        self.expect_kw("END")?;
        Ok(Expr::Case {
            operand,
            whens,
            otherwise,
        })
    }
}

fn pattern_in_expression() -> Refusal {
    refuse(
        Rule::Path,
        "patterns inside expressions (pattern predicates, COUNT { }, pattern comprehensions) are not accepted; MATCH or OPTIONAL MATCH the pattern instead",
    )
}

/// Whether `word` is reserved (case-insensitive).
pub fn is_reserved(word: &str) -> bool {
    RESERVED.iter().any(|r| r.eq_ignore_ascii_case(word))
}
