"""Ranking the catalog's tools for a request in words (`cellblock__find_tools`).

Three rankings, fused by their ranks (reciprocal rank fusion), and a lift for the tools of a
server the request names:
- BM25 over everything a tool says of itself: its exposed name (twice: a name is the densest
  description), its server, title, description, parameter names and hints;
- BM25 over its names alone (name, server, title), where a word of the request weighs more;
- by meaning (semantic.py): static word embeddings of the request, with the thesaurus's words,
  against each tool's name, title and first sentence; it finds a tool that shares no word with
  the request, and counts as much as the two lexical rankings together.

Words are split where names join them (`create_issue`, `getFileInfo`), stemmed (Snowball's
English stemmer, PyStemmer) and looked up in `words.json`, a small thesaurus of how people ask
("remember" finds "store", "folder" finds "directory"), kept as data. BM25 is `bm25s`; they and
the embeddings (`wordllama`) are the optional extra `cellblock[search]`, imported only where
search is on.

Nothing here knows of servers, policy or the SDK: the gateway hands it the tools a client may
call, and nothing else (serve/search.py).
"""

from __future__ import annotations

import importlib
import json
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from cellblock.gateway.search import semantic

__all__ = ["Entry", "Index", "Match", "MissingExtra", "require", "split_words", "stop_words", "words"]

# fusion's constant: the usual 60 lets a tool ranked well by one ranking and badly by the other
# still beat one ranked middling by both
FUSION_K = 60
# the semantic ranking's places count twice: it is one ranking beside two lexical ones, and a
# tool it finds alone must be able to beat one that merely shares a common word
SEMANTIC_WEIGHT = 2.0
# only its first places count: every tool has a cosine, and far down its order is noise
SEMANTIC_DEPTH = 20
# a request that names a server ("on GitHub", "my slack") lifts that server's tools by as much as a
# first place in one ranking: enough to pass another server's near-equal tool, not a far better one
SERVER_BONUS = 1.0 / FUSION_K
# a server's name's word names it only when at most this share of the other servers' tools say it
# ("github", "slack" do; "search" of brave-search, "time", "fetch" are ordinary words)
SERVER_RARE = 0.01
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_SEPARATORS = re.compile(r"[_\-./:]+")
_WORD = re.compile(r"[a-z0-9]+")


class MissingExtra(RuntimeError):
    """Search needs `bm25s`, `PyStemmer` and `wordllama`, the optional extra `cellblock[search]`."""


@dataclass(frozen=True)
class Entry:
    """A tool as search sees it: its exposed name and what it says of itself."""

    name: str
    server: str
    title: str = ""
    description: str = ""
    parameters: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()  # "read only", "destructive", ... as words


@dataclass(frozen=True)
class Match:
    name: str
    score: float
    why: str  # the request's words the tool's name or description holds, in one line


@cache
def _data() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((Path(__file__).parent / "words.json").read_text(encoding="utf-8"))
    return loaded


@cache
def words() -> dict[str, tuple[str, ...]]:
    """The thesaurus: a request's word -> the words tools are described in."""
    return {word: tuple(found) for word, found in _data()["words"].items()}


@cache
def stop_words() -> frozenset[str]:
    """Words a request is made of that say nothing of what it asks for ("the", "my", "please")."""
    return frozenset(_data()["stop"])


def split_words(text: str) -> list[str]:
    """`text` as lowercase words, names split where they join them (`getFileInfo`, `git_status`)."""
    return _WORD.findall(_SEPARATORS.sub(" ", _CAMEL.sub(" ", text)).lower())


