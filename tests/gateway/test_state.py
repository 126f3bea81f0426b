"""Where Cellblock keeps its sockets: a directory private to the user, never one another user can make first."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from cellblock.gateway.state import RuntimeDirError, runtime_dir, state_dir
from cellblock.gateway.state import atomic_write_json as state_write
from cellblock.policy.files import atomic_write_json as policy_write
from cellblock.sandbox.unix import SUN_PATH, bind_private, reachable


def private(path: Path) -> Path:
    path.mkdir(parents=True, mode=0o700)
    path.chmod(0o700)
    return path


def test_the_runtime_dir_is_in_a_private_xdg_runtime_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(private(tmp_path / "run")))
    found = runtime_dir()
    assert found == tmp_path / "run" / "cellblock"
    assert found.stat().st_mode & 0o777 == 0o700


def test_a_runtime_base_open_to_others_is_passed_over_for_a_private_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(shared))
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(tmp_path / "state"))
    found = runtime_dir()
    assert not found.is_relative_to(shared)
    assert found in (Path(f"/run/user/{os.getuid()}/cellblock"), tmp_path / "state" / "run")
    # a private base inside a directory others may write could be swapped for theirs: passed over too
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(private(shared / "run")))
    assert not runtime_dir().is_relative_to(shared)


def test_a_runtime_dir_that_is_not_private_is_refused_with_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    base = private(tmp_path / "run")
    (base / "cellblock").mkdir(mode=0o755)
    (base / "cellblock").chmod(0o755)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(base))
    with pytest.raises(RuntimeDirError, match=r"not private to this user.*remove it"):
        runtime_dir()
    (base / "cellblock").rmdir()
    (base / "cellblock").symlink_to(tmp_path)
    with pytest.raises(RuntimeDirError, match="not private"):
        runtime_dir()


def test_a_socket_whose_path_is_too_long_is_bound_and_reached_by_a_short_name(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = deep / "control-1.sock"
    assert len(os.fsencode(str(path))) >= SUN_PATH
    listener = bind_private(path, 1)
    try:
        assert path.exists() and path.stat().st_mode & 0o777 == 0o600
        with socket.socket(socket.AF_UNIX) as client, reachable(path) as address:
            client.connect(address)
            accepted, _ = listener.accept()
            accepted.close()
    finally:
        listener.close()


def test_a_state_dir_others_can_only_read_is_made_private_one_they_can_write_or_own_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    readable = tmp_path / "readable"
    readable.mkdir(mode=0o755)
    readable.chmod(0o755)
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(readable))
    assert state_dir() == readable and readable.stat().st_mode & 0o777 == 0o700
    # one others could write may hold approvals they planted: chmod would hide that, not undo it
    writable = tmp_path / "writable"
    writable.mkdir(mode=0o777)
    writable.chmod(0o777)
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(writable))
    with pytest.raises(RuntimeDirError, match=f"{writable} is writable by others .mode 777.*chmod 700"):
        state_dir()
    assert writable.stat().st_mode & 0o777 == 0o777
    if os.getuid() != 0:
        return  # making a directory of another user needs root
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o777)
    os.chown(theirs, 65534, 65534)
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(theirs))
    with pytest.raises(RuntimeDirError, match="belongs to uid 65534"):
        state_dir()


def test_a_state_dir_another_user_could_swap_through_a_parent_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A private state dir in a directory others may write (without the sticky bit) can be renamed
    away and replaced by theirs; in a sticky one (like /tmp) it cannot."""
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(shared / "state"))
    with pytest.raises(RuntimeDirError, match=f"can be replaced by another user: {shared} is writable by others"):
        state_dir()
    # the same through a symlink of the user's own, which does not make it safe
    (tmp_path / "link").symlink_to(shared)
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(tmp_path / "link" / "state"))
    with pytest.raises(RuntimeDirError, match=f"{shared} is writable by others"):
        state_dir()
    shared.chmod(0o1777)
    assert state_dir() == tmp_path / "link" / "state"
    if os.getuid() != 0:
        return
    os.chown(shared, 65534, 65534)
    with pytest.raises(RuntimeDirError, match=f"{shared} belongs to uid 65534"):
        state_dir()


def test_state_json_is_written_as_the_policy_writes_it_and_never_as_nan(tmp_path: Path) -> None:
    # one writer of JSON state: the gateway's is the policy's, with its failure as StateWriteError
    data = {"b": [1, 2.5, "é"], "a": None}
    state_write(tmp_path / "state.json", data)
    policy_write(tmp_path / "policy.json", data)
    assert (tmp_path / "state.json").read_bytes() == (tmp_path / "policy.json").read_bytes()
    with pytest.raises(ValueError):  # "NaN" is no JSON: a reader would refuse the file
        state_write(tmp_path / "nan.json", {"x": float("nan")})
    assert not (tmp_path / "nan.json").exists()
