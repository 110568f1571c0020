//! The metadata and links of a version as carried by the `FileIndexed` event.

use kg_proto::v1::{VersionLink, VersionLinkKind, VersionLinkSyntax, VersionMeta};

use super::{DocumentMeta, LinkKind, LinkTargetKind, ResolvedLink};

/// Link bytes one event may carry: keeps the event well under the NATS payload limit
/// (1 MiB by default). Links past it are counted in `links_omitted`.
pub const MAX_EVENT_LINK_BYTES: usize = 512 * 1024;
/// A link label longer than this is cut (at a char boundary).
const MAX_LABEL_BYTES: usize = 256;
/// A raw target longer than this is cut; its resolved path is kept whole or the link dropped.
const MAX_TARGET_BYTES: usize = 2048;

/// `meta` and `links` of the file at `source_path`, in event form.
pub fn indexed_event_fields(
    source_path: &str,
    meta: &DocumentMeta,
    links: &[ResolvedLink],
) -> (VersionMeta, Vec<VersionLink>) {
    let mut out = Vec::with_capacity(links.len());
    let mut bytes = 0usize;
    let mut omitted = 0u32;
    for link in links {
        let item = VersionLink {
            ordinal: link.ordinal,
            kind: match link.kind {
                LinkTargetKind::Internal => VersionLinkKind::Internal,
                LinkTargetKind::External => VersionLinkKind::External,
                LinkTargetKind::Invalid => VersionLinkKind::Invalid,
            } as i32,
            syntax: match link.syntax {
                LinkKind::Link => VersionLinkSyntax::Link,
                LinkKind::Image => VersionLinkSyntax::Image,
                LinkKind::WikiLink => VersionLinkSyntax::Wiki,
            } as i32,
            target_path: link.target_path.clone(),
            raw_target: cut(&link.raw_target, MAX_TARGET_BYTES),
            fragment: cut(
                link.fragment.as_deref().unwrap_or_default(),
                MAX_TARGET_BYTES,
            ),
            label: cut(&link.label, MAX_LABEL_BYTES),
        };
        let size = item.target_path.len()
            + item.raw_target.len()
            + item.fragment.len()
            + item.label.len()
            + 16;
        if link.target_path.len() > MAX_TARGET_BYTES || bytes + size > MAX_EVENT_LINK_BYTES {
            omitted = omitted.saturating_add(1);
            continue;
        }
        bytes += size;
        out.push(item);
    }
    let meta = VersionMeta {
        source_path: source_path.to_owned(),
        title: meta.title.clone().unwrap_or_default(),
        doc_type: meta.doc_type.clone().unwrap_or_default(),
        tags: meta.tags.clone(),
        document_date: meta.document_date.clone().unwrap_or_default(),
        effective_from: meta.effective_from.clone().unwrap_or_default(),
        effective_to: meta.effective_to.clone().unwrap_or_default(),
        collections: meta.collections.clone(),
        links_omitted: omitted,
    };
    (meta, out)
}

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}
