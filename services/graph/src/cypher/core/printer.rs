//! Prints a [`Statement`] back to Cypher text. Operators are parenthesised by precedence, names
//! that collide with keywords are backtick-quoted and strings are re-escaped, so the text parses
//! back to the same tree.

use std::fmt::Write;

use super::ast::*;
use super::parser::is_reserved;

/// The statement as one line of Cypher.
pub fn print_statement(stmt: &Statement) -> String {
    let parts: Vec<String> = stmt.clauses.iter().map(clause).collect();
    parts.join(" ")
}

/// One expression as Cypher.
pub fn print_expr(e: &Expr) -> String {
    let mut out = String::new();
    expr(e, &mut out);
    out
}

fn clause(c: &Clause) -> String {
    let mut out = String::new();
    match c {
        Clause::Match(m) => {
            out.push_str(if m.optional {
                "OPTIONAL MATCH "
            } else {
                "MATCH "
            });
            let ps: Vec<String> = m.patterns.iter().map(pattern).collect();
            out.push_str(&ps.join(", "));
            if let Some(w) = &m.where_ {
                out.push_str(" WHERE ");
                expr(w, &mut out);
            }
        }
        Clause::Unwind { expr: e, alias } => {
            out.push_str("UNWIND ");
            expr(e, &mut out);
            out.push_str(" AS ");
            out.push_str(&var(alias));
        }
        Clause::With(p) => projection("WITH", p, &mut out),
        Clause::Return(p) => projection("RETURN", p, &mut out),
    }
    out
}

fn projection(kw: &str, p: &Projection, out: &mut String) {
    out.push_str(kw);
    out.push(' ');
    if p.distinct {
        out.push_str("DISTINCT ");
    }
    let mut items: Vec<String> = Vec::new();
    if p.star {
        items.push("*".into());
    }
    for item in &p.items {
        let mut s = print_expr(&item.expr);
        if let Some(a) = &item.alias {
            s.push_str(" AS ");
            s.push_str(&var(a));
        }
        items.push(s);
    }
    out.push_str(&items.join(", "));
    if !p.order.is_empty() {
        out.push_str(" ORDER BY ");
        let keys: Vec<String> = p
            .order
            .iter()
            .map(|(e, desc)| {
                let mut s = print_expr(e);
                if *desc {
                    s.push_str(" DESC");
                }
                s
            })
            .collect();
        out.push_str(&keys.join(", "));
    }
    if let Some(s) = &p.skip {
        out.push_str(" SKIP ");
        expr(s, out);
    }
    if let Some(l) = &p.limit {
        out.push_str(" LIMIT ");
        expr(l, out);
    }
    if let Some(w) = &p.where_ {
        out.push_str(" WHERE ");
        expr(w, out);
    }
}

fn pattern(p: &Pattern) -> String {
    let mut out = String::new();
    node(&p.start, &mut out);
    for (r, n) in &p.hops {
        rel(r, &mut out);
        node(n, &mut out);
    }
    out
}

fn node(n: &NodePattern, out: &mut String) {
    out.push('(');
    if let Some(v) = &n.var {
        out.push_str(&var(v));
    }
    for l in &n.labels {
        out.push(':');
        out.push_str(&var(l));
    }
    if !n.props.is_empty() {
        if n.var.is_some() || !n.labels.is_empty() {
            out.push(' ');
        }
        map(&n.props, out);
    }
    out.push(')');
}

fn rel(r: &RelPattern, out: &mut String) {
    out.push_str(if r.direction == Direction::Left {
        "<-["
    } else {
        "-["
    });
    if let Some(v) = &r.var {
        out.push_str(&var(v));
    }
    let types: Vec<String> = r.types.iter().map(|t| var(t)).collect();
    if !types.is_empty() {
        out.push(':');
        out.push_str(&types.join("|"));
    }
    if r.var_length {
        out.push('*');
    }
    if !r.props.is_empty() {
        out.push(' ');
        map(&r.props, out);
    }
    out.push_str(if r.direction == Direction::Right {
        "]->"
    } else {
        "]-"
    });
}

fn map(entries: &[(String, Expr)], out: &mut String) {
    out.push('{');
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        out.push_str(&var(k));
        out.push_str(": ");
        expr(v, out);
    }
    out.push('}');
}

/// A name, backtick-quoted when it is a keyword (names are always plain: the lexer checks).
fn var(name: &str) -> String {
    // Words the parser treats specially before a `{` or `(` are quoted too.
    const SPECIAL: &[&str] = &[
        "COUNT",
        "ANY",
        "NONE",
        "SINGLE",
        "REDUCE",
        "SHORTESTPATH",
        "ALLSHORTESTPATHS",
    ];
    if is_reserved(name) || SPECIAL.iter().any(|w| w.eq_ignore_ascii_case(name)) {
        format!("`{name}`")
    } else {
        name.to_owned()
    }
}

const ATOM: u8 = 11;

fn op_prec(op: BinOp) -> u8 {
    match op {
        BinOp::Or => 1,
        BinOp::Xor => 2,
        BinOp::And => 3,
        BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => 5,
        BinOp::In | BinOp::StartsWith | BinOp::EndsWith | BinOp::Contains => 6,
        BinOp::Add | BinOp::Sub => 7,
        BinOp::Mul | BinOp::Div | BinOp::Mod => 8,
        BinOp::Pow => 9,
    }
}

