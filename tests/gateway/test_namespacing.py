"""Exposed names and resource URIs (cellblock.gateway.namespacing)."""

from __future__ import annotations

import hashlib
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellblock.gateway.namespacing import (
    MAX_LENGTH_DEFAULT,
    SEPARATOR_DEFAULT,
    Collision,
    NameTable,
    UriTable,
    assign_names,
    expose_uri,
    route_uri,
    template_pattern,
)

VALID_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def h(server: str, original: str) -> str:
    """The spec's hash, computed independently of the module."""
    return hashlib.sha256(f"{server}\x00{original}".encode()).hexdigest()


def plain(server: str, original: str, separator: str = SEPARATOR_DEFAULT) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", f"{server}{separator}{original}")


def hashed(server: str, original: str, max_length: int, separator: str = SEPARATOR_DEFAULT) -> str:
    return f"{plain(server, original, separator)[: max_length - 9]}_{h(server, original)[:8]}"


def exposed(table: NameTable, server: str, original: str) -> str:
    return table.by_original[(server, original)]


def check_table(table: NameTable, pairs: set[tuple[str, str]], max_length: int) -> None:
    """The invariants every table must satisfy."""
    assert set(table.by_original) == pairs
    assert len(table.by_exposed) == len(pairs)  # unique: no two pairs share an exposed name
    for name, pair in table.by_exposed.items():
        assert VALID_NAME.fullmatch(name), name
        assert len(name) <= max_length, name
        assert table.by_original[pair] == name
    for pair, name in table.by_original.items():
        assert table.by_exposed[name] == pair
    assert list(table.by_exposed) == sorted(table.by_exposed)


# --- defaults and plain names -----------------------------------------------------------------


def test_defaults_match_the_design() -> None:
    assert SEPARATOR_DEFAULT == "__"
    assert MAX_LENGTH_DEFAULT == 64


def test_plain_name_is_server_then_separator_then_tool() -> None:
    table = assign_names([("files", "read_file")])
    assert dict(table.by_exposed) == {"files__read_file": ("files", "read_file")}
    assert table.collisions == ()


def test_custom_separator_is_used() -> None:
    table = assign_names([("files", "read")], separator="-X-")
    assert exposed(table, "files", "read") == "files-X-read"


def test_dotted_tool_name_is_sanitized() -> None:
    table = assign_names([("git", "repo.status")])
    assert exposed(table, "git", "repo.status") == "git__repo_status"


def test_every_character_outside_the_safe_set_becomes_an_underscore() -> None:
    table = assign_names([("web", "a b:c/d.e@fé€😀\x00")])
    assert exposed(table, "web", "a b:c/d.e@fé€😀\x00") == "web__a_b_c_d_e_f____"


def test_letters_digits_underscore_and_hyphen_are_kept() -> None:
    table = assign_names([("web", "Fetch-URL_2")])
    assert exposed(table, "web", "Fetch-URL_2") == "web__Fetch-URL_2"


def test_empty_tool_name_still_gets_a_valid_name() -> None:
    table = assign_names([("web", "")])
    assert exposed(table, "web", "") == "web__"


def test_duplicate_pairs_are_ignored() -> None:
    table = assign_names([("web", "fetch"), ("web", "fetch"), ("web", "fetch")])
    assert dict(table.by_original) == {("web", "fetch"): "web__fetch"}
    assert table.collisions == ()


def test_same_tool_name_on_two_servers_gets_two_names() -> None:
    table = assign_names([("a", "search"), ("b", "search")])
    assert set(table.by_exposed) == {"a__search", "b__search"}
    assert table.collisions == ()


def test_no_items_give_an_empty_table() -> None:
    table = assign_names([])
    assert dict(table.by_exposed) == {}
    assert dict(table.by_original) == {}
    assert table.collisions == ()


# --- shortening -------------------------------------------------------------------------------


