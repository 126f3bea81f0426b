"""Conformance: the server the official MCP conformance suite's *server* scenarios expect.

Run as ``python tests/servers/conformance.py`` (stdio, as the gateway runs it) or
``python tests/servers/conformance.py --http PORT`` (Streamable HTTP at ``http://127.0.0.1:PORT/mcp``,
the direct baseline of ``python -m tests.conformance``). Written on the SDK's low-level `Server`, serving
both eras: the suite's client speaks the handshake era, the gateway 2026-07-28 (where a question to
the client is an `input_required` result and subscriptions ride `subscriptions/listen`). The names and
behaviours are those of the suite's scenario texts (`@modelcontextprotocol/conformance` 0.1.16,
src/scenarios/server/):

- tools `test_simple_text`, `test_image_content`, `test_audio_content`, `test_embedded_resource`,
  `test_multiple_content_types`, `test_tool_with_logging` (three `notifications/message`),
  `test_tool_with_progress` (three `notifications/progress`), `test_error_handling` (`isError`),
  `test_sampling` and `test_elicitation` (a question to the client, whose answer comes back as text),
  `test_elicitation_sep1034_defaults`, `test_elicitation_sep1330_enums`, `json_schema_2020_12_tool`
  (its input schema kept verbatim) and `test_reconnection` (closes its SSE stream mid-call, over HTTP);
- resources `test://static-text`, `test://static-binary`, `test://watched-resource` (subscribable),
  the template `test://template/{id}/data`;
- prompts `test_simple_prompt`, `test_prompt_with_arguments`, `test_prompt_with_embedded_resource`,
  `test_prompt_with_image`;
- `logging/setLevel` and `completion/complete` (no suggestions).
"""

from __future__ import annotations

import argparse
import json
import warnings
from typing import Any

import anyio
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import NotificationOptions, Server
from mcp.server.stdio import stdio_server
from mcp.server.streamable_http import EventCallback, EventId, EventMessage, EventStore, StreamId
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler
from mcp.shared.exceptions import MCPDeprecationWarning
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

Ctx = ServerRequestContext[Any, Any]

# A 1x1 red PNG and a minimal WAV, as the suite's scenarios suggest.
IMAGE = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
AUDIO = "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="

NO_ARGS: dict[str, Any] = {"type": "object", "properties": {}}
JSON_SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"address": {"type": "object", "properties": {"street": {"type": "string"}, "city": {"type": "string"}}}},
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}


def _one_string(name: str, description: str) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {name: {"type": "string", "description": description}},
        "required": [name],
    }


TOOLS = [
    types.Tool(name="test_simple_text", description="Tests simple text content response", input_schema=NO_ARGS),
    types.Tool(name="test_image_content", description="Tests image content response", input_schema=NO_ARGS),
    types.Tool(name="test_audio_content", description="Tests audio content response", input_schema=NO_ARGS),
    types.Tool(
        name="test_embedded_resource", description="Tests embedded resource content response", input_schema=NO_ARGS
    ),
    types.Tool(
        name="test_multiple_content_types",
        description="Tests response with multiple content types (text, image, resource)",
        input_schema=NO_ARGS,
    ),
    types.Tool(
        name="test_tool_with_logging",
        description="Tests tool that emits log messages during execution",
        input_schema=NO_ARGS,
    ),
    types.Tool(
        name="test_tool_with_progress",
        description="Tests tool that reports progress notifications",
        input_schema=NO_ARGS,
    ),
    types.Tool(name="test_error_handling", description="Tests error response handling", input_schema=NO_ARGS),
    types.Tool(
        name="test_reconnection",
        description="Tests SSE stream disconnection and client reconnection (SEP-1699)",
        input_schema=NO_ARGS,
    ),
    types.Tool(
        name="test_sampling",
        description="Tests server-initiated sampling (LLM completion request)",
        input_schema=_one_string("prompt", "The prompt to send to the LLM"),
    ),
    types.Tool(
        name="test_elicitation",
        description="Tests server-initiated elicitation (user input request)",
        input_schema=_one_string("message", "The message to show the user"),
    ),
    types.Tool(
        name="test_elicitation_sep1034_defaults",
        description="Tests elicitation with default values per SEP-1034",
        input_schema=NO_ARGS,
    ),
    types.Tool(
        name="test_elicitation_sep1330_enums",
        description="Tests elicitation with enum schema improvements per SEP-1330",
        input_schema=NO_ARGS,
    ),
    types.Tool(
        name="json_schema_2020_12_tool",
        description="Tool with JSON Schema 2020-12 features for conformance testing (SEP-1613)",
        input_schema=JSON_SCHEMA_2020_12,
    ),
]

