"""The waits between restarts of a server that keeps crashing double from `first` up to `most`."""

from cellblock.gateway.downstream.backoff import Backoff


def test_the_waits_double_after_each_quick_failure_up_to_the_most() -> None:
    assert [Backoff().delay(failures) for failures in range(1, 8)] == [0.5, 1, 2, 4, 8, 10, 10]
    assert [Backoff(first=0.01, most=0.03).delay(failures) for failures in (1, 2, 3)] == [0.01, 0.02, 0.03]