def test_name_at_max_length_is_not_shortened() -> None:
    original = "x" * (64 - len("files__"))
    table = assign_names([("files", original)])
    assert exposed(table, "files", original) == f"files__{original}"


def test_long_name_is_shortened_to_exactly_max_length_with_a_hash_suffix() -> None:
    original = "x" * 100
    name = exposed(assign_names([("files", original)]), "files", original)
    assert len(name) == 64
    assert name == f"files__{'x' * 48}_{h('files', original)[:8]}"


def test_shortened_name_is_a_fixed_value_across_releases() -> None:
    # Clients store permissions by name; a change here silently revokes them. Update only on purpose.
    original = "get_the_current_weather_forecast_for_a_given_city_and_country_code"
    table = assign_names([("weather", original)])
    assert exposed(table, "weather", original) == "weather__get_the_current_weather_forecast_for_a_given_c_8ecbd7c7"


def test_shortening_is_deterministic() -> None:
    original = "very_long_" * 20
    first = assign_names([("files", original)])
    second = assign_names([("other", "x"), ("files", original)])
    assert exposed(first, "files", original) == exposed(second, "files", original)


def test_long_names_sharing_a_prefix_get_different_names() -> None:
    a, b = "p" * 80 + "_alpha", "p" * 80 + "_beta"
    table = assign_names([("files", a), ("files", b)])
    assert exposed(table, "files", a) != exposed(table, "files", b)
    assert table.collisions == ()  # the hash tells them apart; nothing was renamed twice


def test_shortening_respects_a_small_max_length() -> None:
    original = "read_file_with_options"
    name = exposed(assign_names([("files", original)], max_length=16), "files", original)
    assert name == f"files___{h('files', original)[:8]}"
    assert len(name) == 16


def test_shortened_names_still_start_with_a_letter_at_the_minimum_length() -> None:
    server = "a" + "-" * 23
    table = assign_names([(server, "tool"), (server, "tool.x"), (server, "tool_x")], max_length=16)
    check_table(table, {(server, "tool"), (server, "tool.x"), (server, "tool_x")}, 16)


def test_a_shortened_name_is_not_reported_as_a_collision() -> None:
    assert assign_names([("files", "x" * 200)]).collisions == ()


# --- collisions -------------------------------------------------------------------------------


def test_verbatim_name_keeps_the_plain_form_over_a_sanitized_one() -> None:
    # "a.b" sorts before "a_b", but "a_b" is what its author actually wrote.
    table = assign_names([("s", "a.b"), ("s", "a_b")])
    assert exposed(table, "s", "a_b") == "s__a_b"
    assert exposed(table, "s", "a.b") == hashed("s", "a.b", 64)


def test_when_no_name_is_verbatim_the_smallest_pair_keeps_the_plain_form() -> None:
    table = assign_names([("s", "a:b"), ("s", "a.b"), ("s", "a b")])
    assert exposed(table, "s", "a b") == "s__a_b"  # " " < "." < ":"
    assert exposed(table, "s", "a.b") == hashed("s", "a.b", 64)
    assert exposed(table, "s", "a:b") == hashed("s", "a:b", 64)


def test_a_separator_a_server_name_could_hold_is_refused() -> None:
    # With "-" as separator, server "a-b" + tool "c" and server "a" + tool "b-c" would both be
    # "a-b-c": one server's tool would take the other's name.
    with pytest.raises(ValueError, match="could be part of a server name"):
        assign_names([("a-b", "c"), ("a", "b-c")], separator="-")


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.from_regex(r"[a-z][a-z0-9-]{0,6}", fullmatch=True), st.from_regex(r"[a-zA-Z0-9_.-]{1,8}", fullmatch=True)
        ),
        max_size=12,
    ),
    st.sampled_from(["__", "_", "-_", "X", "_-_"]),
)
def test_with_an_accepted_separator_servers_never_collide(pairs: list[tuple[str, str]], separator: str) -> None:
    # Whatever the tool names, two servers never want the same plain name: only names of one server
    # (sanitized alike) can collide, and those are that server's own.
    table = assign_names(pairs, separator=separator)
    for collision in table.collisions:
        rivals = [pair for pair, name in table.by_original.items() if name == collision.wanted]
        assert [server for server, _ in rivals] == [collision.server]


