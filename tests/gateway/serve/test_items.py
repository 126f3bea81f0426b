"""Where a resource read stands against the lock: listed, held, or outside the catalog."""

from __future__ import annotations

import pytest

from cellblock.gateway.downstream.listing import Listing
from cellblock.gateway.serve import items
from cellblock.gateway.serve.items import Standing, resource_standing, template_standing
from cellblock.policy.templates import template_matches

LISTING = Listing.load(
    {
        "resources": [{"uri": "note://a", "name": "a"}, {"uri": "note://new", "name": "new"}],
        "templates": [{"uriTemplate": "note://{title}", "name": "note"}, {"uriTemplate": "item://{id}", "name": "i"}],
    }
)
# approved at the last review: note://a and the note template; note://new and item://{id} came later
APPROVED = frozenset({"resource:note://a", "template:note://{title}"})


def test_a_resource_added_since_approval_is_held_even_where_an_approved_template_covers_its_uri() -> None:
    assert resource_standing(LISTING, APPROVED, "note://new") is Standing.HELD
    assert resource_standing(LISTING, APPROVED, "note://a") is Standing.LISTED


def test_a_uri_from_a_held_template_is_held_and_one_from_an_approved_template_is_listed() -> None:
    assert resource_standing(LISTING, APPROVED, "item://7") is Standing.HELD
    assert resource_standing(LISTING, APPROVED, "note://b") is Standing.LISTED
    assert template_standing(LISTING, APPROVED, "item://{id}") is Standing.HELD
    assert template_standing(LISTING, APPROVED, "note://{title}") is Standing.LISTED


def test_nothing_is_listed_before_the_first_review_and_a_uri_nothing_covers_is_unlisted() -> None:
    assert resource_standing(LISTING, frozenset(), "note://a") is Standing.HELD
    assert template_standing(LISTING, frozenset(), "note://{title}") is Standing.HELD
    assert resource_standing(LISTING, APPROVED, "file:///etc/passwd") is Standing.UNLISTED
    assert resource_standing(None, None, "note://a") is Standing.UNLISTED
    # without a lock every listed item is listed
    assert resource_standing(LISTING, None, "item://7") is Standing.LISTED


def test_the_first_approved_template_that_covers_a_uri_settles_it_and_held_ones_are_not_matched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listing = Listing.load(
        {
            "templates": [
                {"uriTemplate": "h://{+v0}{+v1}!", "name": "evil"},  # held: came after the review
                {"uriTemplate": "h://item/{id}", "name": "item"},
            ]
        }
    )
    approved = frozenset({"template:h://item/{id}"})
    tried: list[str] = []

    def matches(template: str, uri: str) -> bool:
        tried.append(template)
        return template_matches(template, uri)

    monkeypatch.setattr(items, "template_matches", matches)
    assert resource_standing(listing, approved, "h://item/7") is Standing.LISTED
    assert tried == ["h://item/{id}"]
    # control: a URI only the held template covers is matched against both, and held
    assert resource_standing(listing, approved, "h://x!") is Standing.HELD
    assert tried[1:] == ["h://item/{id}", "h://{+v0}{+v1}!"]