class Index:
    """The tools a client may call, ranked for a request (`find`)."""

    def __init__(self, entries: Sequence[Entry], meaning: bool = True) -> None:
        """`meaning=False`: the lexical rankings alone (the benchmark's and the tests' control)."""
        bm25s, stemmer = _extra(semantic.model if meaning else None)  # the embeddings: once per process
        logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs each index it builds
        self._bm25 = bm25s
        self._stem = stemmer.Stemmer("english").stemWord
        self.entries = tuple(entries)
        self._np = np = importlib.import_module("numpy")  # bm25s's own dependency
        self._everyone = np.ones(len(self.entries), dtype=bool)
        self._servers_of = np.array([e.server for e in self.entries], dtype=object)
        self._name_places = np.empty(len(self.entries), dtype=np.int64)  # each entry's place by name
        self._name_places[sorted(range(len(self.entries)), key=lambda i: self.entries[i].name)] = np.arange(
            len(self.entries)
        )
        full = [self._terms(_full_text(e)) for e in self.entries]
        names = [self._terms(" ".join((e.name, e.server, e.title))) for e in self.entries]
        self._said = [set(terms) for terms in full]
        self._servers = self._server_words()
        self._full, self._names = self._ranking(full), self._ranking(names)
        self._meaning = (
            semantic.Semantic([semantic.short_text(split_words(e.name), e.title, e.description) for e in self.entries])
            if meaning
            else None
        )

    def _server_words(self) -> dict[str, set[str]]:
        """A server's name's words (stemmed) -> the servers they name, when other servers' tools
        rarely say them: "github" names a server, "search" (of brave-search) does not."""
        counts: dict[str, int] = {}
        for said in self._said:
            for term in said:
                counts[term] = counts.get(term, 0) + 1
        servers: dict[str, list[int]] = {}
        for i, e in enumerate(self.entries):
            servers.setdefault(e.server, []).append(i)
        named: dict[str, set[str]] = {}
        for server, members in servers.items():
            others = len(self.entries) - len(members)
            for term in self._terms(server):
                own = sum(term in self._said[i] for i in members)
                if counts.get(term, 0) - own <= SERVER_RARE * others:
                    named.setdefault(term, set()).add(server)
        return named

    def _terms(self, text: str) -> list[str]:
        return [self._stem(w) for w in split_words(text) if w not in stop_words()]

    def _ranking(self, corpus: list[list[str]]) -> Any:
        if not any(corpus):
            return None
        ranking = self._bm25.BM25()
        # an empty document still takes its place, so that positions stay the entries'
        ranking.index([terms or ["\x00"] for terms in corpus], show_progress=False)
        return ranking

    def query_terms(self, query: str) -> tuple[list[str], list[str]]:
        """The request's own terms, and those the thesaurus adds."""
        asked = _asked(query)
        own = [self._stem(w) for w in asked]
        added = [self._stem(x) for w in asked for found in words().get(w, ()) for x in split_words(found)]
        return own, [t for t in dict.fromkeys(added) if t not in own]

    def find(self, query: str, limit: int = 5, server: str | None = None) -> list[Match]:
        """The tools that best answer `query`, best first, at most `limit`; only `server`'s if given."""
        np = self._np
        own, added = self.query_terms(query)
        allowed = self._everyone if server is None else self._servers_of == server
        if not own or not allowed.any():
            return []
        # each ranking adds 1 / (FUSION_K + its place) to what it ranks (its weight times that),
        # over arrays: a loop in Python over 2,000 tools was most of a search's time
        fused, ranked = np.zeros(len(self.entries)), np.zeros(len(self.entries), dtype=bool)
        for ranking, terms in ((self._full, own + added), (self._names, own + own + added)):
            order = self._ranked(ranking, terms, allowed)
            fused[order] += 1.0 / (FUSION_K + np.arange(len(order)))
            ranked[order] = True
        if self._meaning is not None:
            # the request as it asks, with the thesaurus's words: the embeddings are of whole words
            asked = _asked(query)
            text = " ".join([*asked, *(found for w in asked for found in words().get(w, ()))])
            order = np.asarray(self._meaning.ranked(text, np.flatnonzero(allowed), SEMANTIC_DEPTH), dtype=np.int64)
            fused[order] += SEMANTIC_WEIGHT / (FUSION_K + np.arange(len(order)))
            ranked[order] = True
        named = self.named(query)
        if named:
            fused[ranked & np.isin(self._servers_of, sorted(named))] += SERVER_BONUS
        found = np.flatnonzero(ranked)
        # best first; among equals, by name
        best = found[np.lexsort((self._name_places[found], -fused[found]))][:limit]
        return [Match(self.entries[i].name, round(float(fused[i]), 6), self._why(i, own, added)) for i in best]

    def named(self, query: str) -> set[str]:
        """The servers `query` names, by its words taken whole: "GitHub" names github, not git."""
        whole = _WORD.findall(_SEPARATORS.sub(" ", query).lower())
        terms = {self._stem(w) for w in whole if w not in stop_words()}
        return {server for term in terms for server in self._servers.get(term, ())}

    def _ranked(self, ranking: Any, terms: list[str], allowed: Any) -> Any:
        """The entries `ranking` scores above nothing for `terms`, best first, among `allowed` (a mask)."""
        if ranking is None:
            return self._np.zeros(0, dtype=self._np.int64)
        scores = ranking.get_scores(terms)
        kept = self._np.flatnonzero((scores > 0) & allowed)
        return kept[self._np.argsort(-scores[kept], kind="stable")]

    def _why(self, i: int, own: list[str], added: list[str]) -> str:
        said = self._said[i]
        hits = [t for t in own if t in said]
        near = [t for t in added if t in said]
        parts = [f"it says {', '.join(dict.fromkeys(hits))}"] if hits else []
        if near:
            parts.append(f"near your words: {', '.join(dict.fromkeys(near))}")
        return "; ".join(parts) or "its name or description is nearest in meaning"


def require() -> None:
    """Raises MissingExtra unless search can run; loads nothing (the embeddings wait for the
    first search)."""
    _extra(semantic.require)


def _extra(check: Callable[[], object] | None) -> tuple[Any, Any]:
    """bm25s and PyStemmer, and `check` of the embeddings passed; else MissingExtra, saying what to do."""
    try:
        bm25s, stemmer = (importlib.import_module(name) for name in ("bm25s", "Stemmer"))
        if check is not None:
            check()
    except ImportError as exc:
        raise MissingExtra(
            f"tool search needs the optional packages of cellblock[search] ({exc.name} is missing): "
            "pip install 'cellblock[search]', or set catalog.search: off"
        ) from exc
    return bm25s, stemmer


def _asked(query: str) -> list[str]:
    return [w for w in split_words(query) if w not in stop_words()]


def _full_text(entry: Entry) -> str:
    return " ".join(
        (entry.name, entry.name, entry.server, entry.title, entry.description, *entry.parameters, *entry.hints)
    )