ELICIT_RESPONSE: dict[str, Any] = {
    "type": "object",
    "properties": {"response": {"type": "string", "description": "User's response"}},
    "required": ["response"],
}
ELICIT_DEFAULTS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "User name", "default": "John Doe"},
        "age": {"type": "integer", "description": "User age", "default": 30},
        "score": {"type": "number", "description": "User score", "default": 95.5},
        "status": {
            "type": "string",
            "description": "User status",
            "enum": ["active", "inactive", "pending"],
            "default": "active",
        },
        "verified": {"type": "boolean", "description": "Verification status", "default": True},
    },
    "required": [],
}
ELICIT_ENUMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "untitledSingle": {
            "type": "string",
            "description": "Select one option",
            "enum": ["option1", "option2", "option3"],
        },
        "titledSingle": {
            "type": "string",
            "description": "Select one option with titles",
            "oneOf": [
                {"const": "value1", "title": "First Option"},
                {"const": "value2", "title": "Second Option"},
                {"const": "value3", "title": "Third Option"},
            ],
        },
        "legacyEnum": {
            "type": "string",
            "description": "Select one option (legacy)",
            "enum": ["opt1", "opt2", "opt3"],
            "enumNames": ["Option One", "Option Two", "Option Three"],
        },
        "untitledMulti": {
            "type": "array",
            "description": "Select multiple options",
            "minItems": 1,
            "maxItems": 3,
            "items": {"type": "string", "enum": ["option1", "option2", "option3"]},
        },
        "titledMulti": {
            "type": "array",
            "description": "Select multiple options with titles",
            "minItems": 1,
            "maxItems": 3,
            "items": {
                "anyOf": [
                    {"const": "value1", "title": "First Choice"},
                    {"const": "value2", "title": "Second Choice"},
                    {"const": "value3", "title": "Third Choice"},
                ]
            },
        },
    },
    "required": [],
}

RESOURCES = [
    types.Resource(
        uri="test://static-text",
        name="static-text",
        title="Static Text Resource",
        description="A static text resource for testing",
        mime_type="text/plain",
    ),
    types.Resource(
        uri="test://static-binary",
        name="static-binary",
        title="Static Binary Resource",
        description="A static binary resource (image) for testing",
        mime_type="image/png",
    ),
    types.Resource(
        uri="test://watched-resource",
        name="watched-resource",
        title="Watched Resource",
        description="A resource that can be subscribed to",
        mime_type="text/plain",
    ),
]
TEMPLATE = "test://template/{id}/data"
TEMPLATE_PREFIX, TEMPLATE_SUFFIX = "test://template/", "/data"

PROMPTS = [
    types.Prompt(
        name="test_simple_prompt", title="Simple Test Prompt", description="A simple prompt without arguments"
    ),
    types.Prompt(
        name="test_prompt_with_arguments",
        title="Prompt With Arguments",
        description="A prompt with required arguments",
        arguments=[
            types.PromptArgument(name="arg1", description="First test argument", required=True),
            types.PromptArgument(name="arg2", description="Second test argument", required=True),
        ],
    ),
    types.Prompt(
        name="test_prompt_with_embedded_resource",
        title="Prompt With Embedded Resource",
        description="A prompt that includes an embedded resource",
        arguments=[types.PromptArgument(name="resourceUri", description="URI of the resource to embed", required=True)],
    ),
    types.Prompt(
        name="test_prompt_with_image", title="Prompt With Image", description="A prompt that includes image content"
    ),
]

