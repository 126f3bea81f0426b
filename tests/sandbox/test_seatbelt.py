"""The macOS profile, checked on any OS: golden files, an SBPL reader, and the refusals.

`UPDATE_GOLDEN=1 pytest tests/sandbox/test_seatbelt.py` rewrites `golden/*.sb` (and the hostile
case's `golden/hostile.params.json`); review the diff. The reader here is the compiler check that
runs without a Mac: every profile must parse, every string literal must be escaped as SBPL reads
it, and no path from the config may appear in the text, only as a `-D` parameter. Rule tests
read the profile with its parameters substituted (`expand`), as sandbox-exec would.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from cellblock.sandbox.seatbelt import SANDBOX_EXEC, seatbelt_compile, seatbelt_executables, seatbelt_plan
from cellblock.sandbox.types import JailError, JailSpec, Mount, MountMode, Network

GOLDEN = Path(__file__).parent / "golden"
HOME = "/Users/alice"
TMP = "/private/var/folders/zz/abc123/T/cellblock-fs-1"
PROXY_PORT = 48123
# Paths the fake filesystem calls files; everything else is a directory.
FILES = frozenset(
    {
        "/usr/local/bin/fs-server",
        "/usr/bin/git",
        "/etc/fs.conf",  # is_dir is asked about paths as written in the config
        "/Users/alice/notes.txt",
        "/Users/alice/fs.yaml",
        "/Users/alice/.docker/run/docker.sock",
    }
)


def is_dir(path: str) -> bool:
    return path not in FILES


ODD_RO = (
    f"{HOME}/My Documents",
    f'{HOME}/say "hi"',
    "/Volumes/data/back\\slash",
    "/srv/données/日本語",
    f"{HOME}/notes.txt",
)
ODD_RW = (f"{HOME}/project dir",)
# what downstream/private.py hides where a grant holds it, and a server's own package cache inside one of them
OWN_CONFIG = f"{HOME}/Library/Application Support/cellblock"
OWN_CACHE = f"{HOME}/Library/Caches/cellblock"
CACHE_GRANT = f"{OWN_CACHE}/npm-fs"
# a socket that downstream/private.py hides where a grant holds it: Docker Desktop's, in the home
DOCKER_SOCKET = f"{HOME}/.docker/run/docker.sock"

SYSTEM_MOUNTS = (
    Mount("/opt/homebrew/Cellar/node/22.1.0", MountMode.READ_ONLY, "launcher"),
    Mount("/usr/local/bin/fs-server", MountMode.READ_ONLY, "launcher"),
)


def make_spec(**changes: Any) -> JailSpec:
    spec = JailSpec(
        name="fs",
        argv=("/usr/local/bin/fs-server", "--root", "/work/data"),
        env={"PATH": "/usr/bin:/bin", "TMPDIR": TMP},
        cwd="/work/data",
        home=HOME,
    )
    return replace(spec, **changes)


def grant_mounts(spec: JailSpec) -> tuple[Mount, ...]:
    """What the caller computes: system mounts, then the user's grants."""
    return (
        *SYSTEM_MOUNTS,
        *(Mount(p, MountMode.READ_ONLY, "read_only") for p in spec.read_only),
        *(Mount(p, MountMode.READ_WRITE, "read_write") for p in spec.read_write),
    )


@dataclass(frozen=True)
class Case:
    spec: JailSpec
    proxy_port: int | None = None
    tmp_dir: str | None = TMP

    def compiled(self) -> tuple[str, dict[str, str]]:
        return seatbelt_compile(
            self.spec, grant_mounts(self.spec), proxy_port=self.proxy_port, tmp_dir=self.tmp_dir, is_dir=is_dir
        )

    def text(self) -> str:
        return self.compiled()[0]

    def profile(self) -> str:
        """The profile with its parameters in place, as sandbox-exec reads it."""
        return expand(*self.compiled())


def seatbelt_profile(spec: JailSpec, mounts: tuple[Mount, ...], **options: Any) -> str:
    """The profile's text alone: for the refusals."""
    return seatbelt_compile(spec, mounts, **options)[0]


