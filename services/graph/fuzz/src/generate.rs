//! A grammar-aware generator of kg_cypher statements (valid, nearly valid and hostile) and a
//! byte mutator, driven by a small deterministic PRNG so a failing seed can be replayed.

/// xorshift64*: deterministic and dependency-free.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (0 is replaced).
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    /// The next 64 random bits.
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// True with probability 1/n.
    pub fn one_in(&mut self, n: usize) -> bool {
        self.below(n) == 0
    }

    /// One element of `items`.
    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }
}

const LABELS: &[&str] = &[
    "Chunk",
    "FileRef",
    "Entity",
    "EntityType",
    "OutlineNode",
    "Folder",
    "Chunk",
    "FileRef",
    "Secret",
    "chunk",
];
const TYPES: &[&str] = &[
    "PART_OF",
    "NEXT_CHUNK",
    "HAS_CHILD",
    "COVERS",
    "HAS_SUBSECTION",
    "MENTIONS",
    "INSTANCE_OF",
    "REL",
    "MENTIONS",
    "REL",
    "OWNS",
];
const VARS: &[&str] = &[
    "c", "f", "e", "e2", "o", "d", "t", "r", "m", "x", "kg_n1", "`c`", "`match`",
];
const PROPS: &[&str] = &[
    "text",
    "path",
    "vfsPath",
    "name",
    "enabled",
    "fileId",
    "folderPath",
    "title",
    "order",
];
const FUNCS: &[&str] = &[
    "count",
    "collect",
    "toLower",
    "size",
    "id",
    "labels",
    "type",
    "coalesce",
    "head",
    "keys",
    "db.labels",
    "apoc.do",
    "range",
    "exists",
    "properties",
    "sum",
    "max",
];
const HOSTILE: &[&str] = &[
    "' OR true //",
    "\\' RETURN 1 //",
    "*/ MATCH (n) RETURN n /*",
    "$kg_acl_allow_0",
    "kg_n1",
    "; MATCH (n) DETACH DELETE n",
    "CALL db.labels()",
    "\u{202e}",
    "`",
    "\\u0027",
];

/// A random statement, mostly shaped like the accepted subset.
pub fn statement(rng: &mut Rng) -> String {
    let mut out = String::new();
    let clauses = 1 + rng.below(4);
    for _ in 0..clauses {
        match rng.below(7) {
            0..=2 => {
                if rng.one_in(3) {
                    out.push_str("OPTIONAL ");
                }
                out.push_str("MATCH ");
                let paths = 1 + rng.below(2);
                for i in 0..paths {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    path(rng, &mut out);
                }
                if rng.one_in(2) {
                    out.push_str(" WHERE ");
                    expr(rng, &mut out, 0);
                }
            }
            3 => {
                out.push_str("WITH ");
                items(rng, &mut out);
                if rng.one_in(3) {
                    out.push_str(" WHERE ");
                    expr(rng, &mut out, 0);
                }
            }
            4 => {
                out.push_str("UNWIND ");
                expr(rng, &mut out, 1);
                out.push_str(" AS ");
                out.push_str(rng.pick(VARS));
            }
            5 => out.push_str(rng.pick(&[
                "CREATE (n:Chunk)",
                "SET c.enabled = true",
                "CALL db.idx.fulltext.queryNodes('Chunk', 'x') YIELD node",
                "MERGE (x:Entity)",
                "DELETE c",
                "LOAD CSV FROM 'x' AS l",
                "UNION",
            ])),
            _ => {}
        }
        out.push(' ');
    }
    out.push_str("RETURN ");
    if rng.one_in(6) {
        out.push_str("DISTINCT ");
    }
    items(rng, &mut out);
    if rng.one_in(3) {
        out.push_str(" ORDER BY ");
        expr(rng, &mut out, 1);
        if rng.one_in(2) {
            out.push_str(" DESC");
        }
    }
    if rng.one_in(8) {
        out.push_str(" SKIP 5");
    }
    if !rng.one_in(8) {
        out.push_str(" LIMIT ");
        out.push_str(rng.pick(&["10", "1", "50", "51", "0", "$n", "5"]));
    }
    if rng.one_in(10) {
        out.push_str(rng.pick(HOSTILE));
    }
    out
}

fn node(rng: &mut Rng, out: &mut String) {
    out.push('(');
    if !rng.one_in(4) {
        out.push_str(rng.pick(VARS));
    }
    if !rng.one_in(5) {
        out.push(':');
        out.push_str(rng.pick(LABELS));
    }
    if rng.one_in(6) {
        out.push_str(" {");
        out.push_str(rng.pick(PROPS));
        out.push_str(": ");
        expr(rng, out, 2);
        out.push('}');
    }
    out.push(')');
}

