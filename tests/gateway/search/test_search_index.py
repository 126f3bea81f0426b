"""Tool search's ranking (search/index.py) and its config (`catalog:`), in memory."""

from __future__ import annotations

import importlib
import importlib.util
import socket
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.base import ConfigError
from cellblock.gateway.config.catalog import CatalogConfig
from cellblock.gateway.search import index as index_module
from cellblock.gateway.search import semantic
from cellblock.gateway.search.index import Entry, Index, split_words, stop_words, words
from cellblock.gateway.serve.search import Search

TOOLS = [
    Entry("mem__store_fact", "mem", description="Store a fact in the knowledge graph"),
    Entry("fs__list_directory", "fs", description="List the entries of a directory", parameters=("path",)),
    Entry("fs__read_file", "fs", description="Read a file's text", parameters=("path",)),
    Entry("gh__createIssue", "gh", title="Create issue", description="Open a new issue in a repository"),
    Entry("git__read_log", "git", description="Read the commit log of a repository"),
]


def names(index: Index, query: str, **extra: Any) -> list[str]:
    return [m.name for m in index.find(query, **extra)]


def test_names_are_split_where_they_join_words() -> None:
    assert split_words("gh__createIssue") == ["gh", "create", "issue"]
    assert split_words("getFileInfo read-file.v2") == ["get", "file", "info", "read", "file", "v2"]


def test_a_tool_is_found_by_its_own_words_best_first_with_why() -> None:
    index = Index(TOOLS)
    found = index.find("read the file notes.txt")
    assert found[0].name == "fs__read_file" and "read" in found[0].why and "file" in found[0].why


def test_the_thesaurus_finds_a_tool_by_the_words_people_use() -> None:
    index = Index(TOOLS, meaning=False)  # the lexical rankings: the embeddings rank every tool
    assert "store" in words()["remember"]
    assert names(index, "remember that the cat is black")[0] == "mem__store_fact"
    assert names(index, "what is in the photos folder")[0] == "fs__list_directory"
    # the control: a word the thesaurus does not know finds nothing of the kind
    assert "mem__store_fact" not in names(index, "memorialise that the cat is black")


def test_only_the_servers_tools_are_found_when_one_is_named() -> None:
    index = Index(TOOLS)
    assert names(index, "read the repository log")[0] == "git__read_log"
    found = names(index, "read", server="fs")
    assert found[0] == "fs__read_file" and {n.split("__")[0] for n in found} == {"fs"}
    assert names(index, "read", server="nobody") == []


def test_a_request_of_no_words_finds_nothing() -> None:
    index = Index(TOOLS)
    assert index.find("") == [] and index.find("the of my") == [] and index.find("!!!") == []
    assert {"the", "of", "my"} <= stop_words()
    assert Index([]).find("read a file") == []


def test_the_answer_is_cut_at_the_limit_and_stable() -> None:
    index = Index(TOOLS)
    first = names(index, "read a file in the repository", limit=2)
    assert len(first) == 2 and first == names(index, "read a file in the repository", limit=2)


def test_search_written_bare_as_a_yaml_boolean_is_taken() -> None:
    on = CatalogConfig.model_validate(yaml.safe_load("search: on"))
    off = CatalogConfig.model_validate(yaml.safe_load("search: off"))
    assert (on.search, off.search) == ("on", "off")
    with pytest.raises(ValueError, match="'off', 'on' or 'auto'"):
        CatalogConfig.model_validate({"search": "sometimes"})


def test_search_on_without_the_extra_refuses_to_start_naming_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = importlib.import_module

    def missing(name: str, package: str | None = None) -> ModuleType:
        if name == "bm25s":
            raise ImportError(name=name)
        return real(name, package)

    audit = Audit(tmp_path / "audit.jsonl")
    Search(CatalogConfig(search="on"), "__", 64, audit)  # the control: with the extra, it starts
    monkeypatch.setattr(importlib, "import_module", missing)
    with pytest.raises(ConfigError, match=r"pip install 'cellblock\[search\]'.*catalog.search: off"):
        Search(CatalogConfig(search="on"), "__", 64, audit)
    Search(CatalogConfig(search="off"), "__", 64, audit)  # off needs nothing of it


WEATHER = Entry("weather__forecast", "weather", description="Tomorrow's temperature and chance of rain")
ELEVATION = Entry("maps__elevation", "maps", description="Altitude of a point above sea level")


