"""Client config files: reading each format, and editing only the servers block, byte for byte."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellblock.gateway.clients.blocks import ClientEntry, ServersBlock, detect, read_blocks, render_block, replace_span
from cellblock.gateway.clients.kinds import KINDS, ClientConfigError, entry_dict, known_locations, name_budget

GOLDEN = Path(__file__).parent / "golden" / "clients"
CELLBLOCK = "/opt/cellblock/bin/cellblock"
SERVE = ["serve", "--config", "/home/u/.config/cellblock/cellblock.yaml"]

# golden stem -> (kind, the path the file would have on disk)
CASES = {
    "claude-desktop": ("claude-desktop", "/home/u/.config/Claude/claude_desktop_config.json"),
    "claude-code": ("claude-code", "/home/u/proj/.mcp.json"),
    "claude-code-user": ("claude-code", "/home/u/.claude.json"),
    "cursor": ("cursor", "/home/u/proj/.cursor/mcp.json"),
    "vscode": ("vscode", "/home/u/proj/.vscode/mcp.json"),
    "windsurf": ("windsurf", "/home/u/.codeium/windsurf/mcp_config.json"),
    "gemini": ("gemini", "/home/u/.gemini/settings.json"),
    "codex": ("codex", "/home/u/.codex/config.toml"),
}


def golden(stem: str, which: str) -> str:
    (path,) = GOLDEN.glob(f"{stem}.{which}.*")
    return path.read_bytes().decode("utf-8")  # bytes: no newline translation


def summary(entry: ClientEntry) -> dict[str, Any]:
    """The fields an entry sets, so expectations list only what matters."""
    fields = {
        "command": entry.command,
        "args": entry.args,
        "env": dict(entry.env),
        "cwd": entry.cwd,
        "url": entry.url,
        "headers": dict(entry.headers),
        "transport": entry.transport,
        "extra": dict(entry.extra),
    }
    return {key: value for key, value in fields.items() if value not in (None, (), {})}


EXPECTED: dict[str, dict[tuple[str, ...], dict[str, dict[str, Any]]]] = {
    "claude-desktop": {
        ("mcpServers",): {
            "filesystem": {
                "command": "npx",
                "args": ("-y", "@modelcontextprotocol/server-filesystem", "/home/u/Documents"),
            },
            "GitHub Tools.v2 Été ✓": {
                "command": "/usr/local/bin/github-mcp",
                "env": {"GITHUB_TOKEN": "ghp_not_a_real_token_0000"},
                "extra": {"disabled": False},
            },
            "linear": {
                "command": "npx",
                "args": ("mcp-remote", "https://mcp.linear.app/sse", "--header", "Authorization: Bearer lin_not_real"),
            },
            "notes": {
                "url": "https://notes.example.com/mcp",
                "headers": {"Authorization": "Bearer notes_not_real"},
                "transport": "http",
            },
        }
    },
    "claude-code": {
        ("mcpServers",): {
            "sentry": {
                "url": "https://mcp.sentry.dev/mcp",
                "headers": {"Authorization": "Bearer sntrys_not_real"},
                "transport": "http",
            },
            "db tools.PROD ✓": {
                "command": "uvx",
                "args": ("mcp-server-postgres", "--dsn", "postgresql://app:hunter2@db/app"),
                "env": {"PGPASSWORD": "hunter2"},
                "transport": "stdio",
                "extra": {"timeout": 30000},
            },
            "events": {"url": "https://events.example.com/sse", "transport": "sse"},
        }
    },
    "claude-code-user": {
        ("mcpServers",): {
            "memory": {"command": "npx", "args": ("-y", "@modelcontextprotocol/server-memory"), "transport": "stdio"},
        },
        ("projects", "/home/u/web", "mcpServers"): {
            "playwright": {"command": "npx", "args": ("@playwright/mcp@latest",), "transport": "stdio"},
            "Figma Dev.Mode": {"url": "http://127.0.0.1:3845/mcp", "transport": "http"},
        },
        ("projects", "/home/u/empty", "mcpServers"): {},
        ("projects", "/home/u/api", "mcpServers"): {
            "stripe": {
                "command": "npx",
                "args": ("-y", "@stripe/mcp", "--tools=all"),
                "env": {"STRIPE_SECRET_KEY": "sk_test_not_real"},
                "transport": "stdio",
            },
        },
    },
    "cursor": {
        ("mcpServers",): {
            "context7": {"url": "https://mcp.context7.com/mcp", "headers": {"CONTEXT7_API_KEY": "ctx7_not_real"}},
            "Local Files ÄÖ.x": {
                "command": "node",
                "args": ("/home/u/tools/files/index.js", "--root", "${workspaceFolder}"),
                "env": {"API_KEY": "sk-not-real"},
                "extra": {"envFile": "${workspaceFolder}/.env", "autoApprove": ["read_file"]},
            },
        }
    },
    "vscode": {
        ("servers",): {
            "perplexity": {
                "command": "npx",
                "args": ("-y", "server-perplexity-ask", "--base", "https://api.perplexity.ai/v1"),
                "env": {
                    "PERPLEXITY_API_KEY": "${input:api-key}",
                    "HOME_DIR": "${env:HOME}",
                    "LEGACY_KEY": "pplx-not-real",
                    "PATTERN": "/* not a comment */",
                    "PORT": "8080",
                },
                "transport": "stdio",
                "extra": {"envFile": "${workspaceFolder}/.env"},
            },
            'GitHub Remote.ü "beta"': {
                "url": "https://api.githubcopilot.com/mcp/",
                "headers": {"Authorization": "Bearer ghp_not_a_real_token_3333"},
                "transport": "http",
            },
        }
    },
    "windsurf": {
        ("mcpServers",): {
            "github": {
                "command": "npx",
                "args": ("-y", "@modelcontextprotocol/server-github"),
                "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_not_a_real_token_1111"},
                "extra": {"disabled": False, "alwaysAllow": ["search_repositories"]},
            },
            "Team Docs.Ünïcode": {
                "url": "https://docs.example.com/mcp",
                "headers": {"Authorization": "Bearer ${env:DOCS_TOKEN}", "X-Api-Key": "docs_not_real"},
            },
        }
    },
    "gemini": {
        ("mcpServers",): {
            "git": {
                "command": "uvx",
                "args": ("mcp-server-git",),
                "cwd": "./repo",
                "env": {"GIT_TOKEN": "$MY_GIT_TOKEN", "DEPLOY_KEY": "dk_not_real"},
                "extra": {"timeout": 30000, "trust": False, "includeTools": ["git_status", "git_diff"]},
            },
            "github": {
                "url": "https://api.githubcopilot.com/mcp/",
                "headers": {"Authorization": "ghp_not_a_real_token_2222"},
                "transport": "http",
                "extra": {"timeout": 5000},
            },
            "Old SSE.Server ß": {
                "url": "http://localhost:8080/sse",
                "transport": "sse",
                "extra": {"excludeTools": ["dangerous_tool"]},
            },
        }
    },
    "codex": {
        ("mcp_servers",): {
            "docs": {
                "command": "npx",
                "args": ("-y", "mcp-server-docs"),
                "env": {"DOCS_TOKEN": "docs_not_real"},
                "extra": {"startup_timeout_sec": 20},
            },
            "Build Tools.v2 ✓": {
                "command": "/opt/build/mcp",
                "args": ("--mode", "[strict]"),
                "env": {"API_KEY": "sk-not-real", "REGION": "eu"},
                "extra": {"enabled": True},
            },
            "figma": {
                "url": "https://mcp.figma.com/mcp",
                "headers": {"X-Team": "design"},
                "transport": "http",
                "extra": {"bearer_token_env_var": "FIGMA_TOKEN"},
            },
        }
    },
}


def wrap_all(kind: str, text: str, blocks: list[ServersBlock]) -> tuple[str, list[tuple[int, int]]]:
    """The text with the user block holding only cellblock and project blocks emptied, and the new spans."""
    out = text
    news = []
    for block in reversed(blocks):
        entries = {} if block.where[0] == "projects" else {"cellblock": entry_dict(kind, CELLBLOCK, SERVE)}
        new = render_block(kind, block, out, entries)
        out = replace_span(out, block.start, block.end, new)
        news.append(new)
    news.reverse()
    spans, shift = [], 0
    for block, new in zip(blocks, news, strict=True):
        spans.append((block.start + shift, block.start + shift + len(new)))
        shift += len(new) - (block.end - block.start)
    return out, spans


# --- the golden files -----------------------------------------------------------------------------


@pytest.mark.parametrize("stem", CASES)
def test_each_format_is_detected_from_its_path(stem: str) -> None:
    kind, path = CASES[stem]
    assert detect(Path(path), golden(stem, "in")) == kind


@pytest.mark.parametrize("stem", CASES)
def test_each_format_reads_every_entry_as_the_client_would(stem: str) -> None:
    kind, _ = CASES[stem]
    blocks = read_blocks(kind, golden(stem, "in"))
    got = {block.where: {entry.name: summary(entry) for entry in block.entries} for block in blocks}
    assert got == EXPECTED[stem]
    for block in blocks:  # file order, not sorted
        assert [entry.name for entry in block.entries] == list(EXPECTED[stem][block.where])


@pytest.mark.parametrize("stem", CASES)
def test_replacing_the_block_with_cellblock_gives_the_golden_output(stem: str) -> None:
    kind, _ = CASES[stem]
    text = golden(stem, "in")
    out, _ = wrap_all(kind, text, read_blocks(kind, text))
    assert out == golden(stem, "out")


@pytest.mark.parametrize("stem", CASES)
def test_putting_the_old_block_text_back_restores_the_input_byte_for_byte(stem: str) -> None:
    kind, _ = CASES[stem]
    text = golden(stem, "in")
    blocks = read_blocks(kind, text)
    out, spans = wrap_all(kind, text, blocks)
    assert [(b.start, b.end) for b in read_blocks(kind, out)] == spans  # the output reads back the same way
    for block, (start, end) in reversed(list(zip(blocks, spans, strict=True))):
        out = replace_span(out, start, end, text[block.start : block.end])
    assert out == text


@pytest.mark.parametrize("stem", CASES)
def test_the_wrapped_output_holds_only_the_cellblock_entry(stem: str) -> None:
    kind, _ = CASES[stem]
    out = golden(stem, "out")
    (user, *projects) = read_blocks(kind, out)
    assert [summary(entry) for entry in user.entries] == [
        {"command": CELLBLOCK, "args": tuple(SERVE)}
        | ({"transport": "stdio"} if kind in ("vscode", "claude-code") else {})
    ]
    assert all(not block.entries for block in projects)


def test_raw_text_is_the_exact_source_of_each_entry() -> None:
    text = golden("claude-desktop", "in")
    (block,) = read_blocks("claude-desktop", text)
    linear = next(entry for entry in block.entries if entry.name == "linear")
    assert linear.raw_text.startswith('{\n      "command": "npx",') and linear.raw_text.endswith("\n    }")
    assert linear.raw_text in text and json.loads(linear.raw_text)["command"] == "npx"


def test_a_codex_entry_raw_text_holds_its_sub_tables() -> None:
    text = golden("codex", "in")
    (block,) = read_blocks("codex", text)
    build = next(entry for entry in block.entries if entry.name == "Build Tools.v2 ✓")
    assert build.raw_text.startswith('[mcp_servers."Build Tools.v2 ✓"]\n')
    assert build.raw_text.endswith('REGION = "eu"')
    assert build.raw_text in text


def test_the_codex_span_leaves_the_comments_around_it_outside() -> None:
    text = golden("codex", "in")
    (block,) = read_blocks("codex", text)
    assert text[: block.start].endswith("# --- MCP servers ---\n")
    assert text[block.end :].startswith("\n\n# The profile below is not an MCP table.\n[profiles.careful]")


CODEX_TRICKY = """\
[mcp_servers.a]
command = "x"
matrix = [
  ["b", "c"],
  [
    "d",
  ],
]
note = '''
[profiles.not_a_table]
'''
quote = \"\"\"ends with a quote\"\"\"\"

