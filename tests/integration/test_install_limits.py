"""`cellblock install` of a hostile package: its install script runs under the limits of a server.

Each package comes from a registry on loopback (tests/registry.py) and its npm `postinstall` runs
one attack (`HOSTILE`): a flood of output, a fork bomb, a memory hog, a disk filler, a disk taken in
single calls (`fallocate`), empty files by the thousand, files of holes, a directory the gateway may
not list, a file with thousands of links, directories nested deeper than a path names. Each is judged
on the host while the install runs (`Peak`: the attacker's processes and their memory, the bytes of
the install's directory) and by what the install says; each has an honest control, the same
package under limits above what it takes, whose script gets all it asks for and then fails on
purpose (npm shows a failed script's output, so the control's message says what it did).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from cellblock.sandbox.disk import remove_tree, tree_bytes
from cellblock.sandbox.limits import enforcement
from tests.integration.test_limits_user import SYSTEM_PYTHON, user_area
from tests.registry import npm_package, npm_registry
from tests.sandbox.conftest import ensure_user

pytestmark = [pytest.mark.jail]

MIB = 1 << 20
MARK = f"cellblock-hostile-install-{os.getpid()}"  # on the attacker's command line, so the host can count it
GOES_ON = ("sparse", "links", "nest")  # the attacks whose install succeeds if nothing stops it
HOLD = 2  # seconds the fork bomb's children and the memory hog's memory stay: the host sees them
# The attack, run by npm as the package's postinstall: `python3 hostile.py MODE AMOUNT MARK`.
HOSTILE = f"""
import os, sys, time
mode, amount = sys.argv[1], int(sys.argv[2])
if mode == "flood":  # AMOUNT bytes of output, in lines of 10,000
    block = (b"x" * 9999 + b"\\n") * 6
    for _ in range(amount // len(block)):
        sys.stdout.buffer.write(block)
    print("flood: the end")
elif mode == "fork":  # AMOUNT children that stay {HOLD} s
    made = 0
    for _ in range(amount):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep({HOLD})
            os._exit(0)
        made += 1
    print(f"made {{made}} of {{amount}}", flush=True)
    time.sleep({HOLD})
elif mode == "memory":  # AMOUNT MiB, each page touched, held {HOLD} s
    chunks = [b"\\x01" * (1 << 20) for _ in range(amount)]
    print(f"had {{len(chunks)}} MiB", flush=True)
    time.sleep({HOLD})
elif mode == "fill":  # AMOUNT files of 1 MiB in the package's own directory (RLIMIT_FSIZE alone allows it)
    os.makedirs("fill")
    for i in range(amount):
        with open(f"fill/{{i}}", "wb") as handle:
            handle.write(b"\\x01" * (1 << 20))
    print(f"wrote {{amount}} MiB")
elif mode == "allocate":  # AMOUNT files of 32 MiB, each taken in one call, faster than any look
    os.makedirs("allocate")
    for i in range(amount):
        fd = os.open(f"allocate/{{i}}", os.O_CREAT | os.O_WRONLY)
        os.posix_fallocate(fd, 0, 32 << 20)
        os.close(fd)
    print(f"allocated {{amount * 32}} MiB")
elif mode == "touch":  # AMOUNT empty files: an inode each, and no block
    os.makedirs("touch")
    for i in range(amount):
        open(f"touch/{{i}}", "w").close()
    print(f"made {{amount}} empty files")
elif mode == "sparse":  # AMOUNT files of 16 MiB of holes: no block at all; then the install goes on
    os.makedirs("sparse")
    for i in range(amount):
        with open(f"sparse/{{i}}", "wb") as handle:
            handle.truncate(16 << 20)
    print(f"made {{amount * 16}} MiB of holes")
elif mode == "hide":  # AMOUNT files of 1 MiB in a directory its owner may write but not list
    os.makedirs("hidden")
    os.chmod("hidden", 0o300)
    for i in range(amount):
        with open(f"hidden/{{i}}", "wb") as handle:
            handle.write(b"\x01" * (1 << 20))
    print(f"hid {{amount}} MiB")
elif mode == "links":  # one file of 4 MiB and AMOUNT links to it; then the install goes on
    os.makedirs("links")
    with open("links/file", "wb") as handle:
        handle.write(b"\x01" * (4 << 20))
    for i in range(amount):
        os.link("links/file", f"links/{{i}}")
    print(f"linked {{amount}} times")
elif mode == "nest":  # AMOUNT directories each in the one before: deeper than Python recurses, the
    at = os.open(".", os.O_RDONLY)  # last 30 with long names, past PATH_MAX (made by descriptors)
    for i in range(amount):
        name = "d" if i < amount - 30 else "d" * 200
        os.mkdir(name, dir_fd=at)
        inner = os.open(name, os.O_RDONLY, dir_fd=at)
        os.close(at)
        at = inner
    print(f"nested {{amount}}")
sys.exit(0 if mode in {GOES_ON!r} else 1)  # the controls' way to have npm show what they did
"""
ATTACKS = {
    **{"flood": 200_000_000, "fork": 200, "memory": 512, "fill": 512, "allocate": 64},
    **{"touch": 40_000, "sparse": 64, "hide": 256, "links": 500, "nest": 1230},
}
# `cellblock install`, run as the user runs it, saying at its end the most memory it held: its
# own (the installer's processes are in the jail), since it started (VmHWM; ru_maxrss would count
# what the test process held when it spawned it), and the bytes it read. `lift` takes a defence
# out, for a control: "output" the cap on the output it keeps, "links" reading a file once for all
# its links, "remove" the removal of a tree however deep (shutil.rmtree in its place).
MEASURED = """
import sys
lift = sys.argv.pop(1)
if lift == "output":
    import cellblock.sandbox.spawn
    cellblock.sandbox.spawn.TAIL_BYTES = 1 << 40
elif lift == "links":
    import cellblock.sandbox.installer as packages
    once = packages._sha256
    packages._sha256 = lambda path, info, hashed: once(path, info, {})
elif lift == "remove":
    import shutil
    import cellblock.gateway.downstream.packages as installs
    import cellblock.sandbox.installer as packages
    installs.remove_tree = packages.remove_tree = lambda root: shutil.rmtree(root, ignore_errors=True)
from cellblock.gateway.cli.main import main
try:
    sys.exit(main())
except Exception:  # a crash (a control's): its traceback before the measures, which come last
    import traceback
    traceback.print_exc()
    sys.exit(1)
finally:
    with open("/proc/self/io") as io:
        read = next(line.split()[1] for line in io if line.startswith("rchar:"))
    print(f"read-bytes {read}", file=sys.stderr)
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    print(f"peak-rss-kib {peak}", file=sys.stderr)
"""


def package(mode: str) -> dict[str, str]:
    return npm_package(f"cb-{mode}", f"python3 hostile.py {mode} {ATTACKS[mode]} {MARK}", **{"hostile.py": HOSTILE})


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """The config's folder and the environment `cellblock install` runs with."""
    tmp = tmp_path_factory.mktemp("installs")
    (tmp / "run").mkdir(mode=0o700)
    with npm_registry({f"cb-{mode}": package(mode) for mode in ATTACKS}) as url:
        env = {
            "CELLBLOCK_DATA_DIR": str(tmp / "data"),
            "CELLBLOCK_STATE_DIR": str(tmp / "state"),
            "XDG_RUNTIME_DIR": str(tmp / "run"),
            "npm_config_registry": url,
        }
        yield tmp, env


def install(
    place: tuple[Path, dict[str, str]], name: str, mode: str, limits: dict[str, Any], lift: str = "none"
) -> tuple[subprocess.CompletedProcess[str], int]:
    """`cellblock install NAME` of the `mode` attack under `limits`: how it ended, and the most
    memory (KiB) the command itself held."""
    tmp, env = place
    config = tmp / f"{name}.yaml"
    server = {"install": {"npm": f"cb-{mode}@1.0.0"}, "jail": {"limits": limits}}
    config.write_text(yaml.safe_dump({"version": 1, "servers": {name: server}}))
    command = [sys.executable, "-c", MEASURED, lift, "install", name, "--config", str(config)]
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=300, check=False)
    *rest, last = done.stderr.rstrip("\n").split("\n")
    assert last.startswith("peak-rss-kib "), done.stderr[-2000:]
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, "\n".join(rest)), int(last.split()[1])