def test_a_verbatim_name_beats_a_long_name_whose_shortened_form_it_equals() -> None:
    long = "x" * 100
    squatter = hashed("files", long, 64).removeprefix("files__")
    table = assign_names([("files", long), ("files", squatter)])
    assert exposed(table, "files", squatter) == hashed("files", long, 64)
    assert exposed(table, "files", long) == f"files__{'x' * 47}_{h('files', long)[:9]}"
    assert [c.original for c in table.collisions] == [long]


def test_each_renamed_name_is_reported_once() -> None:
    table = assign_names([("s", "a.b"), ("s", "a_b"), ("s", "a:b"), ("s", "ok")])
    assert table.collisions == (
        Collision(exposed=hashed("s", "a.b", 64), server="s", original="a.b", wanted="s__a_b"),
        Collision(exposed=hashed("s", "a:b", 64), server="s", original="a:b", wanted="s__a_b"),
    )


def test_collision_report_reads_as_a_sentence_naming_everything() -> None:
    (collision,) = assign_names([("s", "a.b"), ("s", "a_b")]).collisions
    text = str(collision)
    for part in ("'s'", "'a.b'", "'s__a_b'", repr(collision.exposed)):
        assert part in text
    assert "\n" not in text


def test_hash_form_grows_when_it_is_already_taken() -> None:
    # A tool literally named like the loser's hash form keeps it; the loser takes a longer hash.
    squatter = hashed("s", "a.b", 64).removeprefix("s__")
    table = assign_names([("s", "a.b"), ("s", "a_b"), ("s", squatter)])
    assert exposed(table, "s", squatter) == hashed("s", "a.b", 64)
    assert exposed(table, "s", "a.b") == f"s__a_b_{h('s', 'a.b')[:9]}"
    check_table(table, {("s", "a.b"), ("s", "a_b"), ("s", squatter)}, 64)


def test_assignment_terminates_when_every_hash_form_is_occupied() -> None:
    # At max_length 16 a loser has hash forms with 8..14 hex digits; occupy all of them.
    max_length, digest, base = 16, h("s", "a.b"), plain("s", "a.b", "_")
    forms = [f"{base[: max_length - 1 - k]}_{digest[:k]}" for k in range(8, 15)]
    squatters = [form.removeprefix("s_") for form in forms]
    pairs = {("s", "a.b"), ("s", "a_b"), *(("s", sq) for sq in squatters)}
    table = assign_names(pairs, separator="_", max_length=max_length)
    check_table(table, pairs, max_length)
    assert exposed(table, "s", "a.b") not in forms
    assert [c.original for c in table.collisions] == ["a.b"]


@settings(max_examples=50)
@given(st.permutations([("s", "a.b"), ("s", "a_b"), ("s", "a:b"), ("t", "x"), ("s", "a b"), ("t", "x")]))
def test_collision_resolution_does_not_depend_on_input_order(items: list[tuple[str, str]]) -> None:
    reference = assign_names(sorted(items))
    table = assign_names(items)
    assert dict(table.by_exposed) == dict(reference.by_exposed)
    assert table.collisions == reference.collisions


# --- ordering and immutability ----------------------------------------------------------------


def test_by_exposed_iterates_in_sorted_order() -> None:
    table = assign_names([("zeta", "b"), ("alpha", "z"), ("alpha", "a"), ("mid", "Q")])
    assert list(table.by_exposed) == ["alpha__a", "alpha__z", "mid__Q", "zeta__b"]


def test_by_original_iterates_in_sorted_order() -> None:
    table = assign_names([("zeta", "b"), ("alpha", "z"), ("alpha", "a")])
    assert list(table.by_original) == [("alpha", "a"), ("alpha", "z"), ("zeta", "b")]


