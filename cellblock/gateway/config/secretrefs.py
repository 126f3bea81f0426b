"""`${secrets.NAME}` in a local server's arguments: the value of its `secrets:` entry NAME, there.

A server that takes its key on the command line (`--api-key KEY`, `--token=KEY`, a URL with the
key in it) names the secret in its `args`, and the launcher writes the value into that argument
when the server starts (downstream/launch.py). There is one kind of secret: each name under
`secrets:` is read from the keyring, held and redacted as it always was (downstream/keys.py), and
is the server's environment variable too; a reference only says where else the value goes.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence

__all__ = ["LAUNCHER_ENV", "SECRET_REF", "check_references", "fill", "launcher_sets", "reference"]

SECRET_REF = re.compile(r"\$\{secrets\.([A-Za-z_][A-Za-z0-9_]*)\}")
_ANY_REF = "${secrets."
# Set by the launcher itself (and the variables the SDK's spawner adds, which the jail removes):
# a secret of one of these names would be overwritten or dropped, so it is refused.
LAUNCHER_ENV = frozenset(
    {
        *("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "TZ", "LOGNAME", "SHELL", "TERM", "USER"),
        "NODE_USE_ENV_PROXY",
    }
)


def launcher_sets(name: str) -> bool:
    """Whether the launcher sets (or removes) the environment variable `name` itself."""
    return name in LAUNCHER_ENV or name.upper().endswith("_PROXY")


def reference(name: str) -> str:
    """What stands in an argument for the value of `secrets.NAME`."""
    return f"${{secrets.{name}}}"


def check_references(args: Sequence[str], elsewhere: Mapping[str, str], secrets: Collection[str]) -> None:
    """Every `${secrets.NAME}` in `args` names one of `secrets`; none is anywhere else (`elsewhere`:
    where -> text, e.g. the command, the cwd, each env value), where nothing would fill it.

    Raises:
        ValueError: naming the argument or key and the fix.
    """
    for i, arg in enumerate(args):
        for name in SECRET_REF.findall(arg):
            if name not in secrets:
                raise ValueError(
                    f"args[{i}] names {reference(name)}, which secrets: does not have; add it there "
                    f"(secrets: {{{name}: KEYRING-ENTRY}}) and store the value with `cellblock auth set KEYRING-ENTRY`"
                )
        if arg.count(_ANY_REF) != len(SECRET_REF.findall(arg)):
            raise ValueError(
                f"args[{i}] has a '{_ANY_REF}' that is not a reference; write ${{secrets.NAME}}, NAME a key of secrets:"
            )
    for where, text in elsewhere.items():
        if _ANY_REF in text:
            raise ValueError(
                f"{where} holds {_ANY_REF}…}}, which is filled in args only; a secret in the environment "
                "is named under secrets: directly (secrets: {VARIABLE: KEYRING-ENTRY})"
            )


def fill(args: Sequence[str], values: Mapping[str, str]) -> list[str]:
    """`args` with each `${secrets.NAME}` replaced by `values[NAME]` (one missing from `values` is left)."""
    return [SECRET_REF.sub(lambda m: values.get(m.group(1), m.group(0)), arg) for arg in args]
