// A stdio MCP server (TypeScript SDK 1.x, CommonJS: found through NODE_PATH) that reaches hosts
// by name the way most Node servers do: `fetch` (which Node < 24 runs without proxy variables) and
// a raw `net` socket (which never looks at them).
const { McpServer } = require("@modelcontextprotocol/sdk/server/mcp.js");
const { StdioServerTransport } = require("@modelcontextprotocol/sdk/server/stdio.js");
const { z } = require("zod");
const net = require("net");

const server = new McpServer({ name: "reacher", version: "1.0.0" });
const said = (text, isError = false) => ({ content: [{ type: "text", text }], isError });
const why = (e) => `${e.message} ${e.cause ? e.cause.code || e.cause.message : ""}`;

server.registerTool("fetch", { inputSchema: { url: z.string() } }, async ({ url }) => {
  try {
    const response = await fetch(url);
    return said(`${response.status} ${await response.text()}`);
  } catch (e) {
    return said(`FAILED ${why(e)}`, true);
  }
});

server.registerTool("socket", { inputSchema: { host: z.string(), port: z.number() } }, ({ host, port }) =>
  new Promise((resolve) => {
    const chunks = [];
    const sock = net.connect({ host, port }, () => sock.end(`GET /socket HTTP/1.0\r\nHost: ${host}\r\n\r\n`));
    sock.setTimeout(10000, () => sock.destroy(new Error("timed out")));
    sock.on("data", (d) => chunks.push(d));
    sock.on("end", () => resolve(said(Buffer.concat(chunks).toString())));
    sock.on("error", (e) => resolve(said(`FAILED ${why(e)} ${e.code || ""}`, true)));
  }),
);

server.connect(new StdioServerTransport());
