"""`cellblock doctor`'s self-test profile under the real sandbox-exec (its reporting is tested
everywhere by tests/gateway/cli/test_doctor_macos.py, with the runner substituted)."""

from __future__ import annotations

import pytest

from cellblock.gateway.cli.doctor import doctor

pytestmark = pytest.mark.macos


def test_doctors_self_test_passes_here(capsys: pytest.CaptureFixture[str]) -> None:
    doctor()
    out = capsys.readouterr().out
    assert "OK    self-test profile" in out and "OK    self-test decoy" in out, out