fn prec(e: &Expr) -> u8 {
    match e {
        Expr::Binary(op, _, _) => op_prec(*op),
        Expr::Unary(UnOp::Not, _) => 4,
        Expr::IsNull(_, _) => 6,
        Expr::Unary(UnOp::Neg, _) => 10,
        _ => ATOM,
    }
}

fn op_text(op: BinOp) -> &'static str {
    match op {
        BinOp::Or => "OR",
        BinOp::Xor => "XOR",
        BinOp::And => "AND",
        BinOp::Eq => "=",
        BinOp::Ne => "<>",
        BinOp::Lt => "<",
        BinOp::Le => "<=",
        BinOp::Gt => ">",
        BinOp::Ge => ">=",
        BinOp::In => "IN",
        BinOp::StartsWith => "STARTS WITH",
        BinOp::EndsWith => "ENDS WITH",
        BinOp::Contains => "CONTAINS",
        BinOp::Add => "+",
        BinOp::Sub => "-",
        BinOp::Mul => "*",
        BinOp::Div => "/",
        BinOp::Mod => "%",
        BinOp::Pow => "^",
    }
}

fn wrapped(e: &Expr, parens: bool, out: &mut String) {
    if parens {
        out.push('(');
        expr(e, out);
        out.push(')');
    } else {
        expr(e, out);
    }
}

fn expr(e: &Expr, out: &mut String) {
    match e {
        Expr::Lit(l) => literal(l, out),
        Expr::Param(p) => {
            out.push('$');
            out.push_str(p);
        }
        Expr::Var(v) => out.push_str(&var(v)),
        Expr::Prop(base, k) => {
            wrapped(base, prec(base) < ATOM, out);
            out.push('.');
            out.push_str(&var(k));
        }
        Expr::Index(base, i) => {
            wrapped(base, prec(base) < ATOM, out);
            out.push('[');
            expr(i, out);
            out.push(']');
        }
        Expr::Unary(UnOp::Not, inner) => {
            // Parenthesised unless atomic: engines differ on NOT against STARTS WITH / IN.
            out.push_str("NOT ");
            wrapped(inner, prec(inner) < ATOM, out);
        }
        Expr::Unary(UnOp::Neg, inner) => {
            out.push('-');
            // `- -x` would print `--`, which reads as a relationship: parenthesise.
            wrapped(inner, prec(inner) < ATOM, out);
        }
        Expr::Binary(op, l, r) => {
            let p = op_prec(*op);
            // Comparisons and string/list predicates take atomic operands or parentheses, so
            // no engine-specific precedence can regroup an access predicate.
            let strict = p == 5 || p == 6;
            wrapped(l, prec(l) < p || (strict && prec(l) < ATOM), out);
            out.push(' ');
            out.push_str(op_text(*op));
            out.push(' ');
            // A right side starting with `-` is parenthesised: `(a) - -b` or `(a) < -b` would
            // read `--` / `<-` as a relationship.
            let mut right = String::new();
            wrapped(r, prec(r) <= p || (strict && prec(r) < ATOM), &mut right);
            if right.starts_with('-') {
                out.push('(');
                out.push_str(&right);
                out.push(')');
            } else {
                out.push_str(&right);
            }
        }
        Expr::IsNull(inner, negated) => {
            wrapped(inner, prec(inner) < ATOM, out);
            out.push_str(if *negated { " IS NOT NULL" } else { " IS NULL" });
        }
        Expr::Call {
            name,
            distinct,
            args,
        } => {
            out.push_str(name);
            out.push('(');
            if *distinct {
                out.push_str("DISTINCT ");
            }
            for (i, a) in args.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                expr(a, out);
            }
            out.push(')');
        }
        Expr::CountStar => out.push_str("count(*)"),
        Expr::List(items) => {
            out.push('[');
            for (i, a) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                expr(a, out);
            }
            out.push(']');
        }
        Expr::Map(entries) => map(entries, out),
        Expr::MapProjection(v, items) => {
            out.push_str(&var(v));
            out.push_str(" {");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                match item {
                    MapItem::Prop(k) => {
                        out.push('.');
                        out.push_str(&var(k));
                    }
                    MapItem::AllProps => out.push_str(".*"),
                    MapItem::Entry(k, v) => {
                        out.push_str(&var(k));
                        out.push_str(": ");
                        expr(v, out);
                    }
                }
            }
            out.push('}');
        }
        Expr::Case {
            operand,
            whens,
            otherwise,
        } => {
            out.push_str("CASE");
            if let Some(o) = operand {
                out.push(' ');
                expr(o, out);
            }
            for (w, t) in whens {
                out.push_str(" WHEN ");
                expr(w, out);
                out.push_str(" THEN ");
                expr(t, out);
            }
            if let Some(o) = otherwise {
                out.push_str(" ELSE ");
                expr(o, out);
            }
            out.push_str(" END");
        }
    }
}

fn literal(l: &Literal, out: &mut String) {
    match l {
        Literal::Null => out.push_str("null"),
        Literal::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Literal::Int(n) => {
            let _ = write!(out, "{n}");
        }
        Literal::Float(f) => {
            let s = format!("{f}");
            out.push_str(&s);
            if !s.contains(['.', 'e', 'E']) {
                out.push_str(".0");
            }
        }
        Literal::Str(s) => {
            out.push('\'');
            for c in s.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\'' => out.push_str("\\'"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    '\u{8}' => out.push_str("\\b"),
                    '\u{c}' => out.push_str("\\f"),
                    c => out.push(c),
                }
            }
            out.push('\'');
        }
    }
}