QUESTION = "q"  # the key of the one question a 2026-07-28 call asks
subscriptions: set[str] = set()  # handshake era; 2026-07-28 subscribes on `subscriptions/listen`


def _text(text: str) -> types.TextContent:
    return types.TextContent(type="text", text=text)


def _image() -> types.ImageContent:
    return types.ImageContent(type="image", data=IMAGE, mime_type="image/png")


def _embedded(uri: str, text: str, mime_type: str = "text/plain") -> types.EmbeddedResource:
    resource = types.TextResourceContents(uri=uri, mime_type=mime_type, text=text)
    return types.EmbeddedResource(type="resource", resource=resource)


async def _log(ctx: Ctx, message: str) -> None:
    await ctx.session.send_log_message("info", message, logger="conformance", related_request_id=ctx.request_id)


async def list_tools(ctx: Ctx, params: Any) -> types.ListToolsResult:
    return types.ListToolsResult(tools=TOOLS)


def _modern(ctx: Ctx) -> bool:
    return ctx.protocol_version in MODERN_PROTOCOL_VERSIONS


def _asked(params: types.CallToolRequestParams, request: types.InputRequest) -> types.InputRequiredResult | Any:
    """2026-07-28: the client's answer to `request` when this is the retry that carries it, else the question."""
    answer = (params.input_responses or {}).get(QUESTION)
    return answer if answer is not None else types.InputRequiredResult(input_requests={QUESTION: request})


async def _elicit(
    ctx: Ctx, params: types.CallToolRequestParams, message: str, schema: dict[str, Any], done: str
) -> types.CallToolResult | types.InputRequiredResult:
    answer: Any
    if _modern(ctx):
        form = types.ElicitRequestFormParams(message=message, requested_schema=schema)
        answer = _asked(params, types.ElicitRequest(params=form))
        if isinstance(answer, types.InputRequiredResult):
            return answer
        if not isinstance(answer, types.ElicitResult):
            return types.CallToolResult(content=[_text(f"Elicitation not supported or error: {answer!r}")])
    else:
        try:
            answer = await ctx.session.elicit_form(message, schema, related_request_id=ctx.request_id)
        except Exception as e:
            return types.CallToolResult(content=[_text(f"Elicitation not supported or error: {e}")])
    content = json.dumps(answer.content or {}, separators=(",", ":"))
    return types.CallToolResult(content=[_text(f"{done}: action={answer.action}, content={content}")])


