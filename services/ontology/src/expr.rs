//! `approval.when` expressions: comparisons over action parameters combined
//! with `and`, `or`, `not`. Parsed once at validation; evaluated per call.

use serde_json::{Map, Value};

/// A parsed expression.
#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    /// A literal.
    Lit(Lit),
    /// A parameter.
    Var(String),
    /// `not e`.
    Not(Box<Expr>),
    /// `a and b`.
    And(Box<Expr>, Box<Expr>),
    /// `a or b`.
    Or(Box<Expr>, Box<Expr>),
    /// `a <op> b`.
    Cmp(Box<Expr>, CmpOp, Box<Expr>),
}

/// Literal values.
#[derive(Debug, Clone, PartialEq)]
pub enum Lit {
    /// Number.
    Num(f64),
    /// String.
    Str(String),
    /// Boolean.
    Bool(bool),
}

/// Comparison operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `==`
    Eq,
    /// `!=`
    Ne,
}

/// Why evaluation failed.
#[derive(Debug, Clone, PartialEq)]
pub enum EvalError {
    /// A referenced parameter was not supplied.
    Missing(String),
    /// Types do not fit the operator.
    Type(String),
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Num(f64),
    Str(String),
    Ident(String),
    Op(CmpOp),
    LParen,
    RParen,
}

fn lex(text: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => i += 1,
            '(' => {
                out.push(Tok::LParen);
                i += 1;
            }
            ')' => {
                out.push(Tok::RParen);
                i += 1;
            }
            '>' | '<' | '=' | '!' => {
                let next = chars.get(i + 1).copied();
                let (op, len) = match (c, next) {
                    ('>', Some('=')) => (CmpOp::Ge, 2),
                    ('>', _) => (CmpOp::Gt, 1),
                    ('<', Some('=')) => (CmpOp::Le, 2),
                    ('<', _) => (CmpOp::Lt, 1),
                    ('=', Some('=')) => (CmpOp::Eq, 2),
                    ('!', Some('=')) => (CmpOp::Ne, 2),
                    _ => return Err(format!("unexpected `{c}` at {i}; use ==, !=, >, >=, <, <=")),
                };
                out.push(Tok::Op(op));
                i += len;
            }
            '\'' | '"' => {
                let quote = c;
                let mut s = String::new();
                i += 1;
                loop {
                    match chars.get(i) {
                        None => return Err("unterminated string literal".into()),
                        Some(&q) if q == quote => {
                            i += 1;
                            break;
                        }
                        Some(&ch) => {
                            s.push(ch);
                            i += 1;
                        }
                    }
                }
                out.push(Tok::Str(s));
            }
            c if c.is_ascii_digit()
                || (c == '-' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) =>
            {
                let start = i;
                i += 1;
                while chars
                    .get(i)
                    .is_some_and(|d| d.is_ascii_digit() || *d == '.')
                {
                    i += 1;
                }
                let s: String = chars[start..i].iter().collect();
                out.push(Tok::Num(
                    s.parse().map_err(|_| format!("bad number `{s}`"))?,
                ));
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let start = i;
                while chars
                    .get(i)
                    .is_some_and(|d| d.is_ascii_alphanumeric() || *d == '_')
                {
                    i += 1;
                }
                out.push(Tok::Ident(chars[start..i].iter().collect()));
            }
            other => return Err(format!("unexpected `{other}` at {i}")),
        }
    }
    Ok(out)
}

struct Parser {
    toks: Vec<Tok>,
    pos: usize,
}

impl Parser {
    fn peek_ident(&self, word: &str) -> bool {
        matches!(self.toks.get(self.pos), Some(Tok::Ident(w)) if w.eq_ignore_ascii_case(word))
    }