fn path(rng: &mut Rng, out: &mut String) {
    node(rng, out);
    let hops = rng.below(4);
    for _ in 0..hops {
        let left = rng.one_in(3);
        out.push_str(if left { "<-[" } else { "-[" });
        if rng.one_in(2) {
            out.push_str(rng.pick(VARS));
        }
        if !rng.one_in(8) {
            out.push(':');
            out.push_str(rng.pick(TYPES));
        }
        if rng.one_in(12) {
            out.push_str("*1..3");
        }
        out.push(']');
        out.push_str(if left || rng.one_in(4) { "-" } else { "->" });
        node(rng, out);
    }
}

fn items(rng: &mut Rng, out: &mut String) {
    let n = 1 + rng.below(3);
    for i in 0..n {
        if i > 0 {
            out.push_str(", ");
        }
        if rng.one_in(10) {
            out.push('*');
            continue;
        }
        expr(rng, out, 1);
        if rng.one_in(2) {
            out.push_str(" AS ");
            out.push_str(rng.pick(&["a", "b", "path", "text", "kg_x", "n"]));
        }
    }
}

fn expr(rng: &mut Rng, out: &mut String, depth: usize) {
    if depth > 4 {
        out.push_str(rng.pick(VARS));
        return;
    }
    match rng.below(14) {
        0 => {
            out.push_str(rng.pick(VARS));
            out.push('.');
            out.push_str(rng.pick(PROPS));
        }
        1 => out.push_str(rng.pick(VARS)),
        2 => out.push_str(rng.pick(&[
            "1",
            "-2",
            "3.5",
            "'dkim'",
            "\"a\\\"b\"",
            "null",
            "true",
            "[1, 2]",
            "{a: 1}",
            "$afterId",
            "$kg_acl_allow_0",
            "9223372036854775807",
        ])),
        3 | 4 => {
            expr(rng, out, depth + 1);
            out.push(' ');
            out.push_str(rng.pick(&[
                "AND",
                "OR",
                "XOR",
                "=",
                "<>",
                "<",
                ">=",
                "+",
                "-",
                "*",
                "/",
                "%",
                "^",
                "CONTAINS",
                "STARTS WITH",
                "ENDS WITH",
                "IN",
            ]));
            out.push(' ');
            expr(rng, out, depth + 1);
        }
        5 => {
            out.push_str("NOT ");
            expr(rng, out, depth + 1);
        }
        6 | 7 => {
            out.push_str(rng.pick(FUNCS));
            out.push('(');
            if rng.one_in(4) {
                out.push_str("DISTINCT ");
            }
            expr(rng, out, depth + 1);
            out.push(')');
        }
        8 => out.push_str("count(*)"),
        9 => {
            out.push('(');
            expr(rng, out, depth + 1);
            out.push(')');
        }
        10 => {
            expr(rng, out, depth + 1);
            out.push_str(rng.pick(&[" IS NULL", " IS NOT NULL"]));
        }
        11 => {
            out.push_str("CASE WHEN ");
            expr(rng, out, depth + 1);
            out.push_str(" THEN ");
            expr(rng, out, depth + 1);
            out.push_str(" ELSE 0 END");
        }
        12 => {
            out.push_str(rng.pick(VARS));
            out.push_str(" {.");
            out.push_str(rng.pick(PROPS));
            out.push_str(", k: ");
            expr(rng, out, depth + 1);
            out.push('}');
        }
        _ => {
            out.push('-');
            expr(rng, out, depth + 1);
        }
    }
}

/// Byte-level mutations: flip, insert, delete, duplicate a span, splice a hostile fragment.
pub fn mutate(rng: &mut Rng, input: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    let rounds = 1 + rng.below(4);
    for _ in 0..rounds {
        let len = out.len();
        match rng.below(6) {
            0 if len > 0 => {
                let i = rng.below(len);
                out[i] ^= 1 << rng.below(8);
            }
            1 => {
                let i = rng.below(len + 1);
                let b = *b"()[]{}-<>:,.'\"`$*;/ \\AN"
                    .get(rng.below(23))
                    .unwrap_or(&b' ');
                out.insert(i, b);
            }
            2 if len > 0 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(8));
                out.drain(i..i + n);
            }
            3 if len > 1 => {
                let i = rng.below(len);
                let n = 1 + rng.below((len - i).min(16));
                let span: Vec<u8> = out[i..i + n].to_vec();
                let at = rng.below(out.len() + 1);
                out.splice(at..at, span);
            }
            4 => {
                let frag = rng.pick(HOSTILE).as_bytes().to_vec();
                let at = rng.below(len + 1);
                out.splice(at..at, frag);
            }
            _ => {}
        }
    }
    out
}