async def call_tool(ctx: Ctx, params: types.CallToolRequestParams) -> types.CallToolResult | types.InputRequiredResult:
    name, args = params.name, params.arguments or {}
    if name == "test_simple_text":
        return types.CallToolResult(content=[_text("This is a simple text response for testing.")])
    if name == "test_image_content":
        return types.CallToolResult(content=[_image()])
    if name == "test_audio_content":
        return types.CallToolResult(content=[types.AudioContent(type="audio", data=AUDIO, mime_type="audio/wav")])
    if name == "test_embedded_resource":
        return types.CallToolResult(
            content=[_embedded("test://embedded-resource", "This is an embedded resource content.")]
        )
    if name == "test_multiple_content_types":
        data = json.dumps({"test": "data", "value": 123})
        return types.CallToolResult(
            content=[
                _text("Multiple content types test:"),
                _image(),
                _embedded("test://mixed-content-resource", data, "application/json"),
            ]
        )
    if name == "test_tool_with_logging":
        for i, message in enumerate(("Tool execution started", "Tool processing data", "Tool execution completed")):
            if i:
                await anyio.sleep(0.05)
            await _log(ctx, message)
        return types.CallToolResult(content=[_text("Tool with logging executed successfully")])
    if name == "test_tool_with_progress":
        token = (ctx.meta or {}).get("progress_token")
        for i, step in enumerate((0, 50, 100)):
            if i:
                await anyio.sleep(0.05)
            await ctx.session.report_progress(step, 100, f"Completed step {step} of 100")  # a no-op without a token
        return types.CallToolResult(content=[_text(str(token))])
    if name == "test_error_handling":
        return types.CallToolResult(
            content=[_text("This tool intentionally returns an error for testing")], is_error=True
        )
    if name == "test_reconnection":
        if ctx.close_sse_stream is not None:
            await ctx.close_sse_stream()
        await anyio.sleep(0.1)
        return types.CallToolResult(
            content=[_text("Reconnection test completed successfully. The client reconnected after the stream closed.")]
        )
    if name == "test_sampling":
        sample = types.SamplingMessage(role="user", content=_text(str(args.get("prompt", ""))))
        sampled: Any
        if _modern(ctx):
            request = types.CreateMessageRequestParams(messages=[sample], max_tokens=100)
            sampled = _asked(params, types.CreateMessageRequest(params=request))
            if isinstance(sampled, types.InputRequiredResult):
                return sampled
        else:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", MCPDeprecationWarning)
                    sampled = await ctx.session.create_message(
                        [sample], max_tokens=100, related_request_id=ctx.request_id
                    )
            except Exception as e:
                return types.CallToolResult(content=[_text(f"Sampling not supported or error: {e}")])
        content = getattr(sampled, "content", None)
        reply = content.text if isinstance(content, types.TextContent) else "No response"
        return types.CallToolResult(content=[_text(f"LLM response: {reply}")])
    if name == "test_elicitation":
        return await _elicit(ctx, params, str(args.get("message", "")), ELICIT_RESPONSE, "User response")
    if name == "test_elicitation_sep1034_defaults":
        message = "Please review and update the form fields with defaults"
        return await _elicit(ctx, params, message, ELICIT_DEFAULTS, "Elicitation completed")
    if name == "test_elicitation_sep1330_enums":
        return await _elicit(
            ctx, params, "Please select options from the enum fields", ELICIT_ENUMS, "Elicitation completed"
        )
    if name == "json_schema_2020_12_tool":
        text = json.dumps(args, separators=(",", ":"))
        return types.CallToolResult(content=[_text(f"JSON Schema 2020-12 tool called with: {text}")])
    return types.CallToolResult(content=[_text(f"no tool {name!r}")], is_error=True)


async def list_resources(ctx: Ctx, params: Any) -> types.ListResourcesResult:
    return types.ListResourcesResult(resources=RESOURCES)


async def list_templates(ctx: Ctx, params: Any) -> types.ListResourceTemplatesResult:
    template = types.ResourceTemplate(
        uri_template=TEMPLATE,
        name="template",
        title="Resource Template",
        description="A resource template with parameter substitution",
        mime_type="application/json",
    )
    return types.ListResourceTemplatesResult(resource_templates=[template])


async def read_resource(ctx: Ctx, params: types.ReadResourceRequestParams) -> types.ReadResourceResult:
    uri = str(params.uri)
    contents: types.TextResourceContents | types.BlobResourceContents
    if uri == "test://static-text":
        contents = types.TextResourceContents(
            uri=uri, mime_type="text/plain", text="This is the content of the static text resource."
        )
    elif uri == "test://static-binary":
        contents = types.BlobResourceContents(uri=uri, mime_type="image/png", blob=IMAGE)
    elif uri == "test://watched-resource":
        contents = types.TextResourceContents(uri=uri, mime_type="text/plain", text="Watched resource content")
    elif uri.startswith(TEMPLATE_PREFIX) and uri.endswith(TEMPLATE_SUFFIX):
        ident = uri[len(TEMPLATE_PREFIX) : -len(TEMPLATE_SUFFIX)]
        text = json.dumps({"id": ident, "templateTest": True, "data": f"Data for ID: {ident}"})
        contents = types.TextResourceContents(uri=uri, mime_type="application/json", text=text)
    else:
        raise ValueError(f"no resource {uri}")
    return types.ReadResourceResult(contents=[contents])


