"""A ranking by meaning, beside the two lexical ones: static word embeddings, averaged.

A request and a tool's short text (its name's words, title and the first sentence of its
description) are each the mean of their tokens' vectors; a tool ranks by the cosine of the two.
Where BM25 needs a shared word, this finds "erase" near "delete" and "bibtex" near "citations".

The vectors are WordLlama's (the `wordllama` package, MIT: 32,000 tokens x 256 dimensions,
distilled from Llama 2's token embeddings), read from the files inside its wheel: the
safetensors table and the tokenizer's JSON. Its own loader is not used: it imports `requests`,
looks for the tokenizer in a folder its wheel does not have and then downloads it, and sets the
root logger's level on import. Here nothing is downloaded: the files are opened from the
installed package, or the extra counts as missing. The table is loaded once per process
(`model`), shared by every index; an index keeps only its tools' vectors.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PACKAGE", "Model", "Semantic", "model", "require", "reset", "short_text"]

PACKAGE = "wordllama"
TABLE = ("weights", "l2_supercat_256.safetensors")
TOKENIZER = ("tokenizers", "l2_supercat_tokenizer_config.json")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
_FIRST_SENTENCE_MAX = 300  # a description without a full stop is cut here

_lock = threading.Lock()
_model: Model | None = None


@dataclass(frozen=True)
class Model:
    """The token table and the tokenizer that cuts text into its tokens."""

    numpy: Any
    table: Any  # (tokens, dimensions), float16 as shipped: half the memory, averaged in float32
    tokenizer: Any

    def embed(self, texts: Sequence[str]) -> Any:
        """Each text as the unit-length mean of its tokens' vectors (zero for a text of none)."""
        np = self.numpy
        vectors = np.zeros((len(texts), self.table.shape[1]), dtype=np.float32)
        if len(texts) == 1:  # a request: encode_batch would hand one text to its thread pool
            tokens = [self.tokenizer.encode(texts[0], add_special_tokens=False).ids]
        else:
            tokens = [encoded.ids for encoded in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]
        rows = [row for row, ids in enumerate(tokens) if ids]
        if rows:  # one gather and one sum per text, all at once (a loop would take 2,000 tools 40 ms)
            starts = np.cumsum([0] + [len(tokens[row]) for row in rows[:-1]])
            gathered = self.table[np.concatenate([tokens[row] for row in rows])]
            # a sum, in float32: the norm below makes it a mean
            vectors[rows] = np.add.reduceat(gathered, starts, axis=0, dtype=np.float32)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        return vectors / np.where(norms > 0, norms, 1.0)


def model() -> Model:
    """The embeddings, loaded at the first call of the process. Raises ImportError (the extra is
    missing) when the package, one of its files, `tokenizers` or `safetensors` is not installed."""
    global _model
    with _lock:
        if _model is None:
            _model = _load()
        return _model


def reset() -> None:
    """Forget the loaded embeddings: the next `model()` loads them anew (the benchmark times it)."""
    global _model
    with _lock:
        _model = None


def require() -> tuple[Path, Path]:
    """The paths of the table and the tokenizer, found without loading them (a gateway checks
    at start that search can run, and loads the embeddings at the first search). Raises
    ModuleNotFoundError (the extra is missing) as `model` would."""
    # find_spec locates the package without running it (its __init__ imports requests and
    # configures logging); only its two data files are read
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"No module named {PACKAGE!r}", name=PACKAGE)
    folder = Path(next(iter(spec.submodule_search_locations)))
    table_path, tokenizer_path = folder.joinpath(*TABLE), folder.joinpath(*TOKENIZER)
    for path in (table_path, tokenizer_path):
        if not path.is_file():  # another release that moved or dropped its files: never fetched
            raise ModuleNotFoundError(f"{PACKAGE} has no {path.name}", name=PACKAGE)
    for name in ("numpy", "safetensors", "tokenizers"):
        if importlib.util.find_spec(name) is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    return table_path, tokenizer_path


def _load() -> Model:
    table_path, tokenizer_path = require()
    numpy, safetensors, tokenizers = (importlib.import_module(name) for name in ("numpy", "safetensors", "tokenizers"))
    with safetensors.safe_open(str(table_path), framework="np") as weights:  # the one tensor, no second copy
        table = weights.get_tensor("embedding.weight")
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_path))
    tokenizer.no_padding()  # one text at a time is averaged: no pad token may join it
    tokenizer.no_truncation()
    return Model(numpy, table, tokenizer)


def short_text(name_words: Sequence[str], title: str, description: str) -> str:
    """What a tool is embedded as: its name's words, title and first sentence. The rest of a
    description (arguments, caveats, examples) pulls the mean away from what the tool does."""
    text = description.strip()
    end = _SENTENCE_END.search(text)
    first = text[: end.start()] if end else text[:_FIRST_SENTENCE_MAX]
    return ". ".join(part for part in (" ".join(name_words), title, first) if part)


class Semantic:
    """The tools' vectors, and the ranking of a request's vector against them."""

    def __init__(self, texts: Sequence[str]) -> None:
        self.model = model()
        self.vectors = self.model.embed(texts)

    def ranked(self, text: str, allowed: Sequence[int], depth: int) -> list[int]:
        """The `depth` entries among `allowed` nearest to `text`, nearest first."""
        if not text.strip() or len(allowed) == 0:
            return []
        np = self.model.numpy
        query = self.model.embed([text])[0]
        if not query.any():
            return []
        among = np.asarray(allowed)
        # all of them, then the allowed (no copy of the vectors); einsum, not BLAS's threads, which
        # on a busy machine made a search of 2,000 tools wait 8 ms instead of 0.1
        scores = np.einsum("ij,j->i", self.vectors, query)[among]
        # the first `depth` without sorting them all (2,000 tools), then those few in order
        top = np.argpartition(-scores, depth)[:depth] if len(among) > depth else np.arange(len(among))
        best = top[np.argsort(-scores[top], kind="stable")]
        return [int(among[i]) for i in best]
