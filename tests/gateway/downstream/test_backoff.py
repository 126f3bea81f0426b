"""The waits between restarts of a server that keeps crashing double from `first` up to `most`;
one whose start ran out of file descriptors is never given up on."""

import errno

import pytest

from cellblock.gateway.downstream.backoff import Backoff, OutOfDescriptors, exhausted_by, short_of_descriptors
from cellblock.sandbox.types import JailError

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def caused(exc: Exception, cause: Exception) -> Exception:
    exc.__cause__ = cause
    return exc


async def failing(exc: Exception) -> None:
    raise exc


def test_the_waits_double_after_each_quick_failure_up_to_the_most() -> None:
    assert [Backoff().delay(failures) for failures in range(1, 8)] == [0.5, 1, 2, 4, 8, 10, 10]
    assert [Backoff(first=0.01, most=0.03).delay(failures) for failures in (1, 2, 3)] == [0.01, 0.02, 0.03]


def test_a_start_short_of_descriptors_is_never_given_up_on_and_any_other_failure_is() -> None:
    backoff, failures = Backoff(), 0
    for _ in range(20):
        failures = backoff.count(failures, lasted=0.1, exhausted=True)
        assert failures <= backoff.restarts  # `> restarts` is what fails a server for good
    assert backoff.delay(failures) == 8  # tried again at the longest wait the restarts reach
    # control: the same quick failures of any other kind give up after `restarts`
    failures = 0
    for _ in range(backoff.restarts + 1):
        failures = backoff.count(failures, lasted=0.1)
    assert failures > backoff.restarts
    assert backoff.count(failures, lasted=backoff.healthy + 1) == 1  # a healthy run starts again


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.EMFILE, "Too many open files"),
        OSError(errno.ENFILE, "Too many open files in system"),
        caused(JailError("the jail's seccomp filter cannot be handed to bwrap"), OSError(errno.EMFILE, "x")),
        ExceptionGroup("task group", [ValueError("other"), caused(RuntimeError("x"), OSError(errno.EMFILE, "x"))]),
    ],
)
async def test_a_failure_that_comes_of_running_out_of_descriptors_is_raised_as_such(exc: Exception) -> None:
    assert exhausted_by(exc) is not None
    with pytest.raises(OutOfDescriptors, match="ran out of file descriptors"):
        await short_of_descriptors(failing(exc))


@pytest.mark.parametrize(
    "exc",
    [
        OSError(errno.ENOENT, "No such file"),
        JailError("bubblewrap is not installed"),
        ExceptionGroup("task group", [ValueError("other")]),
    ],
)
async def test_any_other_failure_passes_as_it_is(exc: Exception) -> None:
    assert exhausted_by(exc) is None
    with pytest.raises(type(exc)) as raised:
        await short_of_descriptors(failing(exc))
    assert raised.value is exc


async def test_a_failure_of_a_kind_asked_for_is_raised_alone_out_of_a_task_groups_group() -> None:
    # an allowlisted server starts inside the egress proxy's task group: a missing package comes out grouped
    missing = JailError("server 'm': pkg@1 is not installed; run `cellblock install m`")
    with pytest.raises(JailError) as raised:
        await short_of_descriptors(
            failing(ExceptionGroup("task group", [ValueError("x"), missing])), alone=(JailError,)
        )
    assert raised.value is missing
    # control: not asked for, the group passes as it is (and the supervisor restarts the server)
    group = ExceptionGroup("task group", [missing])
    with pytest.raises(ExceptionGroup) as passed:
        await short_of_descriptors(failing(group))
    assert passed.value is group
