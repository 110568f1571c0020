//! Masks credentials in text bound for a log line: the password of a URL
//! (`postgres://kgmesh:…@db`), a token standing in for a URL's user (`nats://…@nats`),
//! `password=`/`token=`-style pairs (libpq strings, query strings), `Authorization`
//! schemes, and kgmesh PATs. Drivers quote their connection URL in errors, and HTTP
//! clients quote the request URL; the log writer runs every line through [`redact`], so no
//! call site has to remember to.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;

/// What a masked secret reads as.
pub const MASK: &str = "***";

// scheme://user:password@host or scheme://token@host (the userinfo stops at the last `@`
// before the path; `:` inside it separates user and password).
static URL_USERINFO: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)(?P<userinfo>[^\s/?#@'\x22<>]+)@").ok()
});
// password=…, db_password=…, "api_key":"…", ?key=… and the like; the value stops at a separator. A bare
// `key=` is not a secret (log fields are called that); only a query string's is.
static SECRET_PAIR: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(
        r#"(?i)(?P<key>(?:\b[A-Za-z0-9_.\-]*?(?:password|passwd|pwd|secret|client_secret|token|access_token|refresh_token|api[_-]?key|apikey)|[?&](?:key|sig|signature))(?:\s*=\s*\x22?|\x22\s*:\s*\x22?))(?P<value>[^\s&;,'\x22)\]}]+)"#,
    )
    .ok()
});
static AUTH_SCHEME: LazyLock<Option<Regex>> = LazyLock::new(|| {
    Regex::new(r"(?i)\b(?P<scheme>bearer|basic)\s+(?P<value>[A-Za-z0-9._~+/=\-]{8,})").ok()
});
static PAT: LazyLock<Option<Regex>> = LazyLock::new(|| Regex::new(r"kg_pat_[A-Za-z0-9_\-]+").ok());

/// Whether a field or attribute called `name` holds a credential as a whole (`password`,
/// `db_password`, `api_key`, `authorization`, ...): a structured value carries no `name=`
/// for [`redact`] to find, so exporters that keep names and values apart mask it by name.
pub fn is_secret_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    // The last word names what the value is: `access_token` is one, `token_budget` is not.
    let last = name
        .rsplit(|c: char| !c.is_ascii_alphanumeric())
        .next()
        .unwrap_or_default();
    matches!(last, "pwd" | "authorization" | "signature")
        || ["password", "passwd", "secret", "token", "apikey"]
            .iter()
            .any(|word| last.ends_with(word))
        || name.contains("api_key")
        || name.contains("api-key")
}

/// `text` with every credential it recognises masked; borrowed when there was none.
pub fn redact(text: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(text);
    if let Some(re) = URL_USERINFO.as_ref()
        && re.is_match(&out)
    {
        let replaced = re
            .replace_all(&out, |caps: &regex::Captures<'_>| {
                let scheme = &caps["scheme"];
                match caps["userinfo"].split_once(':') {
                    Some((user, _)) => format!("{scheme}{user}:{MASK}@"),
                    None => format!("{scheme}{MASK}@"),
                }
            })
            .into_owned();
        out = Cow::Owned(replaced);
    }
    if let Some(re) = SECRET_PAIR.as_ref()
        && re.is_match(&out)
    {
        let replaced = re
            .replace_all(&out, |caps: &regex::Captures<'_>| {
                if caps["value"] == *MASK {
                    caps[0].to_owned()
                } else {
                    format!("{}{MASK}", &caps["key"])
                }
            })
            .into_owned();
        out = Cow::Owned(replaced);
    }
    if let Some(re) = AUTH_SCHEME.as_ref()
        && re.is_match(&out)
    {
        let replaced = re.replace_all(&out, format!("$scheme {MASK}")).into_owned();
        out = Cow::Owned(replaced);
    }
    if let Some(re) = PAT.as_ref()
        && re.is_match(&out)
    {
        let replaced = re.replace_all(&out, format!("kg_pat_{MASK}")).into_owned();
        out = Cow::Owned(replaced);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_passwords_and_tokens_are_masked_and_the_rest_kept() {
        assert_eq!(
            redact(
                "cannot connect to postgres://kgmesh:s3cr3t-pw@db.internal:5432/kgmesh (timeout)"
            ),
            "cannot connect to postgres://kgmesh:***@db.internal:5432/kgmesh (timeout)"
        );
        assert_eq!(
            redact("nats: nats://abcdefTOKEN@nats:4222 refused"),
            "nats: nats://***@nats:4222 refused"
        );
        assert_eq!(
            redact("redis://:hunter22@falkordb:6379"),
            "redis://:***@falkordb:6379"
        );
        let plain = "GET http://127.0.0.1:8080/mcp path=docs/a@b.md";
        assert!(matches!(redact(plain), Cow::Borrowed(_)), "{plain}");
        assert_eq!(redact("mail alice@example.com"), "mail alice@example.com");
    }

    #[test]
    fn secret_pairs_schemes_and_pats_are_masked() {
        assert_eq!(
            redact("host=db user=kg password=hunter22 dbname=kg"),
            "host=db user=kg password=*** dbname=kg"
        );
        assert_eq!(
            redact(
                "error sending request for url (https://api.example/v1/embed?key=AIzaSECRET&model=x)"
            ),
            "error sending request for url (https://api.example/v1/embed?key=***&model=x)"
        );
        assert_eq!(
            redact(r#"{"api_key":"sk-live-123456"}"#),
            r#"{"api_key":"***"}"#
        );
        assert_eq!(
            redact("authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload"),
            "authorization: Bearer ***"
        );
        assert_eq!(
            redact("token kg_pat_AbC123_x-y rejected"),
            "token kg_pat_*** rejected"
        );
        assert_eq!(redact(&redact("password=x")), "password=***");
        assert_eq!(
            redact(r#"db_password="pw-1" max_tokens=5 token_budget=9"#),
            r#"db_password="***" max_tokens=5 token_budget=9"#
        );
        // Log fields named key, and prose, stay readable.
        assert_eq!(
            redact("lane=2 key=demo/f_1 sequence=9"),
            "lane=2 key=demo/f_1 sequence=9"
        );
        assert_eq!(
            redact("invalid token: expected kg_pat_"),
            "invalid token: expected kg_pat_"
        );
    }

    #[test]
    fn credential_names_are_told_from_ordinary_ones() {
        for name in [
            "password",
            "db.password",
            "PGPASSWORD",
            "api_key",
            "x-api-key",
            "access_token",
            "client_secret",
            "http.request.header.authorization",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in [
            "key",
            "chunk_key",
            "tokens",
            "token_budget",
            "path",
            "namespace",
        ] {
            assert!(!is_secret_name(name), "{name}");
        }
    }
}