class Peak:
    """The most of `measure` seen on the host while the block runs, looked at every few milliseconds."""

    def __init__(self, measure: Callable[[], int]) -> None:
        self.measure, self.most = measure, 0
        self._done = threading.Event()

    @contextmanager
    def watching(self) -> Iterator[Peak]:
        thread = threading.Thread(target=self._watch)
        thread.start()
        try:
            yield self
        finally:
            self._done.set()
            thread.join()

    def _watch(self) -> None:
        while not self._done.wait(0.005):  # sampling an effect in other processes: no event exists
            self.most = max(self.most, self.measure())


def marked(field: str = "") -> int:
    """How many of the attacker's processes run now (with `field`, e.g. "VmRSS", the sum of that, in KiB)."""
    found = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if MARK.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            status = Path(f"/proc/{pid}/status").read_text() if field else ""
        except OSError:
            continue  # gone meanwhile
        lines = [line.split()[1] for line in status.splitlines() if line.startswith(f"{field}:")]
        found += int(lines[0]) if field and lines else 0 if field else 1
    return found


@pytest.mark.slow
def test_an_install_script_that_floods_its_output_leaves_the_installers_memory_bounded(
    place: tuple[Path, dict[str, str]],
) -> None:
    flood = ATTACKS["flood"]
    # control: the same install with the cap taken off what it keeps of the output holds all of it
    whole, held = install(place, "flood-whole", "flood", {}, lift="output")
    assert whole.returncode == 1 and "flood: the end" in whole.stderr, whole.stderr[-2000:]
    assert held * 1024 > flood, held

    done, kept = install(place, "flood", "flood", {})
    assert done.returncode == 1, done.stderr[-2000:]
    assert kept * 1024 < flood // 2, f"{kept} KiB held for {flood:,} bytes of output"
    # it read all of it (npm adds its prefixes), kept its end and says how much there was; each
    # line is shown cut
    said = re.search(r"\(the end of its output, ([\d,]+) bytes in all\)", done.stderr)
    assert said is not None and int(said.group(1).replace(",", "")) >= flood, done.stderr[-2000:]
    assert "flood: the end" in done.stderr and len(done.stderr) < 10_000, done.stderr[-2000:]