@pytest.mark.parametrize(
    ("tool", "query"), [(WEATHER, "will it be sunny this weekend"), (ELEVATION, "how tall is the mountain")]
)
def test_the_semantic_ranking_finds_a_tool_that_shares_no_word_with_the_request(tool: Entry, query: str) -> None:
    tools = [*TOOLS, tool]
    index = Index(tools)
    own, added = index.query_terms(query)
    # the premise: not one of the request's terms, stemmed and through the thesaurus, is the tool's
    assert own and not set(own + added) & index._said[-1]
    assert names(index, query)[0] == tool.name
    assert "meaning" in index.find(query)[0].why
    # the control: the lexical rankings alone cannot find it
    assert tool.name not in names(Index(tools, meaning=False), query)


def test_loading_the_embeddings_never_touches_the_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the network was touched: {args!r}")

    for name in ("connect", "connect_ex", "sendto"):
        monkeypatch.setattr(socket.socket, name, refused)
    monkeypatch.setattr(socket, "create_connection", refused)
    monkeypatch.setattr(socket, "getaddrinfo", refused)
    for variable in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(variable, "http://127.0.0.1:9")  # and were a client to try, it would go nowhere
    # the control: the guard does refuse a connection
    with pytest.raises(AssertionError, match="network"):
        socket.create_connection(("127.0.0.1", 9))
    monkeypatch.setattr(semantic, "_model", None)  # loaded anew, under the guard
    index = Index([*TOOLS, WEATHER])
    assert semantic._model is not None
    assert names(index, "will it be sunny this weekend")[0] == "weather__forecast"


def test_search_on_without_the_embeddings_refuses_to_start_naming_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = importlib.util.find_spec

    def missing(name: str, package: str | None = None) -> Any:
        return None if name == semantic.PACKAGE else real(name, package)

    monkeypatch.setattr(semantic, "_model", None)
    monkeypatch.setattr(importlib.util, "find_spec", missing)
    with pytest.raises(ConfigError, match=r"wordllama is missing.*pip install 'cellblock\[search\]'"):
        Search(CatalogConfig(search="on"), "__", 64, Audit(tmp_path / "audit.jsonl"))
    Index(TOOLS, meaning=False)  # the control: the lexical rankings need nothing of it
    monkeypatch.undo()
    assert Index(TOOLS).find("read the file")  # and with it, search works


BRANCHES = [
    Entry("git__create_branch", "git", description="Create a new branch in a repository"),
    Entry("github__create_branch", "github", description="Create a new branch in a repository"),
    Entry("web__search", "brave-search", description="Search the web"),
    Entry("docs__find", "docs", description="Search the documentation"),
]


def test_a_request_that_names_a_server_favours_its_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    index = Index(BRANCHES)
    # "GitHub" split is "git" and "hub": by its words alone the git server's tool wins
    assert names(index, "create a branch on GitHub")[0] == "github__create_branch"
    assert names(index, "create a branch on git")[0] == "git__create_branch"
    # the control: without the lift, the request's split words find the other server's tool first
    monkeypatch.setattr(index_module, "SERVER_BONUS", 0.0)
    assert names(index, "create a branch on GitHub")[0] == "git__create_branch"


def test_only_a_word_other_servers_rarely_say_names_a_server() -> None:
    index = Index(BRANCHES)
    assert index.named("create a branch on GitHub") == {"github"}
    assert index.named("my brave results") == {"brave-search"}
    # "search" is of brave-search's name, but another server's tool says it too
    assert index.named("search the docs") == {"docs"}
    assert index.named("create a branch") == set()


def test_the_thesaurus_knows_the_words_of_labels_pauses_and_repeats() -> None:
    tools = [
        Entry("wiki__add_label", "wiki", description="Add a label to a page"),
        Entry("db__pause_project", "db", description="Pause a project"),
        Entry("test__echo", "test", description="Echoes back the input"),
        Entry("wiki__get_page", "wiki", description="Get a page"),
    ]
    index = Index(tools, meaning=False)
    assert names(index, "tag the page as draft")[0] == "wiki__add_label"
    assert names(index, "suspend the project")[0] == "db__pause_project"
    assert names(index, "repeat what I say")[0] == "test__echo"
    # the control: a word the thesaurus does not know finds none of them
    assert "test__echo" not in names(index, "parrot what I say")
