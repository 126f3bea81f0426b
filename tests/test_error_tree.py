"""The error tree in `cellblock/policy/errors.py`'s docstring is the real one: every subclass of
`CellblockError` in the code, under its parent, in its module, and nothing else."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import cellblock.policy.errors

ROOT = Path(cellblock.policy.errors.__file__).resolve().parents[1]  # the cellblock package
LINE = re.compile(r"^    (?P<indent>[│ ]*)[├└]── (?P<name>\w+)\s+\((?P<module>[\w.]+)\)")


def documented() -> set[tuple[str, str, str]]:
    """(name, parent, module) of each error the docstring's tree shows."""
    tree: set[tuple[str, str, str]] = set()
    parents = ["CellblockError"]
    for line in (cellblock.policy.errors.__doc__ or "").splitlines():
        found = LINE.match(line)
        if found is None:
            continue
        depth = len(found["indent"]) // 4 + 1
        del parents[depth:]
        tree.add((found["name"], parents[-1], found["module"]))
        parents.append(found["name"])
    return tree


def in_the_code() -> set[tuple[str, str, str]]:
    """(name, parent, module) of each class in cellblock/ that derives from CellblockError."""
    classes: list[tuple[str, list[str], str]] = []
    for path in sorted(ROOT.rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                bases = [
                    b.id if isinstance(b, ast.Name) else b.attr
                    for b in node.bases
                    if isinstance(b, ast.Name | ast.Attribute)
                ]
                classes.append((node.name, bases, module))
    family = {"CellblockError"}
    found: set[tuple[str, str, str]] = set()
    while True:
        more = {(name, base, module) for name, bases, module in classes for base in bases if base in family}
        if more <= found:
            return found
        found |= more
        family |= {name for name, _, _ in more}


def test_the_error_tree_is_the_code_s() -> None:
    shown, real = documented(), in_the_code()
    assert len(shown) >= 10  # the parser read the tree
    assert shown == real, f"in the docstring only: {sorted(shown - real)}; in the code only: {sorted(real - shown)}"
