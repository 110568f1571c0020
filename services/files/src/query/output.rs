//! Results are untrusted text: every string is sanitised, and a result never
//! grows past the caller's byte budget.

use kg_common::sanitize::{DEFAULT_FIELD_CAP, sanitize_text};
use serde_json::{Map, Value};

/// Counts the bytes a value serialises to, without building the string.
struct Counter(usize);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len();
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Serialised size of `value` in bytes.
pub(crate) fn json_len(value: &Value) -> usize {
    let mut counter = Counter(0);
    // Writing a Value into a counter cannot fail.
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

/// Sanitises every string (keys included) of `value`.
pub(crate) fn sanitize_json(value: Value) -> Value {
    match value {
        Value::String(s) => Value::String(sanitize_text(&s, DEFAULT_FIELD_CAP)),
        Value::Array(items) => Value::Array(items.into_iter().map(sanitize_json).collect()),
        Value::Object(map) => Value::Object(
            map.into_iter()
                .map(|(k, v)| (sanitize_text(&k, DEFAULT_FIELD_CAP), sanitize_json(v)))
                .collect(),
        ),
        other => other,
    }
}

/// Cuts `value` to at most `budget` serialised bytes: arrays and objects keep
/// their leading items, a string keeps its leading characters. Returns whether
/// anything was cut.
pub(crate) fn fit_json(value: Value, budget: usize) -> (Value, bool) {
    if json_len(&value) <= budget {
        return (value, false);
    }
    let fitted = match value {
        Value::Array(items) => {
            let mut used = 2;
            let mut kept = Vec::new();
            for item in items {
                let len = json_len(&item) + 1;
                if used + len <= budget {
                    used += len;
                    kept.push(item);
                } else {
                    // The first item that does not fit may still fit in part.
                    let room = budget.saturating_sub(used + 1);
                    if room > 16 {
                        kept.push(fit_json(item, room).0);
                    }
                    break;
                }
            }
            Value::Array(kept)
        }
        Value::Object(map) => {
            let mut used = 2;
            let mut kept = Map::new();
            for (key, item) in map {
                let key_len = json_len(&Value::String(key.clone())) + 2;
                let len = key_len + json_len(&item);
                if used + len <= budget {
                    used += len;
                    kept.insert(key, item);
                } else {
                    let room = budget.saturating_sub(used + key_len);
                    if room > 16 {
                        kept.insert(key, fit_json(item, room).0);
                    }
                    break;
                }
            }
            Value::Object(kept)
        }
        Value::String(s) => {
            // Escapes can double a character's size; halve to stay inside.
            let keep = budget.saturating_sub(8) / 2;
            Value::String(s.chars().take(keep).collect())
        }
        _ => Value::Null,
    };
    (fitted, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sanitises_strings_and_keys() {
        let v = sanitize_json(json!({"a\u{202e}b": ["x\u{200b}y", 1, {"k": "\u{1b}[31mred"}]}));
        assert_eq!(v, json!({"ab": ["xy", 1, {"k": "red"}]}));
    }

    #[test]
    fn fits_arrays_objects_and_strings() {
        let big: Vec<Value> = (0..1000)
            .map(|i| json!({"i": i, "s": "x".repeat(50)}))
            .collect();
        let (v, cut) = fit_json(Value::Array(big), 2000);
        assert!(cut);
        assert!(json_len(&v) <= 2000, "{}", json_len(&v));
        assert!(!v.as_array().map(Vec::is_empty).unwrap_or(true));

        let (v, cut) = fit_json(json!({"a": "y".repeat(5000)}), 300);
        assert!(cut);
        assert!(json_len(&v) <= 300);

        let small = json!({"a": 1});
        assert_eq!(fit_json(small.clone(), 100), (small, false));
    }
}