def compiled(spec: JailSpec, mounts: tuple[Mount, ...], **options: Any) -> str:
    return expand(*seatbelt_compile(spec, mounts, is_dir=is_dir, **options))


# quotes, backslashes, newlines, a parenthesis, UTF-8 in NFC and NFD, what looks like SBPL
HOSTILE_GRANTS = (
    f'{HOME}/say "hi"',
    "/Volumes/data/back\\slash\\",
    f"{HOME}/two\nlines",
    '/work/evil")\n(allow file-read* (subpath "/"))\n;',
    "/srv/données/日本語",
    unicodedata.normalize("NFD", "/srv/données"),
    '/work/tab\there/(param "HOME_0")',
    "/work/c1\x85next-line\x7f",
)


CASES = {
    "default": Case(make_spec()),
    "grants": Case(make_spec(read_only=ODD_RO, read_write=ODD_RW)),
    "private_roots": Case(
        make_spec(read_only=("/tmp/shared", "/etc/fs.conf", "/tmpfoo"), read_write=("/var/lib/fs",)),
        tmp_dir="/tmp/cellblock-fs-1",
    ),
    "allowlist": Case(make_spec(network=Network.ALLOWLIST, allow_hosts=("api.example.com",)), proxy_port=PROXY_PORT),
    "open": Case(make_spec(network=Network.OPEN)),
    "exec_allow": Case(make_spec(exec_allow=("/usr/local/bin/fs-server", "/usr/bin/git"), read_write=("/work/data",))),
    "no_tmp": Case(make_spec(tmp=False), tmp_dir=None),
    "hidden": Case(
        make_spec(
            read_only=(HOME,),
            read_write=(CACHE_GRANT,),
            hidden=dict.fromkeys((OWN_CONFIG, OWN_CACHE, f"{HOME}/fs.yaml", DOCKER_SOCKET), "hidden"),
        )
    ),
    "hostile": Case(
        make_spec(
            read_only=HOSTILE_GRANTS[:4],
            read_write=HOSTILE_GRANTS[4:],
            exec_allow=("/usr/local/bin/fs-server", HOSTILE_GRANTS[0]),
        ),
    ),
}


# --- a small SBPL reader, so tests look at rules rather than text -------------------------------


@dataclass(frozen=True)
class Str:
    value: str


Form = str | Str | list["Form"]


def read_sbpl(text: str, strict: bool = False) -> list[Form]:
    """Read the profile's top-level forms; raises on unbalanced parens or a bad string, and when
    `strict` (the text as generated, before parameters) on a raw control character in a string."""
    stack: list[list[Form]] = [[]]
    i = 0
    while i < len(text):
        c = text[i]
        if c == ";":
            i = text.index("\n", i)
        elif c == "(":
            stack.append([])
        elif c == ")":
            done = stack.pop()
            stack[-1].append(done)
        elif c == '"':
            value: list[str] = []
            i += 1
            while text[i] != '"':
                if text[i] == "\\":
                    i += 1
                    assert text[i] in '\\"', f"unexpected escape \\{text[i]}"
                assert not strict or unicodedata.category(text[i]) != "Cc", (
                    f"raw control character {text[i]!r} in a string"
                )
                value.append(text[i])
                i += 1
            stack[-1].append(Str("".join(value)))
        elif not c.isspace():
            j = i
            while j < len(text) and not text[j].isspace() and text[j] not in '()";':
                j += 1
            stack[-1].append(text[i:j])
            i = j - 1
        i += 1
    assert len(stack) == 1, "unbalanced parentheses"
    return stack[0]


@dataclass(frozen=True)
class Rule:
    action: str
    ops: tuple[str, ...]
    filters: tuple[tuple[str, str], ...]  # (kind, path)


def rules(text: str) -> list[Rule]:
    found: list[Rule] = []
    for form in read_sbpl(text):
        assert isinstance(form, list), form
        head = form[0]
        if head not in ("allow", "deny"):
            continue
        ops = tuple(x for x in form[1:] if isinstance(x, str))
        filters = tuple(
            (f[0], f[1].value)
            for f in form[1:]
            if isinstance(f, list) and isinstance(f[0], str) and len(f) == 2 and isinstance(f[1], Str)
        )
        found.append(Rule(str(head), ops, filters))
    return found


