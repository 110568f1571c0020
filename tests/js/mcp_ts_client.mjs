// The MCP TypeScript SDK 1.x client (the one inside most MCP hosts) against the gateway.
// Driven by tests/python/test_mcp_ts_sdk.py; prints one JSON line of what it saw.
//
// env: MCP_URL, MCP_TOKEN, NAMESPACE, MCP_SDK (the SDK package folder, installed by
// deploy/scripts/dev-deps.sh into .tools/mcp-js).
import { pathToFileURL } from "node:url";
import { join } from "node:path";

const sdk = process.env.MCP_SDK;
const { Client } = await import(pathToFileURL(join(sdk, "dist/esm/client/index.js")).href);
const { StreamableHTTPClientTransport } = await import(
  pathToFileURL(join(sdk, "dist/esm/client/streamableHttp.js")).href
);

const seen = { calls: [] };
try {
  const transport = new StreamableHTTPClientTransport(new URL(process.env.MCP_URL), {
    requestInit: { headers: { Authorization: `Bearer ${process.env.MCP_TOKEN}` } },
  });
  const client = new Client({ name: "kgmesh-ts-sdk-test", version: "0" });
  await client.connect(transport);
  seen.tools = (await client.listTools()).tools.map((tool) => tool.name);
  const namespace = process.env.NAMESPACE;
  // Several calls in one session: the later ones are answered as plain JSON by the gateway.
  const calls = [
    ["kg_namespaces", {}],
    ["kg_search", { query: "rollback", namespaces: [namespace], topK: 2 }],
    ["kg_namespaces", {}],
    ["kg_search", { query: "rollback", topK: 99 }],
    ["kg_outline", { namespace: "no-such-namespace", fileId: "f" }],
  ];
  for (const [name, args] of calls) {
    const result = await client.callTool({ name, arguments: args });
    seen.calls.push({
      name,
      isError: result.isError === true,
      structured: result.structuredContent ?? null,
      text: result.content?.[0]?.text ?? null,
    });
  }
  await client.close();
} catch (err) {
  // A thrown error is what the test looks for: print it, do not crash without a word.
  seen.thrown = String(err?.message ?? err);
}
console.log(JSON.stringify(seen));
// An open session stream would keep Node running after a failure.
process.exit(0);