def test_an_install_scripts_fork_bomb_stops_at_the_process_limit_and_the_install_names_it(
    place: tuple[Path, dict[str, str]],
) -> None:
    with Peak(marked).watching() as control:
        roomy, _ = install(place, "fork-roomy", "fork", {"processes": 512})
    assert roomy.returncode == 1 and "made 200 of 200" in roomy.stderr, roomy.stderr[-2000:]
    assert control.most > 200, control.most

    with Peak(marked).watching() as bombed:
        done, _ = install(place, "fork", "fork", {"processes": 64})
    assert done.returncode == 1
    assert "was stopped: it reached its limit of 64 processes (jail.limits.processes)" in done.stderr, done.stderr
    assert "raise that limit in servers.fork.jail.limits (or defaults.limits)" in done.stderr
    assert bombed.most < 64, bombed.most


def test_an_install_scripts_memory_hog_stops_at_the_memory_limit(place: tuple[Path, dict[str, str]]) -> None:
    with Peak(lambda: marked("VmRSS")).watching() as control:
        roomy, _ = install(place, "memory-roomy", "memory", {"memory": "1GiB"})
    assert roomy.returncode == 1 and "had 512 MiB" in roomy.stderr, roomy.stderr[-2000:]
    assert control.most > 512 * 1024, control.most

    with Peak(lambda: marked("VmRSS")).watching() as hog:
        done, _ = install(place, "memory", "memory", {"memory": "128MiB"})
    assert done.returncode == 1 and "had 512 MiB" not in done.stderr
    assert hog.most <= 128 * 1024, hog.most
    if enforcement().memory.whole:
        reason = "it reached its memory limit of 128 MiB (jail.limits.memory), and the kernel ended a process"
        assert f"was stopped: {reason}" in done.stderr, done.stderr
    else:  # RLIMIT_DATA: the hog is refused memory and fails by itself
        assert "MemoryError" in done.stderr, done.stderr


def entries(path: str) -> int:
    """How many files, directories and links there are under `path`."""
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(path))


def lengths(path: str) -> int:
    """What the files under `path` are long, holes and all."""
    return sum(os.lstat(os.path.join(at, f)).st_size for at, _, files in os.walk(path) for f in files)


def disk_attack(
    place: tuple[Path, dict[str, str]],
    mode: str,
    roomy: str,
    said: str,
    had: int,
    most: int | None = None,
    measure: Callable[[str], int] = tree_bytes,
) -> None:
    """The `mode` attack installed under a disk limit of `roomy`, the control: its script says
    `said` (its install ends as the script does: it fails on purpose, unless it goes on), and the
    host sees its tree hold at least `had` of `measure` while it runs. Then under 32 MiB: stopped at
    the limit, the message naming it, `said` never said, at most `most` seen, nothing left behind."""
    data = place[0] / "data" / "installs"
    with Peak(lambda: measure(str(data / f"{mode}-roomy"))).watching() as room:
        control, _ = install(place, f"{mode}-roomy", mode, {"disk": roomy})
    assert control.returncode == (0 if mode in GOES_ON else 1), control.stderr[-2000:]
    assert said in control.stderr, control.stderr[-2000:]
    assert room.most >= had, f"{room.most:,}"
    with Peak(lambda: measure(str(data / mode))).watching() as held:
        done, _ = install(place, mode, mode, {"disk": "32MiB"})
    assert done.returncode == 1 and said not in done.stderr
    assert "was stopped: it wrote more than its disk limit of 32 MiB (limits.disk)" in done.stderr, done.stderr
    assert f"then run `cellblock install {mode}` again" in done.stderr
    assert most is None or held.most < most, f"{held.most:,} at most"
    assert [p.name for p in (data / mode).iterdir()] == [".lock"]  # nothing of it is left


