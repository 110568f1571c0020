//! `format: "jsonpath"` (RFC 9535), `"jsonata"` and `"jinja"` over a JSON file.

use std::time::Duration;

use jsonata_core::evaluator::EvaluatorOptions;
use jsonata_core::value::JValue;
use minijinja::{AutoEscape, Environment, ErrorKind};
use serde_json::Value;

use crate::error::{FilesError, Result};
use crate::limits::human_duration;

/// Deepest JSONata evaluation stack; deeper is "too costly".
const JSONATA_MAX_DEPTH: usize = 2000;
/// Longest sequence a JSONata step may build.
const JSONATA_MAX_SEQUENCE: usize = 1_000_000;
/// Template nesting (includes, macros, blocks) a Jinja render may reach.
const JINJA_RECURSION: usize = 100;

/// Parses the file as JSON; a broken file is a precondition failure that
/// names the position.
pub(crate) fn parse_document(bytes: &[u8]) -> Result<Value> {
    serde_json::from_slice(bytes)
        .map_err(|err| FilesError::BadContent(format!("the file is not valid JSON: {err}")))
}

/// RFC 9535 JSONPath: the matched nodes, at most `max_nodes` (second value:
/// whether more matched).
pub(crate) fn jsonpath(document: &Value, query: &str, max_nodes: usize) -> Result<(Value, bool)> {
    let path = serde_json_path::JsonPath::parse(query)
        .map_err(|err| FilesError::Invalid(format!("invalid JSONPath: {err}")))?;
    let nodes = path.query(document).all();
    let more = nodes.len() > max_nodes;
    let kept = nodes.into_iter().take(max_nodes).cloned().collect();
    Ok((Value::Array(kept), more))
}

/// JSONata with a time limit, a stack limit and a sequence limit.
pub(crate) fn jsonata(document: Value, query: &str, timeout: Duration) -> Result<Value> {
    let options = EvaluatorOptions {
        timeout_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        max_stack_depth: Some(JSONATA_MAX_DEPTH),
        max_sequence_length: Some(JSONATA_MAX_SEQUENCE),
        ..Default::default()
    };
    let expression = jsonata_core::Expression::compile_with_options(query, options)
        .map_err(|err| FilesError::Invalid(format!("invalid JSONata expression: {err}")))?;
    let data = JValue::from(document);
    let result = expression.evaluate(&data).map_err(|err| {
        let message = err.message().to_owned();
        match err.code() {
            Some("D1012") => FilesError::Timeout(format!(
                "the JSONata expression ran past its time limit of {}",
                human_duration(timeout)
            )),
            Some("D1011" | "U1001" | "D2015") => {
                FilesError::TooCostly(format!("the JSONata expression is too costly: {message}"))
            }
            _ => FilesError::Invalid(format!("the JSONata expression failed: {message}")),
        }
    })?;
    serde_json::to_value(&result)
        .map_err(|err| FilesError::Invalid(format!("the JSONata result is not JSON: {err}")))
}

/// Collects rendered output up to a cap, then refuses more (which stops the
/// render).
struct CappedOutput {
    bytes: Vec<u8>,
    cap: usize,
    full: bool,
}