[mcp_servers.a.env]
K = "v"

[profiles.p]
list = [
[1],
]
"""


def test_codex_lines_inside_arrays_and_strings_open_no_table() -> None:
    (block,) = read_blocks("codex", CODEX_TRICKY)
    assert CODEX_TRICKY[block.start : block.end] == CODEX_TRICKY[: CODEX_TRICKY.index("\n\n[profiles.p]")]
    (entry,) = block.entries
    assert dict(entry.env) == {"K": "v"}
    assert entry.extra["matrix"] == [["b", "c"], ["d"]]
    assert entry.extra["quote"] == 'ends with a quote"'


def test_the_wrapped_codex_file_keeps_every_other_setting() -> None:
    before = tomllib.loads(golden("codex", "in"))
    after = tomllib.loads(golden("codex", "out"))
    assert set(after["mcp_servers"]) == {"cellblock"}
    assert {k: v for k, v in after.items() if k != "mcp_servers"} == {
        k: v for k, v in before.items() if k != "mcp_servers"
    }


# --- the scanner ----------------------------------------------------------------------------------


def test_comment_markers_inside_strings_are_text() -> None:
    text = '{"mcpServers": {"a": {"command": "x", "args": ["http://h/p", "/*", "*/", "//", "\\"//\\""]}}}'
    (block,) = read_blocks("claude-desktop", text)
    assert block.entries[0].args == ("http://h/p", "/*", "*/", "//", '"//"')


def test_jsonc_comments_and_trailing_commas_are_read_in_any_json_kind() -> None:
    text = '{\n  // c\n  "mcpServers": { /* c */ "a": {"command": "x", "args": ["y",],}, },\n}\n'
    (block,) = read_blocks("cursor", text)
    assert [(e.name, e.command, e.args) for e in block.entries] == [("a", "x", ("y",))]


def test_a_file_without_a_servers_key_has_no_blocks() -> None:
    assert read_blocks("claude-desktop", '{"globalShortcut": "x"}') == []
    assert read_blocks("codex", 'model = "x"\n') == []
    assert read_blocks("vscode", "") == []


def test_an_empty_servers_block_has_a_span_but_no_entries() -> None:
    text = '{\n  "servers": {}\n}\n'
    (block,) = read_blocks("vscode", text)
    assert (text[block.start : block.end], block.entries) == ("{}", ())


# --- rendering ------------------------------------------------------------------------------------


def test_entry_dict_gives_each_client_its_stdio_shape() -> None:
    assert entry_dict("vscode", "c", ["a"]) == {"type": "stdio", "command": "c", "args": ["a"]}
    assert entry_dict("claude-code", "c", ["a"]) == {"type": "stdio", "command": "c", "args": ["a"]}
    for kind in ("claude-desktop", "cursor", "windsurf", "gemini", "codex"):
        assert entry_dict(kind, "c", ("a",)) == {"command": "c", "args": ["a"]}


def test_rendering_follows_tabs_and_crlf_line_breaks() -> None:
    text = '{\r\n\t"mcpServers": {\r\n\t\t"a": {"command": "x"}\r\n\t}\r\n}\r\n'
    (block,) = read_blocks("claude-desktop", text)
    new = render_block("claude-desktop", block, text, {"b": {"command": "y", "args": []}})
    assert new == '{\r\n\t\t"b": {\r\n\t\t\t"command": "y",\r\n\t\t\t"args": []\r\n\t\t}\r\n\t}'


def test_rendering_escapes_odd_names_so_they_read_back_the_same() -> None:
    name = 'a "quoted"\\back\tslash ✓'
    for kind, text in (("cursor", '{"mcpServers": {}}'), ("codex", '[mcp_servers.a]\ncommand = "x"\n')):
        (block,) = read_blocks(kind, text)
        out = replace_span(text, block.start, block.end, render_block(kind, block, text, {name: {"command": "c"}}))
        assert [entry.name for entry in read_blocks(kind, out)[0].entries] == [name]


def test_codex_renders_mappings_as_sub_tables() -> None:
    text = '[mcp_servers.a]\ncommand = "x"\n'
    (block,) = read_blocks("codex", text)
    new = render_block("codex", block, text, {"b": {"command": "y", "env": {"K": "v"}, "startup_timeout_sec": 20}})
    assert new == '[mcp_servers.b]\ncommand = "y"\nstartup_timeout_sec = 20\n\n[mcp_servers.b.env]\nK = "v"'


def test_a_value_the_format_cannot_hold_is_refused() -> None:
    text = '[mcp_servers.a]\ncommand = "x"\n'
    (block,) = read_blocks("codex", text)
    with pytest.raises(ClientConfigError, match="null"):
        render_block("codex", block, text, {"b": {"command": None}})
    with pytest.raises(ClientConfigError, match="mapping"):
        not_a_table: Any = ["not", "a", "table"]
        render_block("codex", block, text, {"b": not_a_table})


def test_replace_span_refuses_a_span_outside_the_text() -> None:
    assert replace_span("abcdef", 1, 3, "XY") == "aXYdef"
    with pytest.raises(ClientConfigError, match="not inside"):
        replace_span("abc", 2, 5, "x")


# --- round trips over generated entries -----------------------------------------------------------

_TEXT = st.text(st.characters(exclude_categories=["Cs"]), max_size=12)
_ENTRY = st.fixed_dictionaries(
    {"command": _TEXT, "args": st.lists(_TEXT, max_size=4), "env": st.dictionaries(_TEXT, _TEXT, max_size=3)}
)
_ENTRIES = st.dictionaries(_TEXT.filter(bool), _ENTRY, min_size=1, max_size=4)
_BASES = {
    "claude-desktop": '{\n  "other": [1, 2],\n  "mcpServers": {\n    "old": {"command": "x"}\n  },\n  "z": null\n}\n',
    "vscode": '{\n  // c\n  "servers": {},\n  "inputs": [],\n}\n',
    "codex": 'model = "m"\n\n[mcp_servers.old]\ncommand = "x"\n\n[profiles.p]\nmodel = "y"\n',
}


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(sorted(_BASES)), entries=_ENTRIES)
def test_rendered_entries_read_back_unchanged(kind: str, entries: dict[str, dict[str, Any]]) -> None:
    text = _BASES[kind]
    (block,) = read_blocks(kind, text)
    out = replace_span(text, block.start, block.end, render_block(kind, block, text, entries))
    (again,) = read_blocks(kind, out)
    got = {e.name: {"command": e.command, "args": list(e.args), "env": dict(e.env)} for e in again.entries}
    assert got == entries
    assert out[: block.start] == text[: block.start]
    assert out[block.start + (again.end - again.start) :] == text[block.end :]


# --- refusals -------------------------------------------------------------------------------------


def test_invalid_json_names_the_file_line_and_column() -> None:
    text = '{\n  "mcpServers": {\n    "a": {"command": "x" "args": []}\n  }\n}\n'
    with pytest.raises(ClientConfigError, match=r"mcp\.json: invalid JSON at line 3, column 26: expected ','"):
        detect(Path("/home/u/.cursor/mcp.json"), text)
    with pytest.raises(ValueError, match="line 3, column 26"):  # also a ValueError, as callers may expect
        read_blocks("cursor", text)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ('{"a": 1', "line 1, column 8"),
        ('{"a": "unterminated}', "line 1, column 7"),
        ('{\n"a": tru}', "line 2, column 6"),
        ('{"a": 1} x', "line 1, column 10"),
        ('{"a": "\\q"}', "line 1, column 8"),  # at the backslash
        ("{/* open", "line 1, column 2"),
    ],
)
def test_every_json_error_gives_its_position(text: str, where: str) -> None:
    with pytest.raises(ClientConfigError, match=where):
        read_blocks("claude-desktop", text)


def test_a_file_of_no_known_format_is_refused_by_name() -> None:
    with pytest.raises(ClientConfigError, match=r"'notes\.txt' belongs to"):
        detect(Path("notes.txt"), "{}")
    with pytest.raises(ClientConfigError, match=r"'/tmp/other\.json' belongs to.*known formats: claude-desktop"):
        detect(Path("/tmp/other.json"), '{"editor": {}}')


def test_invalid_toml_names_the_file_and_line() -> None:
    with pytest.raises(ClientConfigError, match=r"config\.toml: invalid TOML: .*line 2"):
        detect(Path("/home/u/.codex/config.toml"), '[mcp_servers.a]\ncommand = "x\n')


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ClientConfigError, match="unknown client kind 'zed'; expected one of claude-desktop"):
        read_blocks("zed", "{}")
    with pytest.raises(ClientConfigError, match="unknown client kind"):
        name_budget("zed", "cellblock")


def test_codex_tables_split_by_another_table_are_refused() -> None:
    text = '[mcp_servers.a]\ncommand = "x"\n\n[profiles.p]\nmodel = "y"\n\n[mcp_servers.b]\ncommand = "z"\n'
    with pytest.raises(ClientConfigError, match=r"must sit together, but \[profiles\.p\] at line 4"):
        read_blocks("codex", text)


@pytest.mark.parametrize(
    "text",
    [
        'mcp_servers = { a = { command = "x" } }\n',
        '[mcp_servers]\na.command = "x"\n',
        'mcp_servers.a.command = "x"\n\n[mcp_servers.b]\ncommand = "y"\n',
    ],
)
def test_codex_servers_not_written_as_tables_are_refused(text: str) -> None:
    with pytest.raises(ClientConfigError, match=r"own \[mcp_servers\.NAME\] table"):
        read_blocks("codex", text)


def test_a_server_name_written_twice_is_refused() -> None:
    text = '{"mcpServers": {"a": {"command": "x"}, "a": {"command": "y"}}}'
    with pytest.raises(ClientConfigError, match="'a' appears 2 times"):
        read_blocks("claude-desktop", text)


def test_a_servers_key_written_twice_is_refused() -> None:
    with pytest.raises(ClientConfigError, match="'servers' appears 2 times"):
        read_blocks("vscode", '{"servers": {}, "servers": {}}')


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ('"x"', "server 'a' must be an object \\(got string\\)"),
        ('{"command": 1}', "'command' must be a string \\(got number\\)"),
        ('{"command": "c", "args": "-v"}', "'args' must be an array of strings \\(got string\\)"),
        ('{"command": "c", "args": [null]}', "'args\\[0\\]' must be a string \\(got null\\)"),
        ('{"command": "c", "env": {"K": true}}', "'env.K' must be a string \\(got boolean\\)"),
        ('{"url": "u", "headers": []}', "'headers' must be an object of strings \\(got array\\)"),
    ],
)
def test_an_entry_of_the_wrong_shape_is_refused_with_got_and_expected(entry: str, message: str) -> None:
    with pytest.raises(ClientConfigError, match=message):
        read_blocks("claude-code", '{"mcpServers": {"a": ' + entry + "}}")


def test_a_servers_value_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(ClientConfigError, match="'mcpServers' at line 1, column 16 must be an object"):
        read_blocks("claude-desktop", '{"mcpServers": []}')


# --- detection, locations, name budgets -----------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        ("/home/u/Library/Application Support/Claude/claude_desktop_config.json", "claude-desktop"),
        ("/home/u/.claude.json", "claude-code"),
        ("/p/.mcp.json", "claude-code"),
        ("/p/.cursor/mcp.json", "cursor"),
        ("/p/.vscode/mcp.json", "vscode"),
        ("/home/u/.config/Code/User/mcp.json", "vscode"),
        ("/home/u/Library/Application Support/Code - Insiders/User/mcp.json", "vscode"),
        ("/home/u/.codeium/windsurf/mcp_config.json", "windsurf"),
        ("/p/.gemini/settings.json", "gemini"),
        ("/home/u/.codex/config.toml", "codex"),
    ],
)
def test_detect_goes_by_file_name_and_folder_first(path: str, kind: str) -> None:
    # The content alone would say claude-desktop: the path must win.
    text = "" if kind == "codex" else '{"mcpServers": {}}'
    assert detect(Path(path), text) == kind


@pytest.mark.parametrize(
    ("text", "path", "kind"),
    [
        ('{"servers": {}}', "/x/mcp.json", "vscode"),
        ('{"mcpServers": {}}', "/x/mcp.json", "claude-desktop"),
        ('// jsonc\n{"servers": {},}', "/x/team.jsonc", "vscode"),
        ('[mcp_servers.a]\ncommand = "x"\n', "/x/config.toml", "codex"),
    ],
)
def test_detect_falls_back_to_the_content(text: str, path: str, kind: str) -> None:
    assert detect(Path(path), text) == kind


def test_known_locations_per_platform() -> None:
    home, cwd = Path("/h"), Path("/w")
    linux = {path: kind for kind, path in known_locations(home, cwd, "linux")}
    assert linux[Path("/h/.config/Claude/claude_desktop_config.json")] == "claude-desktop"
    assert linux[Path("/h/.config/Code/User/mcp.json")] == "vscode"
    assert set(linux) >= {
        Path("/h/.claude.json"),
        Path("/w/.mcp.json"),
        Path("/h/.cursor/mcp.json"),
        Path("/w/.cursor/mcp.json"),
        Path("/w/.vscode/mcp.json"),
        Path("/h/.codeium/windsurf/mcp_config.json"),
        Path("/h/.gemini/settings.json"),
        Path("/w/.gemini/settings.json"),
        Path("/h/.codex/config.toml"),
    }
    mac = {path for _, path in known_locations(home, cwd, "darwin")}
    assert Path("/h/Library/Application Support/Claude/claude_desktop_config.json") in mac
    assert Path("/h/Library/Application Support/Code/User/mcp.json") in mac
    win = {path for _, path in known_locations(home, cwd, "win32")}
    assert Path("/h/AppData/Roaming/Claude/claude_desktop_config.json") in win
    assert {kind for kind, _ in known_locations(home, cwd, "linux")} == set(KINDS)


def test_known_locations_lists_a_file_once_when_cwd_is_home() -> None:
    paths = [path for _, path in known_locations(Path("/h"), Path("/h"), "linux")]
    assert len(paths) == len(set(paths))
    assert paths.count(Path("/h/.gemini/settings.json")) == 1


@pytest.mark.parametrize(
    ("kind", "key", "budget"),
    [
        ("claude-code", "cellblock", 64 - len("mcp__cellblock__")),
        ("codex", "cellblock", 64 - len("mcp__cellblock__")),
        ("gemini", "cellblock", 63 - len("mcp_cellblock_")),
        ("cursor", "cellblock", 59 - len("cellblock")),
        ("claude-desktop", "cellblock", 64),
        ("vscode", "cellblock", 64),
        ("windsurf", "cellblock", 64),
        ("claude-code", "x" * 60, 16),  # never below Cellblock's minimum
        ("cursor", "x" * 50, 16),
    ],
)
def test_name_budget_leaves_room_for_the_clients_own_prefix(kind: str, key: str, budget: int) -> None:
    assert name_budget(kind, key) == budget


def test_a_name_of_the_budget_fits_claude_codes_64_characters() -> None:
    key = "cellblock"
    assert len(f"mcp__{key}__" + "t" * name_budget("claude-code", key)) == 64