def test_an_install_that_writes_past_its_disk_limit_is_stopped_near_it_and_fails_naming_it(
    place: tuple[Path, dict[str, str]],
) -> None:
    # it goes past by what it writes between two looks: a few MiB on an idle machine (~1 GB/s, a
    # look every 50 ms), more on a busy one; far from all it tried to write either way
    disk_attack(place, "fill", "1GiB", "wrote 512 MiB", 512 * MIB, most=256 * MIB)


def test_an_install_script_that_takes_its_disk_in_single_calls_is_stopped_near_its_limit(
    place: tuple[Path, dict[str, str]],
) -> None:
    """fallocate takes 32 MiB in one call, as fast as the file system notes it: 2 GiB between two
    looks of the watch. It is refused (EOPNOTSUPP), and glibc writes the blocks instead."""
    disk_attack(place, "allocate", "4GiB", "allocated 2048 MiB", 2048 * MIB, most=256 * MIB)


def test_an_install_script_that_makes_empty_files_by_the_thousand_is_stopped_at_a_block_each(
    place: tuple[Path, dict[str, str]],
) -> None:
    """An empty file takes an inode and no block: the watch counted 40,000 of them as nothing, and
    as many million would use up the file system's inodes. Each entry now counts a block: 32 MiB
    pays for 8,192, and it goes past by what it makes between two looks."""
    disk_attack(place, "touch", "1GiB", "made 40000 empty files", 40_000, most=30_000, measure=entries)


def test_an_install_script_that_makes_files_of_holes_is_stopped_at_their_length(
    place: tuple[Path, dict[str, str]],
) -> None:
    """A file of holes takes no block, but the install's record reads every byte of it (64 files
    of 16 MiB: 1 GiB read; as many as it likes of 2 GiB each: hours). A file counts its length.
    Made in an instant, they may all be there before the watch looks: no bound on the peak."""
    disk_attack(place, "sparse", "2GiB", "installed cb-sparse@1.0.0 for", 1024 * MIB, measure=lengths)


SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