impl std::io::Write for CappedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = self.cap.saturating_sub(self.bytes.len());
        if buf.len() > room {
            self.bytes.extend_from_slice(&buf[..room]);
            self.full = true;
            return Err(std::io::Error::other("output cap reached"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Renders a Jinja template with the document as `data`: no loader (no
/// includes from anywhere), no auto-escaping, bounded by fuel and by
/// `max_bytes` of output (second value: whether the output was cut).
pub(crate) fn jinja(
    document: Value,
    template: &str,
    fuel: u64,
    max_bytes: usize,
) -> Result<(String, bool)> {
    let mut env = Environment::new();
    env.set_fuel(Some(fuel));
    env.set_recursion_limit(JINJA_RECURSION);
    env.set_auto_escape_callback(|_| AutoEscape::None);
    let compiled = env
        .template_from_str(template)
        .map_err(|err| FilesError::Invalid(format!("invalid Jinja template: {err}")))?;
    let context =
        minijinja::context! { data => minijinja::Value::from(minijinja::value::Serde(&document)) };
    let mut out = CappedOutput {
        bytes: Vec::new(),
        cap: max_bytes,
        full: false,
    };
    let rendered = compiled.render_captured_to(context, &mut out);
    match rendered {
        Ok(_) => {}
        Err(_) if out.full => {}
        Err(err) if err.kind() == ErrorKind::OutOfFuel => {
            return Err(FilesError::TooCostly(format!(
                "the Jinja template ran out of fuel ({fuel} steps); loop over less data"
            )));
        }
        Err(err) => {
            return Err(FilesError::Invalid(format!(
                "the Jinja template failed: {err}"
            )));
        }
    }
    Ok((String::from_utf8_lossy(&out.bytes).into_owned(), out.full))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use kg_common::{ErrorCode, ErrorExt as _};
    use serde_json::json;

    fn doc() -> Value {
        json!({"store": {"books": [
            {"title": "A", "price": 8, "tags": ["x"]},
            {"title": "B", "price": 12, "tags": []},
            {"title": "C", "price": 30, "tags": ["y", "z"]}
        ]}})
    }

    #[test]
    fn jsonpath_filters_and_caps() {
        let (v, more) = jsonpath(&doc(), "$.store.books[?@.price > 10].title", 10).unwrap();
        assert_eq!(v, json!(["B", "C"]));
        assert!(!more);
        let (v, more) = jsonpath(&doc(), "$..title", 2).unwrap();
        assert_eq!(v, json!(["A", "B"]));
        assert!(more);
        let err = jsonpath(&doc(), "$.store[", 10).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        assert!(err.to_string().contains("position"), "{err}");
    }

    #[test]
    fn jsonata_evaluates_and_bounds_runaways() {
        let v = jsonata(doc(), "$sum(store.books.price)", Duration::from_secs(2)).unwrap();
        assert_eq!(v, json!(50));
        let err = jsonata(
            doc(),
            "($f := function($x){ $f($x) + 1 }; $f(1))",
            Duration::from_secs(2),
        )
        .unwrap_err();
        assert!(
            matches!(
                err.code(),
                ErrorCode::ResourceExhausted | ErrorCode::Timeout
            ),
            "{err}"
        );
        let err = jsonata(doc(), "store.books[", Duration::from_secs(2)).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
    }

    #[test]
    fn jinja_renders_with_fuel_and_output_caps() {
        let (out, cut) = jinja(
            doc(),
            "{% for b in data.store.books %}{{ b.title }}<{{ b.price }}>;{% endfor %}",
            10_000,
            1000,
        )
        .unwrap();
        assert_eq!(out, "A<8>;B<12>;C<30>;");
        assert!(!cut);
        let (out, cut) = jinja(
            doc(),
            "{% for i in range(100000) %}xxxxxxxxxx{% endfor %}",
            10_000_000,
            100,
        )
        .unwrap();
        assert!(cut);
        assert_eq!(out.len(), 100);
        let err = jinja(
            doc(),
            "{% for i in range(100000) %}{{ i }}{% endfor %}",
            1000,
            1 << 20,
        )
        .unwrap_err();
        assert_eq!(err.code(), ErrorCode::ResourceExhausted, "{err}");
        let err = jinja(doc(), "{% for %}", 1000, 1000).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
        // No loader: includes cannot reach anything.
        let err = jinja(doc(), "{% include '/etc/passwd' %}", 1000, 1000).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidArgument);
    }

    #[test]
    fn broken_json_names_the_position() {
        let err = parse_document(b"{\n  \"a\": 1,\n  \"b\": }").unwrap_err();
        assert_eq!(err.code(), ErrorCode::FailedPrecondition);
        assert!(err.to_string().contains("line 3"), "{err}");
    }
}