async def subscribe(ctx: Ctx, params: types.SubscribeRequestParams) -> types.EmptyResult:
    subscriptions.add(str(params.uri))
    return types.EmptyResult()


async def unsubscribe(ctx: Ctx, params: types.UnsubscribeRequestParams) -> types.EmptyResult:
    subscriptions.discard(str(params.uri))
    return types.EmptyResult()


async def list_prompts(ctx: Ctx, params: Any) -> types.ListPromptsResult:
    return types.ListPromptsResult(prompts=PROMPTS)


async def get_prompt(ctx: Ctx, params: types.GetPromptRequestParams) -> types.GetPromptResult:
    args = params.arguments or {}
    messages: list[types.PromptMessage]
    if params.name == "test_simple_prompt":
        messages = [types.PromptMessage(role="user", content=_text("This is a simple prompt for testing."))]
    elif params.name == "test_prompt_with_arguments":
        text = f"Prompt with arguments: arg1='{args.get('arg1')}', arg2='{args.get('arg2')}'"
        messages = [types.PromptMessage(role="user", content=_text(text))]
    elif params.name == "test_prompt_with_embedded_resource":
        uri = args.get("resourceUri") or "test://example-resource"
        messages = [
            types.PromptMessage(role="user", content=_embedded(uri, "Embedded resource content for testing.")),
            types.PromptMessage(role="user", content=_text("Please process the embedded resource above.")),
        ]
    elif params.name == "test_prompt_with_image":
        messages = [
            types.PromptMessage(role="user", content=_image()),
            types.PromptMessage(role="user", content=_text("Please analyze the image above.")),
        ]
    else:
        raise ValueError(f"no prompt {params.name!r}")
    return types.GetPromptResult(messages=messages)


async def complete(ctx: Ctx, params: types.CompleteRequestParams) -> types.CompleteResult:
    return types.CompleteResult(completion=types.Completion(values=[], total=0, has_more=False))


async def set_level(ctx: Ctx, params: types.SetLevelRequestParams) -> types.EmptyResult:
    return types.EmptyResult()


class MemoryEventStore(EventStore):
    """Events kept in memory, so a client whose SSE stream was closed (`test_reconnection`) can resume."""

    def __init__(self) -> None:
        self.events: list[tuple[StreamId, EventId, types.JSONRPCMessage | None]] = []

    async def store_event(self, stream_id: StreamId, message: types.JSONRPCMessage | None) -> EventId:
        event_id = str(len(self.events) + 1)
        self.events.append((stream_id, event_id, message))
        return event_id

    async def replay_events_after(self, last_event_id: EventId, send_callback: EventCallback) -> StreamId | None:
        found = [entry for entry in self.events if entry[1] == last_event_id]
        if not found:
            return None
        stream_id = found[0][0]
        for stream, event_id, message in self.events[int(last_event_id) :]:
            if stream == stream_id and message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


def build() -> Server[Any]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MCPDeprecationWarning)  # logging/setLevel, for the handshake era
        return _build()


def _build() -> Server[Any]:
    return Server(
        "mcp-conformance-test-server",
        version="1.0.0",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_templates,
        on_read_resource=read_resource,
        on_subscribe_resource=subscribe,
        on_unsubscribe_resource=unsubscribe,
        on_subscriptions_listen=ListenHandler(InMemorySubscriptionBus()),
        on_list_prompts=list_prompts,
        on_get_prompt=get_prompt,
        on_completion=complete,
        on_set_logging_level=set_level,
    )


async def main_stdio() -> None:
    server = build()
    options = server.create_initialization_options(NotificationOptions())
    async with stdio_server() as (read_stream, write_stream):
        await server.run(read_stream, write_stream, options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", type=int, metavar="PORT", help="serve Streamable HTTP at http://127.0.0.1:PORT/mcp")
    port = parser.parse_args().http
    if port is None:
        anyio.run(main_stdio)
        return
    import uvicorn

    app = build().streamable_http_app(event_store=MemoryEventStore(), retry_interval=1000)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