def paths_allowed(text: str, op_prefix: str = "file-") -> list[tuple[Rule, str, str]]:
    return [
        (r, kind, path)
        for r in rules(text)
        if r.action == "allow" and any(op.startswith(op_prefix) for op in r.ops)
        for kind, path in r.filters
        if kind in ("subpath", "literal")
    ]


def sbpl_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def expand(text: str, params: dict[str, str]) -> str:
    """`text` with each `(param "NAME")` replaced by its value, escaped; every name must be given."""

    def value(match: re.Match[str]) -> str:
        return sbpl_string(params[match.group(1)])

    return re.sub(r'\(param "([A-Z][A-Z0-9_]*)"\)', value, text)


def strings(forms: list[Form]) -> list[str]:
    found: list[str] = []
    for form in forms:
        if isinstance(form, Str):
            found.append(form.value)
        elif isinstance(form, list):
            found += strings(form)
    return found


def within(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


# --- golden files -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_profile_matches_its_golden_file(name: str) -> None:
    profile, params = CASES[name].compiled()
    golden = GOLDEN / f"{name}.sb"
    given = GOLDEN / f"{name}.params.json"
    shown = json.dumps(params, indent=2, ensure_ascii=False) + "\n"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(profile, encoding="utf-8")
        if name == "hostile":
            given.write_text(shown, encoding="utf-8")
    assert golden.exists(), f"no golden file {golden.name}; run with UPDATE_GOLDEN=1 and review it"
    assert profile == golden.read_text(encoding="utf-8")
    if name == "hostile":
        assert shown == given.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(CASES))
def test_profile_is_well_formed_sbpl_that_denies_by_default(name: str) -> None:
    text, params = CASES[name].compiled()
    forms = read_sbpl(text, strict=True)
    assert forms[:2] == [["version", "1"], ["deny", "default"]]
    assert read_sbpl(expand(text, params))  # and still after sandbox-exec puts the values in


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_config_path_is_in_the_text_only_constants_and_parameter_names(name: str) -> None:
    text, params = CASES[name].compiled()
    written = strings(read_sbpl(text, strict=True))
    names = {s for s in written if re.fullmatch(r"[A-Z][A-Z0-9_]*", s)}
    assert names == set(params)  # each parameter used, none missing
    paths = [s for s in written if s.startswith("/")]
    # the constants: system roots and files, the temp trees, the cryptex, Homebrew's kegs, resolver
    assert all(re.fullmatch(r"/[A-Za-z0-9_./@-]*", p) for p in paths), paths
    assert not set(paths) & set(params.values()) - {"/"}


def test_hostile_paths_arrive_only_as_parameters_byte_for_byte() -> None:
    text, params = CASES["hostile"].compiled()
    private = {f"/private{p}" if p.startswith("/tmp/") else p for p in HOSTILE_GRANTS}
    assert private <= set(params.values())
    for piece in (
        *HOSTILE_GRANTS,
        'say "hi"',
        "slash",
        "two\nlines",
        "evil",
        "données",
        "日本語",
        "tab\there",
        "next-line",
    ):
        assert piece not in text, piece
    plan = seatbelt_plan(CASES["hostile"].spec, grant_mounts(CASES["hostile"].spec), tmp_dir=TMP, is_dir=is_dir)
    assert plan.argv[2] == text
    defines = plan.argv[3 : -len(CASES["hostile"].spec.argv)]
    assert defines == tuple(w for k, v in params.items() for w in ("-D", f"{k}={v}"))


def test_profile_is_deterministic() -> None:
    assert CASES["grants"].profile() == CASES["grants"].profile()


# --- the home and the temp trees --------------------------------------------------------------


@pytest.mark.parametrize("name", ["default", "allowlist", "open", "exec_allow", "no_tmp"])
def test_home_appears_in_no_allow_rule_when_nothing_in_it_is_granted(name: str) -> None:
    profile = CASES[name].profile()
    leaked = [(r.ops, path) for r, _, path in paths_allowed(profile) if within(path, HOME)]
    assert not leaked


