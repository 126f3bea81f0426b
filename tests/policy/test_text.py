"""`cut`: the one way a long text is shortened for a human (errors, the audit's lines, the dashboard)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from cellblock.policy.text import cut


def test_a_text_within_the_limit_is_kept_whole() -> None:
    assert cut("", 5) == "" and cut("abcde", 5) == "abcde"


def test_a_longer_text_ends_in_an_ellipsis_where_it_was_cut() -> None:
    assert cut("abcdef", 5) == "abcd…"


@given(st.text(), st.integers(min_value=1, max_value=50))
def test_a_cut_text_is_never_longer_than_the_limit_and_begins_as_the_text(text: str, limit: int) -> None:
    shown = cut(text, limit)
    assert len(shown) <= limit and text.startswith(shown.removesuffix("…"))
