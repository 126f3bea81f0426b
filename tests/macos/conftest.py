"""tests/macos: real jails on a Mac. Everywhere else each test is collected (so the folder keeps
importing and cannot rot unseen) and skipped, saying why. Every test here is marked `macos`."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.macos.jail import PROFILES, SANDBOX_EXEC, grants

HERE = Path(__file__).resolve().parent


def _why_not_here() -> str | None:
    if sys.platform != "darwin":
        return f"needs macOS and its sandbox-exec; this is {sys.platform}"
    if not Path(SANDBOX_EXEC).exists():
        return f"needs {SANDBOX_EXEC}, which this Mac lacks"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    why = _why_not_here()
    for item in items:
        if HERE in item.path.resolve().parents:
            item.add_marker(pytest.mark.macos)
            if why is not None:
                item.add_marker(pytest.mark.skip(reason=why))


@pytest.fixture(params=list(PROFILES))
def profile(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, object]:
    """Each profile's jail settings, its grants made in `tmp_path` (`ro`, `rw`)."""
    return grants(PROFILES[request.param], tmp_path)


@pytest.fixture(scope="session")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtualenv's python, made from the interpreter running the tests (which may be Homebrew's,
    the runner's or uv's): what a Python server's venv looks like."""
    where = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    return where / "bin" / "python"


@pytest.fixture
def private(tmp_path: Path) -> Iterator[Path]:
    """The gateway's private directory for the server (its private /tmp goes there)."""
    path = tmp_path / "private"
    path.mkdir()
    yield path