def test_home_appears_only_as_its_grants_and_as_an_ancestor_for_stat() -> None:
    granted = {p for p in (*ODD_RO, *ODD_RW) if within(p, HOME)}
    for rule, kind, path in paths_allowed(CASES["grants"].profile()):
        if not within(path, HOME):
            continue
        if path in granted:
            continue
        # the only other mention: stat of the home directory itself, so realpath() of a grant works
        assert (rule.ops, kind, path) == (("file-read-metadata",), "literal", HOME), (rule, path)


@pytest.mark.parametrize("ancestor", ["/", "/Users"])
def test_a_mount_of_an_ancestor_of_home_is_overridden_by_the_deny_on_home(ancestor: str) -> None:
    spec = make_spec(read_only=(ancestor,))
    found = rules(compiled(spec, grant_mounts(spec), tmp_dir=TMP))
    allow_at = next(i for i, r in enumerate(found) if r.action == "allow" and ("subpath", ancestor) in r.filters)
    deny_at = next(i for i, r in enumerate(found) if r.action == "deny" and ("subpath", HOME) in r.filters)
    # Seatbelt: the last matching rule wins.
    assert allow_at < deny_at
    assert {("subpath", "/private/tmp"), ("subpath", "/private/var/folders")} <= set(found[deny_at].filters)
    assert {"file-read*", "file-write*", "process-exec*"} <= set(found[deny_at].ops)


def test_grants_inside_home_come_after_the_deny_on_home() -> None:
    found = rules(CASES["grants"].profile())
    deny_at = next(i for i, r in enumerate(found) if r.action == "deny")
    for i, rule in enumerate(found):
        for _, path in rule.filters:
            if within(path, HOME) and rule.action == "allow":
                assert i > deny_at, path


def test_what_the_spec_hides_is_denied_after_every_grant_that_holds_it_and_only_its_own_grants_come_back() -> None:
    found = rules(CASES["hidden"].profile())
    deny_at = max(i for i, r in enumerate(found) if r.action == "deny")
    assert {("subpath", OWN_CONFIG), ("subpath", OWN_CACHE), ("literal", f"{HOME}/fs.yaml")} <= set(
        found[deny_at].filters
    )
    # a socket the grant of the home holds, hidden like a file; no network rule allows connecting to
    # any Unix socket but the resolver's besides (test_open_network_reaches_no_unix_socket_but_the_resolvers)
    assert ("literal", DOCKER_SOCKET) in found[deny_at].filters
    assert {"file-read*", "file-write*", "process-exec*"} <= set(found[deny_at].ops)
    home_at = next(i for i, r in enumerate(found) if r.action == "allow" and ("subpath", HOME) in r.filters)
    assert home_at < deny_at  # the grant of the whole home does not win over the hiding
    # only the server's own cache is shared again (besides stat of ancestors, which lists nothing)
    after = [
        path
        for r in found[deny_at + 1 :]
        if r.action == "allow" and r.ops != ("file-read-metadata",)
        for _, path in r.filters
    ]
    assert [p for p in after if within(p, OWN_CACHE) or within(p, OWN_CONFIG)] == [CACHE_GRANT], after
    back = next(r for r in found[deny_at + 1 :] if ("subpath", CACHE_GRANT) in r.filters)
    assert "file-write*" in back.ops


def test_shared_temp_trees_are_allowed_only_at_the_private_temp_dir() -> None:
    for name, case in CASES.items():
        for rule, _, path in paths_allowed(case.profile()):
            if rule.ops == ("file-read-metadata",):
                continue
            for tree in ("/private/tmp", "/private/var/folders"):
                if within(path, tree):
                    allowed = {"/private/tmp/shared", "/private/tmp/cellblock-fs-1", TMP}
                    assert path in allowed, (name, path)


def test_private_temp_dir_is_writable() -> None:
    (rule,) = [r for r in rules(CASES["default"].profile()) if ("subpath", TMP) in r.filters]
    assert {"file-read*", "file-write*"} <= set(rule.ops)


# --- paths ------------------------------------------------------------------------------------


def test_odd_paths_survive_escaping_byte_for_byte() -> None:
    written = {path for _, _, path in paths_allowed(CASES["grants"].profile())}
    assert set(ODD_RO) | set(ODD_RW) <= written