def test_table_mappings_are_read_only() -> None:
    table = assign_names([("web", "fetch")])
    with pytest.raises(TypeError):
        table.by_exposed["x"] = ("web", "x")  # type: ignore[index]
    with pytest.raises(TypeError):
        table.by_original[("web", "x")] = "x"  # type: ignore[index]


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("separator", ["", "_____", ".", "a b", "::", "__\n"])
def test_invalid_separator_is_rejected(separator: str) -> None:
    with pytest.raises(ValueError, match="separator"):
        assign_names([("web", "fetch")], separator=separator)


@pytest.mark.parametrize("max_length", [15, 0, -1, True])
def test_max_length_below_sixteen_is_rejected(max_length: int) -> None:
    with pytest.raises(ValueError, match="max_length"):
        assign_names([("web", "fetch")], max_length=max_length)


def test_max_length_of_sixteen_is_accepted() -> None:
    assert exposed(assign_names([("web", "fetch")], max_length=16), "web", "fetch") == "web__fetch"


@pytest.mark.parametrize("server", ["", "Web", "1web", "we_b", "w" * 25, "web\n", "web.x"])
def test_invalid_server_name_is_rejected(server: str) -> None:
    with pytest.raises(ValueError, match="server name"):
        assign_names([(server, "fetch")])


def test_server_name_rule_matches_the_config_rule() -> None:
    from cellblock.gateway import namespacing
    from cellblock.gateway.config import model as config

    assert namespacing._SERVER_NAME.pattern == config.SERVER_NAME.pattern


# --- properties -------------------------------------------------------------------------------

SERVERS = st.sampled_from(["a", "a-b", "ab", "b", "files", "z" + "-9" * 11 + "x"])
# A small alphabet so collisions are frequent; lengths reach past every max_length tried.
NAMES = st.one_of(
    st.text(alphabet="ab._- :é", max_size=6),
    st.text(alphabet="ab._-", min_size=40, max_size=90),
    st.text(max_size=12),
)
PAIRS = st.sets(st.tuples(SERVERS, NAMES), max_size=30)
SEPARATORS = st.sampled_from(["__", "_", "-_", "--X", "X", "_9-Z"])


@settings(max_examples=300)
@given(PAIRS, SEPARATORS, st.integers(min_value=16, max_value=80))
def test_any_set_of_pairs_gets_unique_valid_bounded_inverse_names(
    pairs: set[tuple[str, str]], separator: str, max_length: int
) -> None:
    table = assign_names(pairs, separator=separator, max_length=max_length)
    check_table(table, pairs, max_length)
    renamed = {(c.server, c.original) for c in table.collisions}
    assert len(renamed) == len(table.collisions)
    for c in table.collisions:
        assert table.by_original[(c.server, c.original)] == c.exposed != c.wanted
        assert c.wanted in table.by_exposed  # somebody else holds the name it wanted
    for (server, original), name in table.by_original.items():
        if (server, original) not in renamed:
            want = plain(server, original, separator)
            if len(want) > max_length:
                want = hashed(server, original, max_length, separator)
            assert name == want


@settings(max_examples=100)
@given(PAIRS.map(sorted), st.randoms(use_true_random=False), SEPARATORS)
def test_any_input_order_gives_the_same_table(pairs: list[tuple[str, str]], rnd: random.Random, separator: str) -> None:
    shuffled = list(pairs) * 2
    rnd.shuffle(shuffled)
    expected = assign_names(pairs, separator=separator, max_length=20)
    actual = assign_names(shuffled, separator=separator, max_length=20)
    assert list(actual.by_exposed.items()) == list(expected.by_exposed.items())
    assert list(actual.by_original.items()) == list(expected.by_original.items())
    assert actual.collisions == expected.collisions


# --- resource URIs ----------------------------------------------------------------------------


def test_resource_uri_is_prefixed_with_scheme_and_server() -> None:
    assert expose_uri("files", "file:///home/a.txt") == "cellblock://files/file:///home/a.txt"


