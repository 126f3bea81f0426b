// A server on the TypeScript SDK 1.x's low-level `Server`, written as many published servers are:
// it declares tools and resources but has no resource templates handler, so the SDK answers
// resources/templates/list with "Method not found" (-32601).
// Usage: node old_ts.cjs DIR, where DIR/node_modules holds @modelcontextprotocol/sdk 1.x.
const { createRequire } = require("node:module");
const path = require("node:path");

const load = createRequire(path.join(process.argv[2], "package.json"));
const { Server } = load("@modelcontextprotocol/sdk/server/index.js");
const { StdioServerTransport } = load("@modelcontextprotocol/sdk/server/stdio.js");
const types = load("@modelcontextprotocol/sdk/types.js");

const server = new Server({ name: "old-ts", version: "1.0.0" }, { capabilities: { tools: {}, resources: {} } });
server.setRequestHandler(types.ListToolsRequestSchema, async () => ({
  tools: [
    {
      name: "echo",
      description: "Echo the text back",
      inputSchema: { type: "object", properties: { text: { type: "string" } }, required: ["text"] },
    },
  ],
}));
server.setRequestHandler(types.CallToolRequestSchema, async (request) => ({
  content: [{ type: "text", text: `echo: ${request.params.arguments.text}` }],
}));
server.setRequestHandler(types.ListResourcesRequestSchema, async () => ({
  resources: [{ uri: "note://one", name: "one", mimeType: "text/plain" }],
}));
server.setRequestHandler(types.ReadResourceRequestSchema, async (request) => ({
  contents: [{ uri: request.params.uri, mimeType: "text/plain", text: "the first note" }],
}));
server.connect(new StdioServerTransport()).then(() => console.error("old-ts server running on stdio"));
