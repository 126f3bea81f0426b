"""Probes from an inputSchema: a benign call, then each path or URL argument aimed elsewhere."""

from __future__ import annotations

from cellblock.policy.probes import Places, destructive, probes

PLACES = Places(
    directory="/g",
    file="/g/cellblock-scan.txt",
    link="/g/cellblock-scan-link",
    outside="/o/not-granted.txt",
    secret="~/.ssh/id_rsa",
    traversal="/g/../home/.ssh/id_rsa",
    denied_url="http://127.0.0.1:9/x",
)


def test_a_path_argument_gets_a_benign_file_and_every_hostile_target() -> None:
    schema = {
        "type": "object",
        "properties": {"path": {"type": "string"}, "head": {"type": "integer", "minimum": 1}},
        "required": ["path"],
    }
    found = probes(schema, PLACES, "read_file")
    assert found[0].label == "benign" and found[0].arguments == {"path": "/g/cellblock-scan.txt"}
    assert [p.arguments["path"] for p in found[1:]] == [
        "/g/../home/.ssh/id_rsa",
        "/o/not-granted.txt",
        "~/.ssh/id_rsa",
        "/g/cellblock-scan-link",
    ]
    assert all(p.hostile and p.changed == "path" for p in found[1:])


def test_tools_that_make_things_get_a_new_name_and_lists_and_urls_are_aimed() -> None:
    schema = {
        "type": "object",
        "properties": {
            "paths": {"type": "array", "items": {"type": "string"}},
            "url": {"type": "string", "format": "uri"},
            "mode": {"enum": ["a", "b"]},
        },
        "required": ["paths", "mode"],
    }
    benign, *hostile = probes(schema, PLACES, "create_things")
    assert benign.arguments == {"paths": ["/g/cellblock-scan-new"], "mode": "a", "url": "https://example.com/"}
    assert {"url": "http://127.0.0.1:9/x"}.items() <= next(p for p in hostile if p.changed == "url").arguments.items()
    assert any(p.arguments["paths"] == ["~/.ssh/id_rsa"] for p in hostile)


def test_no_path_or_url_argument_means_no_hostile_probe() -> None:
    assert [p.label for p in probes({"type": "object", "properties": {"n": {"type": "number"}}}, PLACES)] == ["benign"]


def test_destructive_by_annotation_or_name() -> None:
    assert destructive("delete_file", None) and destructive("files-remove", {})
    assert destructive("write_file", {"destructiveHint": True})
    assert not destructive("read_file", {"readOnlyHint": True}) and not destructive("undeleted", None)