@pytest.fixture(scope="module")
def as_user(place: tuple[Path, dict[str, str]]) -> Iterator[tuple[list[str], Path]]:
    """`cellblock install` as an ordinary user runs it (no CAP_DAC_OVERRIDE: a directory it may not
    list is closed to it): the command line that runs it, with the user's own data, state and runtime
    directories and the same registry; and the user's data directory."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("runs cellblock install as another user: needs root and runuser")
    if shutil.which("npm", path=SYSTEM_PATH) is None or not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"the user's install needs npm on {SYSTEM_PATH} and {SYSTEM_PYTHON}")
    user = ensure_user()
    area, root, packages = user_area(user.pw_uid, user.pw_gid)
    try:
        command = [*as_user_in(user, area, root, packages, place[1]["npm_config_registry"]), SYSTEM_PYTHON, "-m"]
        yield [*command, "cellblock.gateway.cli.main", "install"], area / "data" / "installs"
    finally:
        shutil.rmtree(area)


def as_user_in(user: pwd.struct_passwd, area: Path, root: Path, packages: Path, registry: str) -> list[str]:
    """What runs a command as `user` with its own data, state and runtime directories in `area`
    (`user_area`'s), the cellblock copy at `root` and `packages`, and the npm `registry`."""
    (area / "data").mkdir(mode=0o700)  # user_area made the state and runtime directories
    os.chown(area / "data", user.pw_uid, user.pw_gid)
    env = {
        "PATH": SYSTEM_PATH,
        "HOME": user.pw_dir,
        "PYTHONPATH": f"{root}:{packages}",
        "CELLBLOCK_DATA_DIR": str(area / "data"),
        "CELLBLOCK_STATE_DIR": str(area / "state"),
        "XDG_RUNTIME_DIR": str(area / "run"),
        "npm_config_registry": registry,
    }
    return ["runuser", "-u", user.pw_name, "--", "env", "-i", *(f"{key}={value}" for key, value in env.items())]


def test_an_install_script_that_hides_its_writes_from_a_users_gateway_is_stopped_and_leaves_nothing(
    place: tuple[Path, dict[str, str]], as_user: tuple[list[str], Path]
) -> None:
    """A directory of mode 0300 takes writes, and nobody without CAP_DAC_OVERRIDE can list it: the
    watch of a user's gateway counted nothing in it, and removing the install left it, whatever it
    held. Such a directory now stops the install, and removal opens it first."""
    # control: root's gateway, which may list any directory, sees the package write all of it there
    data = place[0] / "data" / "installs"
    with Peak(lambda: tree_bytes(str(data / "hide-roomy"))).watching() as roomy:
        control, _ = install(place, "hide-roomy", "hide", {"disk": "1GiB"})
    assert control.returncode == 1 and "hid 256 MiB" in control.stderr, control.stderr[-2000:]
    assert roomy.most >= 256 * MIB, roomy.most

    command, users = as_user
    config = users.parent.parent / "hide.yaml"
    server = {"install": {"npm": "cb-hide@1.0.0"}, "jail": {"limits": {"disk": "32MiB"}}}
    config.write_text(yaml.safe_dump({"version": 1, "servers": {"hide": server}}))
    with Peak(lambda: tree_bytes(str(users / "hide"))).watching() as hidden:
        done = subprocess.run([*command, "hide", "--config", str(config)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "hid 256 MiB" not in done.stderr, done.stderr[-2000:]
    assert "a directory it keeps the gateway from looking into" in done.stderr, done.stderr[-2000:]
    assert hidden.most < 256 * MIB, f"{hidden.most:,} bytes at most"
    assert [p.name for p in (users / "hide").iterdir()] == [".lock"]  # nothing of it is left


def read_bytes(done: subprocess.CompletedProcess[str]) -> int:
    """What `cellblock install` read in all (its `rchar`), as `MEASURED` says at its end."""
    found = re.search(r"^read-bytes (\d+)$", done.stderr, re.M)
    assert found is not None, done.stderr[-2000:]
    return int(found.group(1))


def test_an_install_whose_files_are_links_to_one_reads_that_file_once(place: tuple[Path, dict[str, str]]) -> None:
    """A tree's disk counts each inode once, and the install's record read the file again for each
    link: 500 links to 4 MiB were 2 GB to read (4,000 links to 16 MiB: 64 GB, hours)."""
    control, _ = install(place, "links-each", "links", {}, lift="links")  # each link read, as before
    assert control.returncode == 0, control.stderr[-2000:]
    assert read_bytes(control) > 2000 * MIB, read_bytes(control)

    done, _ = install(place, "links", "links", {})
    assert done.returncode == 0, done.stderr[-2000:]
    assert read_bytes(done) < 256 * MIB, read_bytes(done)
    record = json.loads((place[0] / "data" / "installs" / "links.json").read_text())
    linked = [what for path, what in record["files"].items() if path.startswith("node_modules/cb-links/links/")]
    assert len(linked) == 501 and len(set(linked)) == 1  # every link recorded, with the one file's hash


def test_an_install_script_that_nests_directories_past_what_a_path_names_is_stopped_and_leaves_nothing(
    place: tuple[Path, dict[str, str]],
) -> None:
    """1,230 directories, each in the one before, the last 30 with names of 200 characters: no path
    reaches the end (PATH_MAX), and a recursive removal stops at Python's recursion limit. The
    watch could not measure the tree and the install failed with the error of that, then the
    removal failed the same way and left the tree (and each try another) under the data directory."""
    data = place[0] / "data" / "installs"
    # control: the same install removing its tree with shutil.rmtree leaves it behind
    control, _ = install(place, "nest-kept", "nest", {}, lift="remove")
    assert control.returncode != 0, control.stderr[-2000:]
    left = [p for p in (data / "nest-kept").iterdir() if p.name != ".lock"]
    try:
        assert left, control.stderr[-2000:]
    finally:
        for path in left:
            remove_tree(str(path))  # what pytest's own rmtree could not remove either

    done, _ = install(place, "nest", "nest", {})
    assert done.returncode == 1, done.stderr[-2000:]
    assert "was stopped: it made " in done.stderr and "which the gateway cannot measure" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and len(done.stderr) < 10_000, done.stderr[-2000:]
    assert [p.name for p in (data / "nest").iterdir()] == [".lock"]  # nothing of it is left