def test_exposed_resource_uri_routes_back() -> None:
    assert route_uri("cellblock://files/file:///home/a.txt") == ("files", "file:///home/a.txt")


def test_uri_template_keeps_its_variables() -> None:
    assert expose_uri("files", "file:///{path}") == "cellblock://files/file:///{path}"


def test_client_expanded_template_routes_back() -> None:
    template = expose_uri("gh", "repo://{owner}/{repo}/issues{?state}")
    expanded = template.replace("{owner}", "me").replace("{repo}", "x").replace("{?state}", "?state=open")
    assert route_uri(expanded) == ("gh", "repo://me/x/issues?state=open")


@pytest.mark.parametrize(
    "uri",
    [
        "",
        "/",
        "relative/path",
        "file:///tmp/a b.txt",
        "https://example.com/a?b=c#frag",
        "cellblock://other/nested",
        "x:ünïcødé/😀",
        "data:text/plain;base64,SGk=",
        "a\nb",
        "%2F%7Bpath%7D",
    ],
)
def test_odd_resource_uris_round_trip(uri: str) -> None:
    assert route_uri(expose_uri("files", uri)) == ("files", uri)


def test_uri_scheme_is_matched_case_insensitively() -> None:
    assert route_uri("CellBlock://files/x") == ("files", "x")


def test_an_apps_uri_keeps_its_scheme_with_the_server_inside() -> None:
    # hosts render only ui:// resources: cellblock://clock/ui://... would not be shown at all
    assert expose_uri("clock", "ui://clock/app.html") == "ui://clock/clock/app.html"
    assert route_uri("ui://time/clock/app.html") == ("time", "ui://clock/app.html")
    assert route_uri(expose_uri("time", "UI://x")) == ("time", "UI://x")
    with pytest.raises(ValueError, match="not a Cellblock resource URI"):
        route_uri("ui://clock")  # no server inside: not one the gateway showed


def test_a_server_without_a_prefix_shows_its_app_with_its_name_inside() -> None:
    uris = UriTable.build({"clock"}, [("clock", "ui://face/app.html"), ("clock", "note://1")], [])
    assert uris.expose("clock", "ui://face/app.html") == "ui://clock/face/app.html"
    assert uris.route("ui://clock/face/app.html") == ("clock", "ui://face/app.html")
    assert uris.expose("clock", "note://1") == "note://1"  # control: its other URIs are kept as they are


@pytest.mark.parametrize(
    "uri",
    [
        "file:///home/a.txt",
        "cellblock://files",
        "cellblock:/files/x",
        "cellblock:///x",
        "cellblock://Files/x",
        "cellblock://1files/x",
        "cellblock://fi_les/x",
        "cellblock://" + "f" * 25 + "/x",
        "cellblock://files\n/x",
        " cellblock://files/x",
        "",
    ],
)
def test_uri_not_made_by_cellblock_is_rejected_clearly(uri: str) -> None:
    with pytest.raises(ValueError, match="not a Cellblock resource URI"):
        route_uri(uri)


def test_exposing_a_uri_for_an_invalid_server_is_rejected() -> None:
    with pytest.raises(ValueError, match="server name"):
        expose_uri("Files", "x")


@given(SERVERS, st.text())
def test_any_uri_round_trips(server: str, uri: str) -> None:
    assert route_uri(expose_uri(server, uri)) == (server, uri)


# -- servers without a prefix (`prefix: false`) ------------------------------------------------


def test_a_server_without_a_prefix_keeps_its_own_names_beside_prefixed_ones() -> None:
    table = assign_names([("fs", "read_file"), ("web", "read_file"), ("fs", "a.b")], bare={"fs"})
    assert exposed(table, "fs", "read_file") == "read_file"
    assert exposed(table, "fs", "a.b") == "a_b"  # sanitized like any other name
    assert exposed(table, "web", "read_file") == "web__read_file"
    assert table.collisions == ()
    assert table.by_exposed["read_file"] == ("fs", "read_file")