    fn or(&mut self) -> Result<Expr, String> {
        let mut left = self.and()?;
        while self.peek_ident("or") {
            self.pos += 1;
            left = Expr::Or(Box::new(left), Box::new(self.and()?));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, String> {
        let mut left = self.not()?;
        while self.peek_ident("and") {
            self.pos += 1;
            left = Expr::And(Box::new(left), Box::new(self.not()?));
        }
        Ok(left)
    }

    fn not(&mut self) -> Result<Expr, String> {
        if self.peek_ident("not") {
            self.pos += 1;
            return Ok(Expr::Not(Box::new(self.not()?)));
        }
        self.cmp()
    }

    fn cmp(&mut self) -> Result<Expr, String> {
        let left = self.primary()?;
        if let Some(Tok::Op(op)) = self.toks.get(self.pos).cloned() {
            self.pos += 1;
            let right = self.primary()?;
            return Ok(Expr::Cmp(Box::new(left), op, Box::new(right)));
        }
        Ok(left)
    }

    fn primary(&mut self) -> Result<Expr, String> {
        let tok = self.toks.get(self.pos).cloned();
        self.pos += 1;
        match tok {
            Some(Tok::Num(n)) => Ok(Expr::Lit(Lit::Num(n))),
            Some(Tok::Str(s)) => Ok(Expr::Lit(Lit::Str(s))),
            Some(Tok::Ident(w)) if w == "true" => Ok(Expr::Lit(Lit::Bool(true))),
            Some(Tok::Ident(w)) if w == "false" => Ok(Expr::Lit(Lit::Bool(false))),
            Some(Tok::Ident(w))
                if ["and", "or", "not"].contains(&w.to_ascii_lowercase().as_str()) =>
            {
                Err(format!("`{w}` where a value was expected"))
            }
            Some(Tok::Ident(w)) => Ok(Expr::Var(w)),
            Some(Tok::LParen) => {
                let inner = self.or()?;
                match self.toks.get(self.pos) {
                    Some(Tok::RParen) => {
                        self.pos += 1;
                        Ok(inner)
                    }
                    _ => Err("missing `)`".into()),
                }
            }
            Some(t) => Err(format!("unexpected {t:?}")),
            None => Err("the expression ends early".into()),
        }
    }
}

/// Parses an expression.
pub fn parse(text: &str) -> Result<Expr, String> {
    let toks = lex(text)?;
    if toks.is_empty() {
        return Err("the expression is empty".into());
    }
    let mut p = Parser { toks, pos: 0 };
    let e = p.or()?;
    if p.pos != p.toks.len() {
        return Err(format!("unexpected text after token {}", p.pos));
    }
    Ok(e)
}

impl Expr {
    /// Every parameter the expression reads.
    pub fn variables(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.collect(&mut out);
        out
    }

    fn collect(&self, out: &mut Vec<String>) {
        match self {
            Expr::Lit(_) => {}
            Expr::Var(v) => {
                if !out.contains(v) {
                    out.push(v.clone());
                }
            }
            Expr::Not(e) => e.collect(out),
            Expr::And(a, b) | Expr::Or(a, b) | Expr::Cmp(a, _, b) => {
                a.collect(out);
                b.collect(out);
            }
        }
    }

    /// Evaluates to a boolean over supplied parameters. Every referenced
    /// parameter must be present, even where the other side would decide.
    pub fn eval_bool(&self, params: &Map<String, Value>) -> Result<bool, EvalError> {
        for v in self.variables() {
            if params.get(&v).is_none_or(Value::is_null) {
                return Err(EvalError::Missing(v));
            }
        }
        match self.value(params)? {
            Lit::Bool(b) => Ok(b),
            other => Err(EvalError::Type(format!(
                "the expression is {other:?}, not true/false"
            ))),
        }
    }

    fn value(&self, params: &Map<String, Value>) -> Result<Lit, EvalError> {
        Ok(match self {
            Expr::Lit(l) => l.clone(),
            Expr::Var(v) => match params.get(v) {
                Some(Value::Number(n)) => Lit::Num(n.as_f64().unwrap_or(f64::NAN)),
                Some(Value::String(s)) => Lit::Str(s.clone()),
                Some(Value::Bool(b)) => Lit::Bool(*b),
                _ => return Err(EvalError::Missing(v.clone())),
            },
            Expr::Not(e) => Lit::Bool(!truthy(e.value(params)?)?),
            Expr::And(a, b) => Lit::Bool(truthy(a.value(params)?)? && truthy(b.value(params)?)?),
            Expr::Or(a, b) => Lit::Bool(truthy(a.value(params)?)? || truthy(b.value(params)?)?),
            Expr::Cmp(a, op, b) => {
                let (a, b) = (a.value(params)?, b.value(params)?);
                let ord = match (&a, &b) {
                    (Lit::Num(x), Lit::Num(y)) => x.partial_cmp(y),
                    (Lit::Str(x), Lit::Str(y)) => Some(x.cmp(y)),
                    (Lit::Bool(x), Lit::Bool(y)) if matches!(op, CmpOp::Eq | CmpOp::Ne) => {
                        Some(x.cmp(y))
                    }
                    _ => return Err(EvalError::Type(format!("cannot compare {a:?} with {b:?}"))),
                };
                let Some(ord) = ord else {
                    return Ok(Lit::Bool(false));
                };
                use std::cmp::Ordering::*;
                Lit::Bool(match op {
                    CmpOp::Gt => ord == Greater,
                    CmpOp::Ge => ord != Less,
                    CmpOp::Lt => ord == Less,
                    CmpOp::Le => ord != Greater,
                    CmpOp::Eq => ord == Equal,
                    CmpOp::Ne => ord != Equal,
                })
            }
        })
    }
}

fn truthy(l: Lit) -> Result<bool, EvalError> {
    match l {
        Lit::Bool(b) => Ok(b),
        other => Err(EvalError::Type(format!("{other:?} is not true/false"))),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn evaluates_comparisons_and_logic() {
        let e = parse("amount > 100").unwrap();
        assert_eq!(e.variables(), ["amount"]);
        assert!(e.eval_bool(&params(json!({"amount": 150}))).unwrap());
        assert!(!e.eval_bool(&params(json!({"amount": 100}))).unwrap());
        assert_eq!(
            e.eval_bool(&params(json!({}))),
            Err(EvalError::Missing("amount".into()))
        );
        let e = parse("not (amount <= 10 or reason == 'fraud') and urgent").unwrap();
        assert_eq!(e.variables(), ["amount", "reason", "urgent"]);
        assert!(
            e.eval_bool(&params(
                json!({"amount": 50, "reason": "x", "urgent": true})
            ))
            .unwrap()
        );
        assert!(
            !e.eval_bool(&params(
                json!({"amount": 50, "reason": "fraud", "urgent": true})
            ))
            .unwrap()
        );
        assert!(parse("amount >").is_err());
        assert!(parse("amount = 3").is_err());
        assert!(parse("(a > 1").is_err());
        assert!(parse("").is_err());
        assert!(matches!(
            parse("a > 'x'")
                .unwrap()
                .eval_bool(&params(json!({"a": 1}))),
            Err(EvalError::Type(_))
        ));
    }
}
