//! Renders an action's webhook effect for one call: URL and body templates
//! (minijinja) over the record identity and the call's parameters.

use kg_proto::v1::WebhookEffect;
use minijinja::{Environment, UndefinedBehavior};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde_json::{Map, Value};

use crate::project::EffectDef;

/// Characters left as they are in a URL value: RFC 3986 unreserved.
const URL_VALUE: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// HTTP methods an effect may use.
pub const METHODS: [&str; 5] = ["POST", "PUT", "PATCH", "DELETE", "GET"];

/// Most template fuel one render may burn (bounds runaway loops).
const FUEL: u64 = 50_000;

fn env() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    env.set_fuel(Some(FUEL));
    env
}

/// Names a template reads that are not in `known`, or a syntax error.
pub fn unknown_variables(template: &str, known: &[String]) -> Result<Vec<String>, String> {
    let env = env();
    let tmpl = env.template_from_str(template).map_err(|e| e.to_string())?;
    let mut unknown: Vec<String> = tmpl
        .undeclared_variables(false)
        .into_iter()
        .filter(|v| !known.contains(v))
        .collect();
    unknown.sort();
    Ok(unknown)
}

/// Renders the effect; `vars` holds identity values and parameters (missing
/// optional parameters as null). Errors are model-safe descriptions.
pub fn render(def: &EffectDef, vars: &Map<String, Value>) -> Result<WebhookEffect, String> {
    let env = env();
    let url_vars: Map<String, Value> = vars
        .iter()
        .map(|(k, v)| {
            let text = match v {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (
                k.clone(),
                Value::String(utf8_percent_encode(&text, URL_VALUE).to_string()),
            )
        })
        .collect();
    let url = env
        .render_str(
            &def.url,
            minijinja::Value::from(minijinja::value::Serde(&url_vars)),
        )
        .map_err(|e| format!("the URL template does not render: {}", e.kind()))?;
    let parsed = url::Url::parse(&url).map_err(|_| "the rendered URL is not a URL".to_owned())?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err("the effect URL must be http or https".into());
    }
    let host = parsed
        .host_str()
        .ok_or_else(|| "the effect URL has no host".to_owned())?
        .to_owned();
    let body = match &def.body {
        Some(tmpl) => {
            let body = env
                .render_str(tmpl, minijinja::Value::from(minijinja::value::Serde(vars)))
                .map_err(|e| format!("the body template does not render: {}", e.kind()))?;
            serde_json::from_str::<Value>(&body).map_err(|_| {
                "the body template does not render JSON (use `| tojson` on values)".to_owned()
            })?;
            body
        }
        None => String::new(),
    };
    let method = def.method.to_ascii_uppercase();
    if !METHODS.contains(&method.as_str()) {
        return Err(format!("method `{}` is not one of {METHODS:?}", def.method));
    }
    Ok(WebhookEffect {
        method,
        url,
        url_template: def.url.clone(),
        host,
        body,
        headers: def
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        secret_headers: def
            .secret_headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        timeout_ms: def.timeout_ms,
        max_attempts: def.max_attempts,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn def(url: &str, body: Option<&str>) -> EffectDef {
        serde_yaml_ng::from_str::<EffectDef>(&format!("url: '{url}'"))
            .map(|mut d| {
                d.body = body.map(str::to_owned);
                d
            })
            .unwrap()
    }

    #[test]
    fn renders_url_and_body() {
        let vars = json!({"order_id": 7, "reason": "a/b c"})
            .as_object()
            .unwrap()
            .clone();
        let e = render(
            &def(
                "https://hooks.example.com/o/{{ order_id }}?r={{ reason }}",
                Some("{\"id\": {{ order_id | tojson }}, \"reason\": {{ reason | tojson }}}"),
            ),
            &vars,
        )
        .unwrap();
        assert_eq!(e.url, "https://hooks.example.com/o/7?r=a%2Fb%20c");
        assert_eq!(e.host, "hooks.example.com");
        assert_eq!(
            serde_json::from_str::<Value>(&e.body).unwrap()["reason"],
            "a/b c"
        );
        assert_eq!(
            (e.method.as_str(), e.timeout_ms, e.max_attempts),
            ("POST", 5000, 3)
        );
        assert!(render(&def("ftp://x/{{ order_id }}", None), &vars).is_err());
        assert!(render(&def("https://x/{{ nope }}", None), &vars).is_err());
        assert!(render(&def("https://x", Some("{{ reason }}")), &vars).is_err());
        assert_eq!(
            unknown_variables("{{ a }}{{ b | upper }}{% if c %}{% endif %}", &["a".into()])
                .unwrap(),
            ["b", "c"]
        );
        assert!(unknown_variables("{{ a ", &[]).is_err());
    }
}
