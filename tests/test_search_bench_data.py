"""The tool-search benchmark's data (tests/bench/search): fixtures, queries and their answers agree."""

from __future__ import annotations

import json
import re
from collections import Counter

from tests.bench.search import CATALOGS, HERE, load_catalogs, load_queries, split_of, tool_ids
from tests.bench.search_catalogs import SERVERS, render


def test_there_are_enough_servers_tools_and_queries() -> None:
    catalogs = load_catalogs()
    assert len(catalogs) >= 15
    assert 200 <= len(tool_ids(catalogs)) <= 400
    assert len(load_queries()) >= 100
    assert load_queries("dev") and load_queries("held_out")


def test_every_answer_names_a_tool_in_the_fixtures() -> None:
    known = tool_ids(load_catalogs())
    for query in load_queries():
        assert query.answers, query.id
        named = [*query.answers, *(tool for step in query.steps for tool in step)]
        missing = [tool for tool in named if tool not in known]
        assert not missing, f"{query.id} {query.query!r}: {missing}"


def test_steps_are_part_of_the_answers() -> None:
    for query in load_queries():
        assert bool(query.steps) == ("multi_step" in query.tags), query.id
        for step in query.steps:
            assert step and set(step) & set(query.answers), query.id


def test_the_split_follows_the_fixed_rule() -> None:
    queries = load_queries()
    assert [q.id for q in queries] == [f"q{n:03d}" for n in range(1, len(queries) + 1)]
    assert all(q.split == split_of(q.id) for q in queries)
    share = len(load_queries("held_out")) / len(queries)
    assert 0.35 <= share <= 0.45


def test_queries_are_distinct_and_tagged_with_known_tags() -> None:
    queries = load_queries()
    texts = Counter(q.query.casefold() for q in queries)
    assert [text for text, count in texts.items() if count > 1] == []
    assert {tag for q in queries for tag in q.tags} <= {"synonym", "shared", "multi_step"}
    assert any(q.names_server for q in queries) and not all(q.names_server for q in queries)


def test_fixtures_are_canonical_and_match_the_pins() -> None:
    pins = {pinned.server: pinned for pinned in SERVERS}
    files = sorted(path.stem for path in CATALOGS.glob("*.json"))
    assert files == sorted(pins)
    for server, catalog in load_catalogs().items():
        pinned = pins[server]
        assert (catalog.package, catalog.version) == (pinned.package, pinned.version)
        names = [tool["name"] for tool in catalog.tools]
        assert names == sorted(set(names)), f"{server}: tools not sorted or repeated"
        text = (CATALOGS / f"{server}.json").read_text(encoding="utf-8")
        assert text == render(pinned, json.loads(text)["tools"]), f"{server}: not in the collector's form"


def test_the_readme_table_counts_the_fixtures() -> None:
    rows = re.findall(
        r"^\| ([a-z0-9-]+) \| (npm|pypi) \| `([^`]+)` \| (\d+) \|$", (HERE / "README.md").read_text(), re.M
    )
    catalogs = load_catalogs()
    pins = {pinned.server: pinned.pin for pinned in SERVERS}
    assert {server: (pin, int(count)) for server, _, pin, count in rows} == {
        server: (pins[server], len(catalog.tools)) for server, catalog in catalogs.items()
    }


def test_the_readme_states_the_current_counts() -> None:
    readme = (HERE / "README.md").read_text()
    queries = load_queries()
    assert f"Total: {len(tool_ids(load_catalogs()))} tools." in readme
    assert f"{len(queries)} queries, in `queries.json`" in readme
    assert f"{len(load_queries('dev'))} dev and {len(load_queries('held_out'))} held out" in readme