def test_two_servers_without_a_prefix_offering_one_name_are_told_apart_and_reported() -> None:
    # both also sanitize alike (`a:` and `a.` are `a_`): a fingerprint after `a_` would read as
    # server a's name (`a__1f2e…`), so the losers take their own prefix
    odd = assign_names([("a", "a:"), ("b", "a."), ("b", "a:")], bare={"a", "b"})
    assert [exposed(odd, *p) for p in (("a", "a:"), ("b", "a."), ("b", "a:"))] == [
        "a_",
        "b__a_",
        f"b__a__{h('b', 'a:')[:8]}",
    ]
    pairs = [("alpha", "search"), ("beta", "search")]
    table = assign_names(pairs, bare={"alpha", "beta"})
    assert exposed(table, "alpha", "search") == "search"  # the first server by name keeps it
    loser = exposed(table, "beta", "search")
    assert loser == "beta__search"  # the other takes its own prefix
    [collision] = table.collisions
    assert (collision.server, collision.exposed, collision.wanted) == ("beta", loser, "search")
    assert assign_names(reversed(pairs), bare={"beta", "alpha"}) == table  # order never matters


@pytest.mark.parametrize("name", ["github__delete_repo", "cellblock__approve", "zz-top__x", "git.__x"])
def test_a_name_without_a_prefix_cannot_pass_for_another_servers_or_the_gateways(name: str) -> None:
    # the server `github` exists; `cellblock` is the gateway's own namespace; `zz-top` is no server
    # at all, yet it may be one tomorrow: every such name gets the bare server's own prefix
    table = assign_names([("mal", name), ("github", "delete_repo")], bare={"mal"})
    shown = exposed(table, "mal", name)
    assert shown == plain("mal", name)
    assert exposed(table, "github", "delete_repo") == "github__delete_repo"
    [collision] = table.collisions
    assert collision.server == "mal" and collision.exposed == shown and "reads as a name of server" in str(collision)


def test_control_the_same_name_on_a_prefixed_server_is_its_own() -> None:
    table = assign_names([("mal", "github__delete_repo")])
    assert exposed(table, "mal", "github__delete_repo") == "mal__github__delete_repo"


@given(
    st.lists(
        st.tuples(st.sampled_from(["a", "b", "github", "cellblock"]), st.text(min_size=1, max_size=80)),
        max_size=30,
    ),
    st.sets(st.sampled_from(["a", "b"])),
)
@settings(max_examples=300, deadline=None)
def test_names_stay_unique_safe_and_never_enter_another_namespace(pairs: list[tuple[str, str]], bare: set[str]) -> None:
    table = assign_names(pairs, bare=bare)
    names = list(table.by_original.values())
    assert len(names) == len(set(names))
    for (server, _), name in table.by_original.items():
        assert len(name) <= MAX_LENGTH_DEFAULT and re.fullmatch(r"[A-Za-z0-9_-]+", name)
        prefix = re.match(r"([a-z][a-z0-9-]{0,23})__", name)
        # a name that reads as `<server>__…` is that server's: nobody else's can
        assert prefix is None or prefix.group(1) == server


def test_template_patterns_match_their_expansions_only() -> None:
    assert template_pattern("note://{id}").fullmatch("note://7")
    assert not template_pattern("note://{id}").fullmatch("note://7/8")  # simple expansion has no `/`
    assert template_pattern("file:///{+path}").fullmatch("file:///a/b c")
    assert template_pattern("db://t{?q,n}").fullmatch("db://t?q=1&n=2")
    assert template_pattern("db://t{?q,n}").fullmatch("db://t")
    assert not template_pattern("a.b://{x}").fullmatch("aXb://1")  # literal text is literal


