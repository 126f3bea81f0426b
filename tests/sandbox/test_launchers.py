"""Launcher discovery: what of an interpreter's installation is shared, and what never is."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from cellblock.sandbox.launchers import launcher_mounts, resolve_command
from cellblock.sandbox.types import JailError


def paths(executable: str, home: str, search: str = "/usr/bin") -> list[str]:
    return [m.path for m in launcher_mounts(executable, home, search)]


def make_prefix(root: Path, name: str = "python3") -> Path:
    """An interpreter installed at `root` as real ones are: `bin/` next to the library directory
    its kind keeps there (`lib/python3.11/os.py`, `lib/node_modules`); the interpreter is a script
    with a valid `#!`, which the kernel runs as an interpreter too."""
    (root / "bin").mkdir(parents=True)
    real = root / "bin" / ("node" if name == "node" else "python3.11")
    real.write_text("#!/bin/sh\n")
    real.chmod(0o755)
    if name == "node":
        (root / "lib" / "node_modules").mkdir(parents=True)
    else:
        (root / "lib" / "python3.11").mkdir(parents=True)
        (root / "lib" / "python3.11" / "os.py").write_text("")
    binary = root / "bin" / name
    if binary != real:
        binary.symlink_to(real.name)
    return binary


def test_an_interpreter_under_home_shares_its_prefix_only(tmp_path: Path) -> None:
    home = tmp_path / "home"
    binary = make_prefix(home / ".pyenv" / "versions" / "3.11.7")
    assert paths(str(binary), str(home)) == [str(home / ".pyenv" / "versions" / "3.11.7")]


def test_a_virtualenv_shares_itself_and_its_base_interpreter(tmp_path: Path) -> None:
    home = tmp_path / "home"
    base = make_prefix(home / ".pyenv" / "versions" / "3.11.7")
    venv = tmp_path / "proj" / ".venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {base.parent}\n")
    (venv / "bin" / "python").symlink_to(base)
    shared = paths(str(venv / "bin" / "python"), str(home))
    assert str(venv) in shared and str(base.parent.parent) in shared
    assert str(home) not in shared


def test_a_script_shares_its_interpreter_through_its_shebang(tmp_path: Path) -> None:
    home = tmp_path / "home"
    node = make_prefix(home / ".nvm" / "versions" / "node" / "v24", "node")
    script = tmp_path / "tool" / "bin" / "cli"
    script.parent.mkdir(parents=True)
    script.write_text(f"#!{node}\nconsole.log(1)\n")
    shared = paths(str(script), str(home))
    assert str(home / ".nvm" / "versions" / "node" / "v24") in shared


def test_env_shebangs_are_resolved_on_the_search_path(tmp_path: Path) -> None:
    home = tmp_path / "home"
    node = make_prefix(tmp_path / "opt" / "node", "node")
    script = tmp_path / "s" / "cli"
    script.parent.mkdir()
    script.write_text("#!/usr/bin/env -S node --flag\n")
    assert str(tmp_path / "opt" / "node") in paths(str(script), str(home), search=str(node.parent))


@pytest.mark.parametrize("where", ["", ".local", "bin"])
def test_a_program_directly_in_home_never_shares_the_home(tmp_path: Path, where: str) -> None:
    home = tmp_path / "home"
    folder = home / where / "bin" if where == ".local" else home / where if where else home
    folder.mkdir(parents=True, exist_ok=True)
    binary = folder / "uvx"
    binary.write_text("")
    binary.chmod(0o755)
    assert paths(str(binary), str(home)) == [str(binary)]


def test_system_programs_need_no_mount() -> None:
    assert paths("/usr/bin/env", "/root") == []


def test_this_pythons_installation_is_found() -> None:
    shared = paths(sys.executable, os.path.expanduser("~"))
    real = os.path.realpath(sys.executable)
    assert any(real.startswith(p) for p in shared) or real.startswith("/usr/")


def test_an_unknown_command_is_refused() -> None:
    with pytest.raises(JailError, match="command not found"):
        resolve_command("surely-not-a-command-xyz", "/usr/bin")


# --- what each kind of installation shares, and why (built in a temporary fake home) ----------


def mounts(executable: Path | str, home: Path, search: str = "/usr/bin") -> dict[str, str]:
    return {m.path: m.why for m in launcher_mounts(str(executable), str(home), search)}


def executable(path: Path, text: str = "#!/bin/sh\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def elf(path: Path) -> Path:
    """A real small binary, copied: what `cargo install` or a release download leaves."""
    true = shutil.which("true")
    assert true is not None
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(os.path.realpath(true), path)
    path.chmod(0o755)
    return path


def make_venv(venv: Path, base: Path, *, copies: bool = False) -> Path:
    """A virtualenv as `python -m venv` makes one: pyvenv.cfg, bin/python linked (or copied) from `base`."""
    (venv / "bin").mkdir(parents=True)
    (venv / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text(f"home = {base.parent}\ninclude-system-site-packages = false\nversion = 3.11.7\n")
    python = venv / "bin" / "python"
    if copies:
        shutil.copy(base, python)
    else:
        python.symlink_to(base)
    return python


@pytest.mark.parametrize(
    "prefix",
    [
        ".pyenv/versions/3.11.7",
        ".local/share/uv/python/cpython-3.12.8-linux-x86_64-gnu",
        "miniforge3",
        "miniforge3/envs/tools",
        ".asdf/installs/python/3.11.7",
    ],
)
def test_a_python_install_is_shared_whole_as_a_python_install(tmp_path: Path, prefix: str) -> None:
    home = tmp_path / "home"
    binary = make_prefix(home / prefix)
    assert mounts(binary, home) == {str(home / prefix): "python install, for the command itself"}


@pytest.mark.parametrize(
    "prefix",
    [
        ".nvm/versions/node/v20.11.0",
        ".local/share/fnm/node-versions/v20.11.0/installation",
        ".volta/tools/image/node/20.11.0",
        ".asdf/installs/nodejs/20.11.0",
    ],
)
def test_a_node_install_is_shared_whole_and_its_manager_is_not(tmp_path: Path, prefix: str) -> None:
    home = tmp_path / "home"
    node = make_prefix(home / prefix, "node")
    (home / prefix.split("/")[0] / "secret.txt").write_text("a token the manager keeps\n")
    npx = executable(home / prefix / "lib/node_modules/npm/bin/npx-cli.js", "#!/usr/bin/env node\n")
    (home / prefix / "lib/node_modules/npm/package.json").write_text("{}")
    (home / prefix / "bin/npx").symlink_to("../lib/node_modules/npm/bin/npx-cli.js")
    shared = mounts(home / prefix / "bin/npx", home, search=str(node.parent))
    assert shared == {str(home / prefix): "node install, for the command itself"}
    assert npx.exists()


def test_a_script_installed_in_a_python_prefix_shares_that_prefix(tmp_path: Path) -> None:
    home = tmp_path / "home"
    python = make_prefix(home / "miniforge3")
    conda = executable(home / "miniforge3/bin/conda", f"#!{python}\nimport conda\n")
    assert list(mounts(conda, home)) == [str(home / "miniforge3")]


def test_a_homebrew_keg_is_shared_and_the_homebrew_prefix_is_not(tmp_path: Path) -> None:
    brew = tmp_path / "linuxbrew" / ".linuxbrew"
    keg = brew / "Cellar/node/20.11.0"
    make_prefix(keg, "node")
    (brew / "var").mkdir(parents=True)
    (brew / "var/postgres.db").write_text("the data of a service Homebrew runs\n")
    (brew / "lib/node_modules").mkdir(parents=True)  # the prefix links every keg's packages here
    (brew / "bin").mkdir()
    (brew / "bin/node").symlink_to("../Cellar/node/20.11.0/bin/node")
    shared = mounts(brew / "bin/node", tmp_path / "home")
    assert shared == {
        str(brew / "bin/node"): "the command itself",
        str(keg): "node install, for the command itself, through the link " + str(brew / "bin/node"),
    }


def test_an_install_prefix_with_shared_libraries_is_shared(tmp_path: Path) -> None:
    tool = elf(tmp_path / "opt/tool/bin/tool")
    (tmp_path / "opt/tool/lib").mkdir()
    (tmp_path / "opt/tool/lib/libtool.so.1").write_text("")
    assert mounts(tool, tmp_path / "home") == {str(tmp_path / "opt/tool"): "install prefix, for the command itself"}


def test_a_virtualenv_says_why_it_and_its_base_are_shared(tmp_path: Path) -> None:
    home = tmp_path / "home"
    base = make_prefix(home / ".pyenv/versions/3.11.7")
    venv = tmp_path / "proj/.venv"
    python = make_venv(venv, base)
    assert mounts(python, home) == {
        str(venv): "virtualenv, for the command itself",
        str(home / ".pyenv/versions/3.11.7"): f"python install, for the command itself, through the link {python}",
    }


def test_a_virtualenv_with_copies_still_finds_its_base_through_home(tmp_path: Path) -> None:
    home = tmp_path / "home"
    base = make_prefix(home / ".pyenv/versions/3.11.7")
    python = make_venv(tmp_path / "proj/.venv", base.resolve(), copies=True)
    assert str(home / ".pyenv/versions/3.11.7") in mounts(python, home)


def test_a_pipx_tool_shares_its_link_and_its_virtualenv_not_local(tmp_path: Path) -> None:
    home = tmp_path / "home"
    base = make_prefix(home / ".pyenv/versions/3.11.7")
    venv = home / ".local/share/pipx/venvs/tool"
    make_venv(venv, base)
    executable(venv / "bin/tool", f"#!{venv}/bin/python\n")
    link = home / ".local/bin/tool"
    link.parent.mkdir(parents=True)
    link.symlink_to(venv / "bin/tool")
    shared = mounts(link, home)
    assert shared[str(link)] == "the command itself"
    assert str(venv) in shared and str(home / ".pyenv/versions/3.11.7") in shared
    assert str(home / ".local") not in shared and len(shared) == 3


def test_a_node_modules_bin_shares_the_node_modules_and_not_the_project(tmp_path: Path) -> None:
    home = tmp_path / "home"
    node = make_prefix(tmp_path / "node", "node")
    modules = home / "proj/node_modules"
    executable(modules / "srv/dist/cli.js", "#!/usr/bin/env node\n")
    (modules / "srv/package.json").write_text("{}")
    (modules / ".bin").mkdir()
    (modules / ".bin/srv").symlink_to("../srv/dist/cli.js")
    (home / "proj/.env").write_text("API_KEY=secret\n")
    shared = mounts(modules / ".bin/srv", home, search=str(node.parent))
    assert list(shared) == [str(modules), str(tmp_path / "node")]
    assert shared[str(modules)] == "node packages, for the command itself"


# --- what is never shared ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("folder", "secret"),
    [(".cargo/bin", ".cargo/credentials.toml"), (".docker/bin", ".docker/config.json"), (".deno/bin", ".deno/token")],
)
def test_a_lone_binary_in_a_dot_directory_is_shared_as_the_one_file(tmp_path: Path, folder: str, secret: str) -> None:
    home = tmp_path / "home"
    tool = elf(home / folder / "tool")
    (home / secret).write_text("token = 'secret'\n")
    assert mounts(tool, home) == {str(tool): "the command itself"}


def test_each_hop_of_a_link_chain_outside_an_installation_is_one_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    rustup = elf(home / ".cargo/bin/rustup")
    (home / ".cargo/bin/cargo").symlink_to("rustup")
    (home / ".cargo/credentials.toml").write_text("token = 'secret'\n")
    assert mounts(home / ".cargo/bin/cargo", home) == {
        str(home / ".cargo/bin/cargo"): "the command itself",
        str(rustup): f"the command itself, through the link {home / '.cargo/bin/cargo'}",
    }


@pytest.mark.parametrize("where", ["", ".local"])
def test_the_home_or_a_catch_all_laid_out_like_a_python_install_is_never_shared(tmp_path: Path, where: str) -> None:
    home = tmp_path / "home"
    binary = make_prefix(home / where if where else home)
    assert list(mounts(binary, home)) == [str(binary), str(binary.parent / "python3.11")]


def ssh_dir(home: Path) -> Path:
    ssh = home / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "id_ed25519").write_text("-----BEGIN FAKE PRIVATE KEY-----\n")
    (ssh / "id_ed25519").chmod(0o600)
    return ssh


@pytest.mark.parametrize(
    "interpreter",
    [
        ".ssh/id_ed25519",  # a key file: not executable
        ".ssh",  # a directory
        ".ssh/notes",  # executable, but neither ELF nor a script with a valid #!
        ".ssh/loop",  # a script whose #! names itself
    ],
)
def test_a_shebang_naming_what_is_not_an_interpreter_is_never_followed(tmp_path: Path, interpreter: str) -> None:
    home = tmp_path / "home"
    ssh = ssh_dir(home)
    executable(ssh / "notes", "not a program\n")
    executable(ssh / "loop", f"#!{ssh / 'loop'}\n")
    script = executable(tmp_path / "tools/run", f"#!{home / interpreter}\n")
    assert mounts(script, home) == {str(script): "the command itself"}


def test_an_interpreter_inside_a_secret_directory_is_shared_as_that_one_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    helper = executable(ssh_dir(home) / "helper")
    script = executable(tmp_path / "tools/run", f"#!{helper}\n")
    assert mounts(script, home) == {
        str(script): "the command itself",
        str(helper): f"interpreter named by #! of {script}",
    }


def test_an_env_shebang_never_follows_a_name_that_is_not_an_interpreter(tmp_path: Path) -> None:
    home = tmp_path / "home"
    ssh = ssh_dir(home)
    script = executable(tmp_path / "tools/run", "#!/usr/bin/env id_ed25519\n")
    assert mounts(script, home, search=str(ssh)) == {str(script): "the command itself"}


def test_a_relative_shebang_is_never_followed(tmp_path: Path) -> None:
    home = tmp_path / "home"
    make_prefix(tmp_path / "tools")
    script = executable(tmp_path / "run", "#!tools/bin/python3\n")
    assert mounts(script, home) == {str(script): "the command itself"}


@pytest.mark.parametrize("python", ["missing", "directory", "not-an-interpreter"])
def test_a_virtualenv_home_in_a_secret_directory_shares_nothing_of_it(tmp_path: Path, python: str) -> None:
    home = tmp_path / "home"
    aws = home / ".aws"
    aws.mkdir(parents=True)
    (aws / "credentials").write_text("aws_secret_access_key = secret\n")
    if python == "directory":
        (aws / "python3").mkdir()
    elif python == "not-an-interpreter":
        executable(aws / "python3", "aws_secret_access_key = secret\n")
    venv = home / "proj/.venv"
    make_venv(venv, make_prefix(tmp_path / "py"))
    (venv / "pyvenv.cfg").write_text(f"home = {aws}\n")
    tool = executable(venv / "bin/tool", f"#!{venv / 'bin/python'}\n")
    shared = mounts(tool, home)
    assert str(venv) in shared and not any(p == str(aws) or p.startswith(f"{aws}/") for p in shared)


def test_a_virtualenv_home_is_followed_only_to_its_python(tmp_path: Path) -> None:
    home = tmp_path / "home"
    ssh = ssh_dir(home)
    python = elf(ssh / "python3")
    venv = home / "proj/.venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").symlink_to("/usr/bin/python3")
    (venv / "pyvenv.cfg").write_text(f"home = {ssh}\n")
    shared = mounts(venv / "bin/python", home)
    assert shared == {
        str(venv): "virtualenv, for the command itself",
        str(python): f"base interpreter of virtualenv {venv}",
    }


def test_a_link_through_a_linked_directory_goes_where_the_kernel_goes(tmp_path: Path) -> None:
    """`bin/run -> sub/../real` with `sub` a link elsewhere: the kernel runs `elsewhere/../real`,
    not the decoy `bin/real` that dropping `sub/..` by name would find (and follow to ~/.ssh)."""
    home = tmp_path / "home"
    helper = executable(ssh_dir(home) / "helper")
    (tmp_path / "far/dir").mkdir(parents=True)
    real = executable(tmp_path / "far/real")
    decoy = executable(tmp_path / "tools/real", f"#!{helper}\n")
    (tmp_path / "tools/sub").symlink_to(tmp_path / "far/dir")
    (tmp_path / "tools/run").symlink_to("sub/../real")
    shared = mounts(tmp_path / "tools/run", home)
    assert str(real) in shared and str(decoy) not in shared and str(helper) not in shared


def test_a_directory_is_refused_as_a_command(tmp_path: Path) -> None:
    with pytest.raises(JailError, match="is not a file"):
        resolve_command(str(tmp_path), "/usr/bin")


def test_uv_installed_by_its_own_installer_shares_uvx_and_the_uv_it_runs_and_nothing_else(tmp_path: Path) -> None:
    from tests import peers

    home = tmp_path / "home"
    uvx = peers.uv_standalone(home / ".local" / "bin")
    (home / ".local" / "bin" / "deploy-token").write_text("secret\n")  # what else lives in ~/.local/bin
    assert paths(str(uvx), str(home)) == [str(uvx), str(uvx.parent / "uv")]


@pytest.mark.jail
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_uvx_from_uvs_installer_runs_its_uv_in_a_jail(tmp_path: Path) -> None:
    from cellblock.sandbox.bwrap import bwrap_plan
    from cellblock.sandbox.spawn import run_plan
    from cellblock.sandbox.types import JailSpec
    from tests import peers

    home = tmp_path / "home"
    uvx = peers.uv_standalone(home / ".local" / "bin")
    # offline and with an empty cache, uv itself answers that it cannot resolve the package
    argv = (str(uvx), "--offline", "mcp-server-none")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "UV_CACHE_DIR": "/tmp/uv"}
    spec = JailSpec("uv", argv, env, home=str(home))
    mounts = launcher_mounts(str(uvx), str(home), "/usr/bin:/bin")
    ran = run_plan(bwrap_plan(spec, mounts), 60)
    assert "No solution found" in ran.stderr and "Could not find" not in ran.stderr, ran.stderr
    # control: the same jail without the uv beside it fails as uvx did before
    alone = [m for m in mounts if not m.path.endswith("/uv")]
    failed = run_plan(bwrap_plan(spec, alone), 60)
    assert failed.returncode != 0 and "Could not find the `uv` binary" in failed.stderr


def test_what_a_launcher_needs_and_its_jail_lacks_is_named(tmp_path: Path) -> None:
    from cellblock.sandbox.launchers import launcher_gaps
    from tests import peers

    home = tmp_path / "home"
    uvx = peers.uv_standalone(home / ".local" / "bin")
    mounts = [m.path for m in launcher_mounts(str(uvx), str(home), "/usr/bin")]
    assert launcher_gaps(str(uvx), "/usr/bin:/bin", mounts) == []
    (uvx.parent / "uv").unlink()  # a uvx copied somewhere without its uv
    assert any("uvx runs the uv beside it" in g for g in launcher_gaps(str(uvx), "/usr/bin:/bin", []))

    shim = home / ".pyenv" / "shims" / "python"
    shim.parent.mkdir(parents=True)
    shim.write_text('#!/bin/sh\nexec pyenv exec python "$@"\n')
    shim.chmod(0o755)
    assert any("version manager's shim" in g for g in launcher_gaps(str(shim), "/usr/bin:/bin", [str(shim)]))

    # `#!/usr/bin/env mynode`: found where the jail shows it, named where it does not
    node = make_prefix(home / "tools" / "node", "node")
    (node.parent / "mynode").symlink_to("node")
    script = tmp_path / "srv" / "cli.js"
    script.parent.mkdir()
    script.write_text("#!/usr/bin/env mynode\n")
    script.chmod(0o755)
    jail_path = f"{node.parent}:/usr/bin:/bin"
    shown = [str(script), str(home / "tools" / "node")]
    assert launcher_gaps(str(script), jail_path, shown) == []
    gaps = launcher_gaps(str(script), "/usr/bin:/bin", [str(script)])
    assert len(gaps) == 1 and "#!/usr/bin/env mynode" in gaps[0] and "no mynode on its PATH" in gaps[0]


def test_env_in_a_shebang_runs_its_whole_argument_as_one_program_unless_split(tmp_path: Path) -> None:
    from cellblock.sandbox.launchers import env_program

    assert env_program("node") == "node"
    assert env_program("tool x") == "tool x"  # the kernel passes one word: env looks for "tool x"
    assert env_program("-S node --flag") == "node"
    assert env_program("--split-string=PATH=/x node") == "node"


@pytest.mark.parametrize("platform", ["darwin", "linux"])
def test_on_macos_a_tool_whose_shebang_names_a_mach_o_python_shares_that_python(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, platform: str
) -> None:
    """uv's managed Pythons are Mach-O programs on macOS: a uv tool's `#!` python is followed there."""
    monkeypatch.setattr(sys, "platform", platform)
    home = tmp_path / "home"
    prefix = home / ".local/share/uv/python/cpython-3.12.8-macos-aarch64-none"
    python = make_prefix(prefix)
    python.resolve().write_bytes(b"\xcf\xfa\xed\xfe" + bytes(60))  # a thin 64-bit Mach-O program
    tool = home / ".local/share/uv/tools/fs/bin"
    tool.mkdir(parents=True)
    (tool / "python").symlink_to(python)
    script = executable(tool / "fs-server", f"#!{tool / 'python'}\n")
    shared = mounts(script, home)
    assert (str(prefix) in shared) is (platform == "darwin")
