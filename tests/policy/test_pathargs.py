"""Which arguments name a path in the home, and what sharing one grants (policy/pathargs.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cellblock.policy.pathargs import Grant, Kind, PathArgument, covered, grant_for, path_arguments, shared

HOME = "/home/u"


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ("~/notes/x.txt", "/home/u/notes/x.txt"),
        ("~", "/home/u"),
        ("/home/u/notes/x.txt", "/home/u/notes/x.txt"),
        ("/home/u/notes/../.ssh/id_rsa", "/home/u/.ssh/id_rsa"),  # judged as the user reads it
        ("//home/u//notes/./x", "/home/u/notes/x"),
        ("file:///home/u/My%20Notes/x.md", "/home/u/My Notes/x.md"),
        ("file://localhost/home/u/x", "/home/u/x"),
    ],
)
def test_a_whole_path_in_the_home_is_a_path_argument(value: str, path: str) -> None:
    assert path_arguments({"path": value}, HOME) == [PathArgument("path", value, path)]


@pytest.mark.parametrize(
    "value",
    [
        "notes/x.txt",  # relative: the jail decides
        "/etc/hosts",  # outside the home: the jail shows the system read-only, or nothing
        "/tmp/x",
        "/home/u2/x",  # another home, not under this one
        "/home/u/../u2/x",
        "see ~/notes/x.txt",  # prose, never a grant
        "~user/x",
        "file://host/home/u/x",
        "file:///home/u/x?q=1",
        "/home/u/x\ny",
        "https://example.com/home/u",
        "/home/u/" + "x" * 5000,
    ],
)
def test_what_is_not_a_whole_path_in_the_home_is_not_asked_about(value: str) -> None:
    assert path_arguments({"text": value}, HOME) == []


def test_paths_are_found_in_lists_and_objects_each_once() -> None:
    found = path_arguments({"files": ["~/a", "/home/u/a"], "options": {"dest": "~/b/c"}, "n": 3}, HOME)
    assert found == [PathArgument("files[0]", "~/a", "/home/u/a"), PathArgument("options.dest", "~/b/c", "/home/u/b/c")]


def test_the_search_is_bounded_in_depth() -> None:
    deep: object = "~/deep"
    for _ in range(10):
        deep = [deep]
    assert path_arguments({"x": deep}, HOME) == []


def test_a_path_under_a_grant_is_shared_and_one_beside_it_is_not() -> None:
    assert shared("/home/u/notes/x", ["/home/u/notes"])
    assert shared("/home/u/notes", ["/home/u/notes/"])
    assert not shared("/home/u/notes2/x", ["/home/u/notes"])
    assert not shared("/home/u/x", [])


def world(dirs: set[str], files: frozenset[str] = frozenset()) -> Callable[[str], Kind]:
    def kind_of(path: str) -> Kind:
        return "dir" if path in dirs else "file" if path in files else None

    return kind_of


def test_a_tool_that_writes_is_shared_the_folder_and_it_is_made_when_missing() -> None:
    kind = world({HOME, "/home/u/notes"})
    assert grant_for("/home/u/notes/x.txt", HOME, True, kind) == Grant("/home/u/notes", True)
    assert grant_for("/home/u/new/x.txt", HOME, True, kind) == Grant("/home/u/new", True, "dir")
    assert grant_for("/home/u/notes", HOME, True, kind) == Grant("/home/u/notes", True)


def test_a_file_in_the_home_itself_is_shared_alone_never_the_home() -> None:
    kind = world({HOME}, frozenset({"/home/u/todo.txt"}))
    assert grant_for("/home/u/todo.txt", HOME, True, kind) == Grant("/home/u/todo.txt", True)
    assert grant_for("/home/u/new.db", HOME, True, kind) == Grant("/home/u/new.db", True, "file")
    assert grant_for(HOME, HOME, True, kind) == Grant(HOME, True)  # the gate refuses it


def test_a_tool_that_only_reads_is_shared_what_it_reads_read_only_and_nothing_missing() -> None:
    kind = world({HOME, "/home/u/notes"}, frozenset({"/home/u/notes/x.txt"}))
    assert grant_for("/home/u/notes/x.txt", HOME, False, kind) == Grant("/home/u/notes/x.txt", False)
    assert grant_for("/home/u/notes/y.txt", HOME, False, kind) is None


@pytest.mark.parametrize(
    ("path", "write", "expected"),
    [
        ("/h/notes/a", True, True),
        ("/h/notes/ro", True, False),  # the deeper read-only grant wins in the jail
        ("/h/notes/ro/x", True, False),
        ("/h/notes/ro", False, True),
        ("/h/both", True, True),  # the same path in both: the read-write mount comes last
        ("/h/docs", True, False),
        ("/h/docs", False, True),
        ("/h/other", False, False),
    ],
)
def test_a_path_is_covered_as_the_deepest_grant_holding_it_shares_it(path: str, write: bool, expected: bool) -> None:
    read_only, read_write = ["/h/notes/ro", "/h/docs", "/h/both"], ["/h/notes", "/h/both/"]
    assert covered(path, read_only, read_write, write) is expected