def uri_table() -> UriTable:
    return UriTable.build(
        {"notes", "docs", "fs"},
        [("notes", "note://1"), ("docs", "note://1"), ("docs", "doc://a"), ("web", "https://x/")],
        [("notes", "note://{id}"), ("fs", "file:///{+path}"), ("docs", "file:///docs/{name}"), ("web", "w://{q}")],
    )


def test_uris_of_servers_without_a_prefix_are_shown_as_they_are_and_route_back() -> None:
    uris = uri_table()
    assert uris.expose("docs", "doc://a") == "doc://a" and uris.route("doc://a") == ("docs", "doc://a")
    assert uris.expose_template("notes", "note://{id}") == "note://{id}"
    assert uris.route("note://42") == ("notes", "note://42")  # only `notes` has a template for it
    # a prefixed server's stay wrapped, and the wrapped form routes for every server
    assert uris.expose("web", "https://x/") == "cellblock://web/https://x/"
    assert uris.expose_template("web", "w://{q}") == "cellblock://web/w://{q}"
    assert uris.route("cellblock://docs/doc://a") == ("docs", "doc://a")


def test_a_uri_two_servers_without_a_prefix_claim_goes_to_one_and_the_other_is_wrapped() -> None:
    uris = uri_table()
    # both list note://1: the first by name keeps it; the other's, shown raw, would reach the first
    assert uris.route("note://1") == ("docs", "note://1")
    assert uris.expose("docs", "note://1") == "note://1"
    assert uris.expose("notes", "note://1") == "cellblock://notes/note://1"
    assert uris.route(uris.expose("notes", "note://1")) == ("notes", "note://1")


def test_a_uri_matching_two_servers_templates_is_refused_naming_both() -> None:
    uris = uri_table()
    with pytest.raises(ValueError, match=r"servers docs, fs: read it as cellblock://docs/file:///docs/x or"):
        uris.route("file:///docs/x")
    assert uris.route("file:///etc/hosts") == ("fs", "file:///etc/hosts")
    # a link to such a URI is shown in a form that routes back to the server that gave it
    assert uris.route(uris.expose("fs", "file:///docs/x")) == ("fs", "file:///docs/x")


def test_a_uri_that_routes_nowhere_is_refused_and_a_link_to_it_is_wrapped() -> None:
    uris = uri_table()
    with pytest.raises(ValueError, match="not one a server without a prefix lists"):
        uris.route("other://thing")
    assert uris.expose("notes", "other://thing") == "cellblock://notes/other://thing"


@pytest.mark.parametrize("uri", ["cellblock://fs/file:///x", "CellBlock://web/https://x/"])
def test_a_server_without_a_prefix_cannot_hand_out_uris_in_cellblocks_scheme(uri: str) -> None:
    uris = UriTable.build({"notes"}, [("notes", uri)], [("notes", uri + "{x}")])
    assert uris.expose("notes", uri) == f"cellblock://notes/{uri}"
    assert uris.expose_template("notes", uri + "{x}") == f"cellblock://notes/{uri}{{x}}"
    assert uris.route(uris.expose("notes", uri)) == ("notes", uri)


@given(st.text(min_size=1), st.sampled_from(["notes", "docs", "fs", "web"]))
@settings(max_examples=300, deadline=None)
def test_whatever_a_server_hands_out_routes_back_to_it(uri: str, server: str) -> None:
    uris = uri_table()
    assert uris.route(uris.expose(server, uri)) == (server, uri)


@pytest.mark.parametrize("name", ["CellbIock__status", "cellblock_review", "Ce11block__review", "ask-\u0441ellblock"])
def test_a_bare_name_that_reads_as_cellblocks_gets_its_servers_prefix(name: str) -> None:
    table = assign_names([("mal", name), ("mal", "status")], bare={"mal"})
    assert exposed(table, "mal", name) == plain("mal", name)
    [collision] = table.collisions
    assert collision.server == "mal" and "reads as one of Cellblock's own" in str(collision)
    assert exposed(table, "mal", "status") == "status"  # the control: a plain bare name is kept