def test_directories_are_subpaths_and_files_are_literals() -> None:
    kinds = {path: kind for _, kind, path in paths_allowed(CASES["grants"].profile()) if path in ODD_RO}
    assert kinds[f"{HOME}/notes.txt"] == "literal"
    assert kinds[f"{HOME}/My Documents"] == "subpath"


def test_read_only_mounts_are_not_writable_and_read_write_mounts_are() -> None:
    ops = {path: set(r.ops) for r, _, path in paths_allowed(CASES["grants"].profile())}
    assert "file-write*" not in ops["/srv/données/日本語"]
    assert "file-write*" in ops[f"{HOME}/project dir"]


def test_tmp_var_and_etc_paths_are_written_in_their_private_form() -> None:
    written = {path for r, _, path in paths_allowed(CASES["private_roots"].profile()) if r.ops[0] == "file-read*"}
    assert {
        "/private/tmp/shared",
        "/private/etc/fs.conf",
        "/private/var/lib/fs",
        "/private/tmp/cellblock-fs-1",
    } <= written
    assert not {"/tmp/shared", "/etc/fs.conf", "/var/lib/fs"} & written
    assert "/tmpfoo" in written  # a sibling name, not under /tmp


def test_a_path_mounted_twice_is_read_write_if_either_mount_is() -> None:
    spec = make_spec()
    mounts = (
        Mount("/work/data", MountMode.READ_ONLY, "system"),
        Mount("/work/data/", MountMode.READ_WRITE, "read_write"),
    )
    profile = compiled(spec, mounts, tmp_dir=TMP)
    (rule,) = [r for r, _, path in paths_allowed(profile) if path == "/work/data" and r.ops[0] == "file-read*"]
    assert "file-write*" in rule.ops


def test_paths_are_not_unicode_normalised() -> None:
    """GAP: the profile holds a path's code points as given. APFS keeps names in the form they
    were created in; a grant typed in NFC for a directory stored in NFD may not match under
    Seatbelt. Unverified without a Mac; the config layer should normalise to the on-disk form."""
    nfd = unicodedata.normalize("NFD", "/srv/données")
    spec = make_spec(read_only=(nfd,))
    written = {path for _, _, path in paths_allowed(compiled(spec, grant_mounts(spec), tmp_dir=TMP))}
    assert nfd in written
    assert unicodedata.normalize("NFC", nfd) not in written


# --- refusals ---------------------------------------------------------------------------------


def test_a_path_with_a_nul_is_refused_naming_the_path_since_no_argument_can_hold_it() -> None:
    path = "/work/nul\x00byte"
    spec = make_spec(read_only=(path,))
    with pytest.raises(JailError) as caught:
        seatbelt_profile(spec, grant_mounts(spec), tmp_dir=TMP, is_dir=is_dir)
    assert repr(path) in str(caught.value)


def test_a_nul_is_refused_in_exec_allow_and_tmp_dir_too() -> None:
    with pytest.raises(JailError, match=r"exec\.allow"):
        seatbelt_profile(make_spec(exec_allow=("/usr/bin/git\x00",)), SYSTEM_MOUNTS, tmp_dir=TMP, is_dir=is_dir)
    with pytest.raises(JailError, match="tmp_dir"):
        seatbelt_profile(make_spec(), SYSTEM_MOUNTS, tmp_dir="/private/tmp/x\x00y", is_dir=is_dir)


@pytest.mark.parametrize("path", ["relative/dir", "", "/work/../Users/alice", "/work/./data"])
def test_relative_and_dotted_paths_are_refused(path: str) -> None:
    spec = make_spec(read_write=(path,))
    with pytest.raises(JailError, match="path"):
        seatbelt_profile(spec, grant_mounts(spec), tmp_dir=TMP, is_dir=is_dir)


@pytest.mark.parametrize("port", [None, 0, 65536, -1, True])
def test_allowlist_without_a_valid_proxy_port_is_refused(port: int | None) -> None:
    spec = make_spec(network=Network.ALLOWLIST)
    with pytest.raises(JailError, match="egress proxy"):
        seatbelt_profile(spec, SYSTEM_MOUNTS, proxy_port=port, tmp_dir=TMP, is_dir=is_dir)


