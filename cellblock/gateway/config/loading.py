"""Reading `cellblock.yaml`: YAML to the typed models, with errors that name file, line and key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ByteSize, ValidationError

from cellblock.gateway.config.model import HEADER_NAME, Config, ConfigError
from cellblock.gateway.state import config_file

__all__ = ["load_config", "parse_config"]


def load_config(path: str | Path | None = None) -> tuple[Config, Path]:
    """Read and validate the config at `path` (or the default location).

    Raises:
        ConfigError: the file is missing, unreadable, not YAML, or not a valid config.
    """
    source = config_file(path)
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{source}: no such config file; create one (see configs/starter.yaml) or pass --config"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror}") from exc
    return parse_config(text, str(source)), source


def parse_config(text: str, source: str = "cellblock.yaml") -> Config:
    """Validate config text; errors read `source:LINE: key.path: problem`.

    Raises:
        ConfigError: the text is not YAML or not a valid config.
    """
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{source}{where}: not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the config must be a mapping with 'version: 1' and 'servers:'")
    lines: dict[tuple[str, ...], int] = {}
    duplicate = _key_lines(node, (), lines)
    if duplicate is not None:
        # YAML keeps the last of two equal keys: a second `servers:` would silently replace the first
        path, line = duplicate
        raise ConfigError(f"{source}:{line}: {'.'.join(path)}: duplicate key (the earlier one would be ignored)")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError("\n".join(_describe(err, lines, source) for err in exc.errors())) from None


def _key_lines(
    node: yaml.Node | None, path: tuple[str, ...], lines: dict[tuple[str, ...], int]
) -> tuple[tuple[str, ...], int] | None:
    """Fill `lines` with the 1-based line of each key path; return the first duplicated key, if any."""
    duplicate: tuple[tuple[str, ...], int] | None = None
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            sub = (*path, str(key.value))
            if sub in lines and duplicate is None:
                duplicate = (sub, key.start_mark.line + 1)
            lines[sub] = key.start_mark.line + 1
            found = _key_lines(value, sub, lines)  # always walked: it fills `lines`
            duplicate = duplicate or found
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            sub = (*path, str(index))
            lines[sub] = item.start_mark.line + 1
            found = _key_lines(item, sub, lines)
            duplicate = duplicate or found
    return duplicate


_TAGS = {"local", "remote", "on", "off", "short", "full"}  # union tags pydantic puts into error locations


def _describe(err: Any, lines: dict[tuple[str, ...], int], source: str) -> str:
    # pydantic puts union member names ("LocalServer") and validator tags into loc; drop them
    loc = [str(part) for part in err["loc"] if str(part) not in _TAGS]
    line = 0
    for end in range(len(loc), -1, -1):
        if tuple(loc[:end]) in lines:
            line = lines[tuple(loc[:end])]
            break
    key = ".".join(loc) or "(top level)"
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "string_pattern_mismatch" and loc[-3:-2] == ["secrets"] and loc[-1:] == ["[key]"]:
        key = ".".join(loc[:-1])
        if err.get("ctx", {}).get("pattern") == HEADER_NAME:
            message = f"{loc[-2]!r} is not an HTTP header name (letters, digits, '-' and '_')"
        else:
            message = (
                f"{loc[-2]!r} is not an environment variable name (letters, digits and '_', not starting with a digit)"
            )
    elif err["type"] == "string_pattern_mismatch" and loc[-2:-1] == ["secrets"]:
        message = (
            f"keyring entry name {err.get('input')!r} must be letters, digits, '.', '_' and '-', "
            "start with a letter or digit, at most 64 characters"
        )
    elif err["type"] == "string_pattern_mismatch" and loc[-1:] == ["[key]"]:
        key = ".".join(loc[:-1])
        message = (
            f"server name {loc[-2]!r} must be lowercase letters, digits and '-', "
            "start with a letter, at most 24 characters"
        )
    elif err["type"] in ("model_type", "dict_type") and loc[-1:] == ["jail"]:
        message = "expected jail settings (a mapping), or false to run the server unjailed"
    elif err["type"] in ("greater_than_equal", "less_than_equal") and loc[-1:] in (
        ["memory"],
        ["disk"],
        ["max_message_size"],
    ):
        bound = ByteSize(err["ctx"]["ge" if err["type"] == "greater_than_equal" else "le"]).human_readable()
        least = "at least" if err["type"] == "greater_than_equal" else "at most"
        message = f"must be {least} {bound} (got {err['input']})"
    elif err["type"] == "extra_forbidden":
        message = "unknown key"
    elif err["type"] == "literal_error":
        expected = err.get("ctx", {}).get("expected", "")
        message = f"{err.get('input')!r} is not one of {expected}"
    where = f"{source}:{line}" if line else source
    return f"{where}: {key}: {message}"
