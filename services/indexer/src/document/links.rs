//! Resolves a document's links against the file's own path: an internal namespace path,
//! an external URL, or invalid. Whether an internal target exists is NOT decided here: the
//! target may be uploaded later, so broken-ness is computed when the link graph is read,
//! against the files live at that time.

use super::{Link, LinkKind};

/// Where a link points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkTargetKind {
    /// A path inside the namespace (`target_path`).
    Internal,
    /// A URL with a scheme (`target_path` holds the URL).
    External,
    /// Cannot name any file: empty, escapes the namespace root, or a script/data/file URL.
    Invalid,
}

/// A link of one file version, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedLink {
    /// 0-based position among the document's links.
    pub ordinal: u32,
    pub kind: LinkTargetKind,
    pub syntax: LinkKind,
    /// Internal: normalised path (no `#fragment`/`?query`, percent-decoded, no `./`/`../`);
    /// a same-document `#anchor` link points at the source path itself.
    /// External: the URL as written. Invalid: empty.
    pub target_path: String,
    /// The destination as written.
    pub raw_target: String,
    /// Internal links: the fragment without `#`, if any.
    pub fragment: Option<String>,
    /// The link text, or an image's alt text.
    pub label: String,
}

/// Schemes that never name a document a reader could follow.
const INVALID_SCHEMES: &[&str] = &["javascript", "vbscript", "data", "file", "blob"];

/// Resolves `links` of the file at `source_path` (a normalised namespace path such as
/// `guides/intro.md`), keeping document order and ordinals.
pub fn resolve_links(source_path: &str, links: &[Link]) -> Vec<ResolvedLink> {
    links.iter().map(|l| resolve_link(source_path, l)).collect()
}

/// Resolves one link; see [`resolve_links`].
pub fn resolve_link(source_path: &str, link: &Link) -> ResolvedLink {
    let raw = link.target.trim();
    let mut out = ResolvedLink {
        ordinal: link.ordinal,
        kind: LinkTargetKind::Invalid,
        syntax: link.kind,
        target_path: String::new(),
        raw_target: link.target.clone(),
        fragment: None,
        label: link.text.clone(),
    };
    if raw.is_empty() {
        return out;
    }
    if let Some(scheme) = scheme_of(raw) {
        if !INVALID_SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) {
            out.kind = LinkTargetKind::External;
            out.target_path = raw.to_owned();
        }
        return out;
    }
    if raw.starts_with("//") {
        // Protocol-relative URL: another host.
        out.kind = LinkTargetKind::External;
        out.target_path = raw.to_owned();
        return out;
    }
    let (before_fragment, fragment) = match raw.split_once('#') {
        Some((path, frag)) => (path, Some(frag)),
        None => (raw, None),
    };
    let path_part = before_fragment
        .split_once('?')
        .map_or(before_fragment, |(p, _)| p);
    out.fragment = fragment.map(percent_decode).filter(|f| !f.is_empty());
    let decoded = percent_decode(path_part).replace('\\', "/");
    if decoded.is_empty() {
        // `#section` or `?x`: this same document.
        out.kind = LinkTargetKind::Internal;
        out.target_path = source_path.to_owned();
        return out;
    }
    let joined = if let Some(absolute) = decoded.strip_prefix('/') {
        absolute.to_owned()
    } else {
        let folder = source_path.rfind('/').map_or("", |i| &source_path[..=i]);
        format!("{folder}{decoded}")
    };
    if let Some(path) = normalize(&joined) {
        out.kind = LinkTargetKind::Internal;
        out.target_path = path;
    }
    out
}

/// The URL scheme, if `s` starts with one (`https:`, `mailto:`). A single letter followed by
/// `:` is a Windows drive, not a scheme.
fn scheme_of(s: &str) -> Option<&str> {
    let (scheme, _) = s.split_once(':')?;
    let mut chars = scheme.chars();
    let first = chars.next()?;
    (scheme.len() > 1
        && first.is_ascii_alphabetic()
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.')))
    .then_some(scheme)
}

/// Resolves `.` and `..` segments and drops empty ones; `None` when `..` climbs above the
/// namespace root. A trailing `/` is kept (a folder link).
fn normalize(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            s => parts.push(s),
        }
    }
    if parts.is_empty() {
        return None;
    }
    let mut out = parts.join("/");
    if path.ends_with('/') {
        out.push('/');
    }
    Some(out)
}

/// Decodes `%XX` escapes as UTF-8; a string whose escapes do not decode to UTF-8 is kept as
/// written.
fn percent_decode(s: &str) -> String {
    if !s.contains('%') {
        return s.to_owned();
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (
                bytes.get(i + 1).copied().and_then(hex),
                bytes.get(i + 2).copied().and_then(hex),
            )
        {
            out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).unwrap_or_else(|_| s.to_owned())
}