def test_network_none_allows_no_network_operation() -> None:
    assert not [r for r in rules(CASES["default"].profile()) if any(op.startswith("network") for op in r.ops)]


def test_allowlist_reaches_only_the_proxy_port_on_localhost() -> None:
    network = [r for r in read_sbpl(CASES["allowlist"].profile()) if isinstance(r, list) and "network" in str(r[1])]
    assert network == [["allow", "network-outbound", ["remote", "tcp", Str(f"localhost:{PROXY_PORT}")]]]


def test_exec_allow_must_include_the_servers_own_command() -> None:
    spec = make_spec(exec_allow=("/usr/bin/git",))
    with pytest.raises(JailError, match=r"add it to exec\.allow"):
        seatbelt_profile(spec, SYSTEM_MOUNTS, tmp_dir=TMP, is_dir=is_dir)


def test_exec_allow_leaves_process_exec_only_on_the_listed_paths() -> None:
    execs = {path for r, _, path in paths_allowed(CASES["exec_allow"].profile(), "process-exec")}
    assert execs == {"/usr/local/bin/fs-server", "/usr/bin/git"}


@pytest.mark.parametrize("tmp_dir", ["/tmp", "/private/tmp", "/private/var/folders", "/private", "/", HOME])
def test_a_private_temp_dir_that_would_share_a_protected_tree_is_refused(tmp_dir: str) -> None:
    with pytest.raises(JailError, match="private temp dir"):
        seatbelt_profile(make_spec(), SYSTEM_MOUNTS, tmp_dir=tmp_dir, is_dir=is_dir)


def test_tmp_setting_and_temp_dir_must_agree() -> None:
    with pytest.raises(JailError, match="tmp: true"):
        seatbelt_profile(make_spec(), SYSTEM_MOUNTS, tmp_dir=None, is_dir=is_dir)
    with pytest.raises(JailError, match="tmp: false"):
        seatbelt_profile(make_spec(tmp=False), SYSTEM_MOUNTS, tmp_dir=TMP, is_dir=is_dir)


def test_a_spec_without_a_command_is_refused() -> None:
    with pytest.raises(JailError, match="no command"):
        seatbelt_profile(make_spec(argv=()), SYSTEM_MOUNTS, tmp_dir=TMP, is_dir=is_dir)


# --- the plan ---------------------------------------------------------------------------------


def test_plan_runs_the_server_under_sandbox_exec_with_the_profile() -> None:
    case = CASES["allowlist"]
    plan = seatbelt_plan(case.spec, grant_mounts(case.spec), proxy_port=PROXY_PORT, tmp_dir=TMP, is_dir=is_dir)
    text, params = case.compiled()
    defines = tuple(w for k, v in params.items() for w in ("-D", f"{k}={v}"))
    assert plan.argv == (SANDBOX_EXEC, "-p", text, *defines, *case.spec.argv)
    assert SANDBOX_EXEC == "/usr/bin/sandbox-exec"
    assert plan.env == case.spec.env
    assert plan.cwd == "/work/data"
    assert plan.network is Network.ALLOWLIST
    assert plan.mounts == (*grant_mounts(case.spec), Mount(TMP, MountMode.READ_WRITE, "tmp"))


def test_plan_lists_exec_allow_entries_among_its_mounts() -> None:
    case = CASES["exec_allow"]
    plan = seatbelt_plan(case.spec, grant_mounts(case.spec), tmp_dir=TMP, is_dir=is_dir)
    assert Mount("/usr/bin/git", MountMode.READ_ONLY, "exec_allow") in plan.mounts


# --- the rules the peers' profiles show a jail needs, and the holes they close ----------------


def forms_of(name: str) -> list[Form]:
    return read_sbpl(CASES[name].profile())


def test_the_root_directory_itself_is_readable_since_dyld_and_node_open_it() -> None:
    assert ["allow", "file-read*", ["literal", Str("/")]] in forms_of("default")


