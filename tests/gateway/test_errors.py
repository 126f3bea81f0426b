"""An exception in one short line: a ValidationError's count (and first error), never its input."""

from __future__ import annotations

import mcp.types as types
import pytest
from pydantic import ValidationError

from cellblock.gateway.errors import MAX_CHARS, first_line


def invalid(result: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        types.CallToolResult.model_validate(result)
    return caught.value


def test_a_validation_error_is_its_count_and_first_error_without_the_input() -> None:
    error = invalid({"content": [], "isError": "SECRET-INPUT"})
    assert "SECRET-INPUT" in str(error)  # pydantic's own text shows it
    told = first_line(error)
    assert told == "1 validation error for CallToolResult; first: isError: " + error.errors()[0]["msg"], told


def test_many_validation_errors_are_only_counted() -> None:
    told = first_line(invalid({"content": [{"type": "bogus"}] * 1000}))
    assert told == "13000 validation errors for CallToolResult", told


def test_other_errors_are_their_first_line_cut_short_or_their_type() -> None:
    assert first_line(ValueError("first\nsecond")) == "first"
    assert len(first_line(ValueError("x" * 10_000))) == MAX_CHARS
    assert first_line(ValueError()) == "ValueError"
