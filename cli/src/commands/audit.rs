//! `kgmesh audit`: query the audit log of tool calls and admin API changes.

use clap::Args;

use super::Remote;

#[derive(Args)]
pub(crate) struct AuditArgs {
    /// Only calls made by this principal (an agent's own id).
    #[arg(long)]
    principal: Option<String>,
    /// Only calls of this tool, e.g. `kg_search`, or changes on this admin route, e.g.
    /// `admin:POST /api/v1/grants`.
    #[arg(long)]
    tool: Option<String>,
    /// Only calls at or after this time (Unix milliseconds).
    #[arg(long)]
    since_ms: Option<i64>,
    /// Only calls before this time (Unix milliseconds; the end is exclusive).
    #[arg(long)]
    until_ms: Option<i64>,
    /// Most events to return: 1-1000 (default 100).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1000))]
    limit: Option<u32>,
    /// `nextCursor` of the previous page.
    #[arg(long)]
    cursor: Option<String>,
    #[command(flatten)]
    remote: Remote,
}

pub(crate) async fn audit(args: AuditArgs) -> anyhow::Result<()> {
    let text = |v: Option<String>| v.unwrap_or_default();
    let number = |v: Option<i64>| v.map(|n| n.to_string()).unwrap_or_default();
    let query = [
        ("principal", text(args.principal)),
        ("tool", text(args.tool)),
        ("sinceMs", number(args.since_ms)),
        ("untilMs", number(args.until_ms)),
        ("limit", number(args.limit.map(i64::from))),
        ("cursor", text(args.cursor)),
    ];
    let v = args.remote.client()?.get(&["audit"], &query).await?;
    args.remote.print(&v)
}