def test_the_data_volume_is_hidden_after_every_mount_and_only_dyld_s_cryptex_comes_back() -> None:
    spec = make_spec(read_only=("/",))
    found = rules(compiled(spec, grant_mounts(spec), tmp_dir=TMP))
    root_at = next(i for i, r in enumerate(found) if r.action == "allow" and ("subpath", "/") in r.filters)
    deny_at = next(i for i, r in enumerate(found) if r.action == "deny" and ("subpath", "/System/Volumes") in r.filters)
    back = [
        i
        for i, r in enumerate(found)
        if r.action == "allow" and any(within(p, "/System/Volumes") for _, p in r.filters)
    ]
    assert root_at < deny_at and back and all(i > deny_at for i in back)
    assert [p for i in back for _, p in found[i].filters] == ["/System/Volumes/Preboot/Cryptexes"]


@pytest.mark.parametrize("name", sorted(CASES))
def test_sysctl_reads_are_by_name_and_never_reach_other_processes_arguments(name: str) -> None:
    reads = [f for f in forms_of(name) if isinstance(f, list) and f[:2] == ["allow", "sysctl-read"]]
    assert len(reads) == 1 and len(reads[0]) > 2  # never the unfiltered (allow sysctl-read)
    names = [x[1].value for x in reads[0][2:] if isinstance(x, list) and isinstance(x[1], Str)]
    assert "hw.ncpu" in names and not [n for n in names if n.startswith(("kern.proc", "kern.procargs"))]


def test_open_network_reaches_no_unix_socket_but_the_resolvers() -> None:
    forms = [f for f in forms_of("open") if isinstance(f, list) and any("network" in str(x) for x in f[:2])]
    assert forms == [
        ["allow", "network*"],
        ["deny", "network-outbound", ["remote", "unix-socket"]],
        [
            "allow",
            "network-outbound",
            ["remote", "unix-socket", ["path-literal", Str("/private/var/run/mDNSResponder")]],
        ],
    ]


def test_signals_and_ipc_stay_inside_the_jail() -> None:
    forms = forms_of("default")
    assert ["allow", "signal", ["target", "same-sandbox"]] in forms
    assert ["allow", "ipc-posix-sem"] in forms
    assert ["allow", "ipc-posix-shm"] not in forms
    shm = [f for f in forms if isinstance(f, list) and any(str(x).startswith("ipc-posix-shm") for x in f)]
    assert shm == [["allow", "ipc-posix-shm-read-data", ["ipc-posix-name", Str("apple.shm.notification_center")]]]
    assert "notification_center" not in str([f for f in forms if isinstance(f, list) and "mach-lookup" in f])


def test_dev_fd_and_dev_zero_are_there() -> None:
    profile = CASES["default"].profile()
    assert '(allow file-read-data file-write-data (subpath "/dev/fd"))' in profile
    assert '(literal "/dev/zero")' in profile


@pytest.mark.parametrize(("name", "tls"), [("default", False), ("open", True), ("allowlist", True)])
def test_tls_trust_is_reachable_with_a_network_and_only_then(name: str, tls: bool) -> None:
    profile = CASES[name].profile()
    assert ('(global-name "com.apple.SecurityServer")' in profile) is tls
    assert ('(subpath "/private/var/db/mds")' in profile) is tls


def test_homebrew_kegs_are_readable_not_executable_only_when_something_comes_from_homebrew() -> None:
    brew = [(r.ops, p) for r, _, p in paths_allowed(CASES["default"].profile()) if p.startswith("/opt/homebrew/")]
    assert (("file-read*", "file-map-executable"), "/opt/homebrew/opt") in brew
    spec = make_spec()
    plain = compiled(spec, (SYSTEM_MOUNTS[1],), tmp_dir=TMP)
    assert "/opt/homebrew/opt" not in plain


def test_exec_allow_lists_each_link_and_the_interpreter_of_a_script(tmp_path: Path) -> None:
    interpreter = os.path.realpath("/bin/sh")
    script = tmp_path / "tool"
    script.write_text(f"#!{interpreter}\n")
    script.chmod(0o755)
    (tmp_path / "link").symlink_to(script)
    found = seatbelt_executables([str(tmp_path / "link")], "/usr/bin:/bin")
    assert {str(tmp_path / "link"), str(script), interpreter, "/bin/sh"} <= set(found)
    assert seatbelt_executables([], "/usr/bin") == ()
