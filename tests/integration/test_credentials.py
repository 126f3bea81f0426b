"""Credentials from a real Secret Service (gnome-keyring on a private D-Bus), end to end.

Bearer tokens, OAuth (login through `cellblock auth login`, refresh while serving) and `secrets:`
for jailed local servers, each through the real gateway and the real CLI. Every test ends by
looking for the secret where it must never be: every file under the test's directory (config,
state, audit, runtime), the gateway's log, and the command line of every process.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import keyring
import mcp.types as types
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from cellblock.gateway.downstream.callback import LOGIN_PORT
from tests.integration.conftest import PROBE, bus_at_the_standard_path, cli, cli_env, gateway, write_config
from tests.servers.remote_run import run_remote

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
BROWSER = ROOT / "tests" / "servers" / "browser.py"


def _text(result: object) -> str:
    return "".join(getattr(c, "text", "") for c in getattr(result, "content", []))


@pytest.fixture
def env(keyring_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """What the gateway and the CLI share: the test keyring, a private runtime dir (control sockets), state."""
    return cli_env(tmp_path, keyring_env)


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 30) -> None:
    with anyio.fail_after(timeout):
        while not await check():  # noqa: ASYNC110 - the effect is in another process; polling it is the way
            await anyio.sleep(0.3)


def assert_nowhere(secrets: list[str], root: Path, *outputs: str) -> None:
    """No secret in any file under `root`, in `outputs`, or in any process's command line."""
    assert all(len(s) >= 8 for s in secrets)  # a short "secret" would match by accident
    found: list[str] = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            found += [f"{path}" for s in secrets if s.encode() in data]
    for index, text in enumerate(outputs):
        found += [f"output #{index}" for s in secrets if s in text]
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            data = cmdline.read_bytes()
        except OSError:
            continue  # the process ended
        found += [f"argv of pid {cmdline.parent.name}" for s in secrets if s.encode() in data]
    assert not found, f"a secret leaked into: {found}"


def held_and_plain(
    forget: Callable[[str], None], script: str, env: dict[str, str] | None = None, **extra: object
) -> tuple[str, str, dict[str, Any]]:
    """A test server run twice, given $LEAK: `held` from the keyring, as a secret the gateway
    holds, and `plain` (the honest control) in plain `env:`, which it does not hold as one."""
    path = ROOT / "tests" / "servers" / script
    secret, plain = "leak-" + os.urandom(12).hex(), "plain-" + os.urandom(12).hex()
    forget("leak-key")
    keyring.set_password("cellblock", "leak-key", secret)
    base = {"command": sys.executable, "args": [str(path)], "jail": {"read_only": [str(path.parent)]}, **extra}
    servers = {
        "held": {**base, "env": {**(env or {})}, "secrets": {"LEAK": "leak-key"}},
        "plain": {**base, "env": {**(env or {}), "LEAK": plain}},
    }
    return secret, plain, servers


@pytest.fixture
def forget() -> Iterator[Callable[[str], None]]:
    """Remove keyring entries a test made, so tests do not see each other's credentials."""
    made: list[str] = []
    yield made.append
    for entry in made:
        for name in (entry, f"{entry}/oauth-tokens", f"{entry}/oauth-client"):
            with contextlib.suppress(keyring.errors.PasswordDeleteError):
                keyring.delete_password("cellblock", name)


async def test_bearer_token_from_the_keyring(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    token = "bearer-" + os.urandom(12).hex()
    forget("api")
    log = tmp_path / "gateway.log"
    with run_remote("bearer", env={"REMOTE_TOKEN": token}) as url:
        config = write_config(tmp_path, {"api": {"url": url, "auth": {"type": "bearer"}}})
        async with gateway(config, tmp_path / "state", env=env, stderr=log, serve_args=("-v",)) as client:
            missing = await client.call_tool("api__echo", {"text": "x"})
            assert missing.is_error and "cellblock auth set api" in _text(missing)

            wrong = cli(env, "auth", "set", "api", "--config", str(config), stdin="not-the-token\n")
            assert wrong.returncode == 0, wrong.stderr

            async def refused() -> bool:
                text = _text(await client.call_tool("api__echo", {"text": "x"}))
                return "HTTP 401" in text and "cellblock auth set api" in text

            await until(refused)

            right = cli(env, "auth", "set", "api", "--config", str(config), stdin=token + "\n")
            assert right.returncode == 0, right.stderr
            assert "reconnecting 'api'" in right.stderr  # the running gateway was told

            async def through() -> bool:
                return _text(await client.call_tool("api__echo", {"text": "with token"})) == "with token"

            await until(through)
            assert "api__echo" in {t.name for t in (await client.list_tools()).tools}
            listed = cli(env, "auth", "list", "--config", str(config))
            assert "api\tapi\tbearer token\tset" in listed.stdout
            assert_nowhere([token], tmp_path, wrong.stderr, right.stdout, right.stderr, listed.stdout, listed.stderr)
        assert_nowhere([token], tmp_path)

        # a token the model itself sends (say, pasted from somewhere) is still redacted in the audit log,
        # and in the echo that comes back
        async with gateway(config, tmp_path / "state", env=env) as client:
            assert _text(await client.call_tool("api__echo", {"text": f"leak {token}"})).startswith("leak [redacted]")
        audit = (tmp_path / "state" / "audit.jsonl").read_text()
        assert token not in audit and "[redacted]" in audit

    logout = cli(env, "auth", "logout", "api", "--config", str(config))
    assert logout.returncode == 0 and keyring.get_password("cellblock", "api") is None


def test_auth_set_never_takes_the_value_from_argv(tmp_path: Path, env: dict[str, str]) -> None:
    config = write_config(tmp_path, {"api": {"url": "http://127.0.0.1:9/mcp", "auth": {"type": "bearer"}}})
    done = cli(env, "auth", "set", "api", "some-token-value", "--config", str(config))
    assert done.returncode == 2 and "unrecognized arguments" in done.stderr
    unknown = cli(env, "auth", "set", "nobody", "--config", str(config), stdin="x" * 10)
    assert unknown.returncode == 2 and "nothing in the config uses keyring entry 'nobody'" in unknown.stderr
    empty = cli(env, "auth", "set", "api", "--config", str(config), stdin="")
    assert empty.returncode == 1 and "nothing stored" in empty.stderr


async def test_oauth_login_then_silent_refresh(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    forget("cloud")
    log = tmp_path / "gateway.log"
    with run_remote("oauth", lifetime=2) as url:
        config = write_config(tmp_path, {"cloud": {"url": url, "auth": {"type": "oauth"}}})
        async with gateway(config, tmp_path / "state", env=env, stderr=log, serve_args=("-v",)) as client:
            before = await client.call_tool("cloud__whoami", {})
            assert before.is_error and "cellblock auth login cloud" in _text(before)

            login = cli(
                env | {"BROWSER": f"{sys.executable} {BROWSER} %s"}, "auth", "login", "cloud", "--config", str(config)
            )
            assert login.returncode == 0, login.stderr
            assert "logged in to 'cloud'" in login.stderr

            async def first_token() -> bool:
                return "token=1" in _text(await client.call_tool("cloud__whoami", {}))

            await until(first_token)
            await anyio.sleep(2.5)  # past the access token's lifetime: the gateway refreshes it, no browser
            assert "token=2" in _text(await client.call_tool("cloud__whoami", {}))

        record = json.loads(keyring.get_password("cellblock", "cloud/oauth-tokens") or "{}")
        tokens = [record["token"]["access_token"], record["token"]["refresh_token"]]
        registered = json.loads(keyring.get_password("cellblock", "cloud/oauth-client") or "{}")  # once, kept
        # the authorization server (the SDK's) takes no public client: Cellblock asked for a secret
        assert registered["token_endpoint_auth_method"] == "client_secret_basic" and registered["client_secret"]
        tokens.append(registered["client_secret"])

        # a new gateway starts from the stored (now expired) token and refreshes it
        await anyio.sleep(2.1)
        async with gateway(config, tmp_path / "state", env=env, stderr=log) as client:
            assert "token=3" in _text(await client.call_tool("cloud__whoami", {}))
        assert_nowhere(tokens, tmp_path, login.stdout, login.stderr)


async def test_the_configured_scope_is_asked_for_at_login(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    browser = env | {"BROWSER": f"{sys.executable} {BROWSER} %s"}
    with run_remote("oauth") as url:
        for scope, granted in ((None, "scopes=mcp"), ("mcp notes.read", "scopes=mcp,notes.read")):
            forget("cloud")
            auth: dict[str, Any] = {"type": "oauth", **({"scope": scope} if scope else {})}
            config = write_config(tmp_path, {"cloud": {"url": url, "auth": auth}})
            login = cli(browser, "auth", "login", "cloud", "--config", str(config))
            assert login.returncode == 0, login.stderr
            async with gateway(config, tmp_path / "state", env=env) as client:
                # without auth.scope the server's own choice (control); with it, what it names too
                assert _text(await client.call_tool("cloud__whoami", {})).endswith(granted)


def test_a_login_to_a_server_that_asks_for_none_says_so_and_stores_nothing(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    forget("open")
    with run_remote("none") as url:
        config = write_config(tmp_path, {"open": {"url": url, "auth": {"type": "oauth"}}})
        login = cli(env, "auth", "login", "open", "--config", str(config))
    assert login.returncode == 1
    assert "answered without asking for a login, so there is nothing to store" in login.stderr
    assert "logged in" not in login.stderr
    assert keyring.get_password("cellblock", "open/oauth-tokens") is None
    assert "NOT LOGGED IN" in cli(env, "auth", "list", "--config", str(config)).stdout  # the two agree


async def test_a_pre_registered_client_logs_in_with_its_secret_from_the_keyring(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    forget("cloud")
    secret = "client-secret-" + os.urandom(12).hex()
    browser = env | {"BROWSER": f"{sys.executable} {BROWSER} %s"}
    server_env = {"REMOTE_CLIENT_SECRET": secret}
    with run_remote("oauth", env=server_env, extra=("--client-id", "pre-registered")) as url:  # no registration
        config = write_config(
            tmp_path, {"cloud": {"url": url, "auth": {"type": "oauth", "client_id": "pre-registered"}}}
        )
        # control: without its secret the client is refused at the token endpoint
        refused = cli(browser, "auth", "login", "cloud", "--config", str(config))
        assert refused.returncode == 1, refused.stderr
        assert "Traceback" not in refused.stderr  # the failure is said once, in a line, not as the SDK logs it
        stored = cli(env, "auth", "set", "cloud", "--client-secret", "--config", str(config), stdin=secret + "\n")
        assert stored.returncode == 0, stored.stderr
        listed = cli(env, "auth", "list", "--config", str(config))
        assert "cloud/oauth-client-secret\tcloud\tOAuth client secret\tset" in listed.stdout
        # the port its redirect URI names is held by another program: refused at once, not a login
        # left waiting for a callback the authorization server will never send elsewhere
        with socket.create_server(("127.0.0.1", LOGIN_PORT)):
            held = cli(browser, "auth", "login", "cloud", "--config", str(config))
        assert held.returncode == 1 and f"names port {LOGIN_PORT}" in held.stderr, held.stderr
        login = cli(browser, "auth", "login", "cloud", "--config", str(config))  # the control: the port free
        assert login.returncode == 0, login.stderr
        async with gateway(config, tmp_path / "state", env=env) as client:
            assert "client=pre-registered token=" in _text(await client.call_tool("cloud__whoami", {}))
        assert keyring.get_password("cellblock", "cloud/oauth-client") is None  # nothing registered, nothing kept
        assert_nowhere([secret], tmp_path, refused.stderr, stored.stderr, listed.stdout, login.stdout, login.stderr)
    assert cli(env, "auth", "logout", "cloud", "--config", str(config)).returncode == 0
    assert keyring.get_password("cellblock", "cloud/oauth-client-secret") is None


def test_a_client_private_key_goes_from_stdin_or_its_file_into_the_keyring_and_nowhere_else(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    forget("machine")
    key = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pem = key.decode()
    key_file = tmp_path_factory.mktemp("keys") / "machine.pem"  # outside what the gateway may write
    key_file.write_text(pem)
    body = [line for line in pem.splitlines() if "-----" not in line]  # the key's own text, line by line
    auth = {"type": "oauth", "grant": "client_credentials", "client_id": "m", "client_auth": "private_key_jwt"}
    with run_remote("oauth") as url:
        config = str(write_config(tmp_path, {"machine": {"url": url, "auth": auth}}))
        missing = cli(env, "auth", "login", "machine", "--config", config)
        assert missing.returncode == 1
        assert "store it with `cellblock auth set machine --private-key KEY.pem`" in missing.stderr
        inline = cli(env, "auth", "set", "machine", "--private-key", "-----BEGIN PRIVATE KEY-----", "--config", config)
        assert inline.returncode != 0 and "a key given as an argument is refused" in inline.stderr
        piped = cli(env, "auth", "set", "machine", "--private-key", "--config", config, stdin=pem)
        assert piped.returncode == 0, piped.stderr
        from_file = cli(env, "auth", "set", "machine", "--private-key", str(key_file), "--config", config)
        assert from_file.returncode == 0, from_file.stderr
        assert keyring.get_password("cellblock", "machine/oauth-client-key") == pem  # as the file holds it
        listed = cli(env, "auth", "list", "--config", config)
        assert "machine/oauth-client-key\tmachine\tOAuth client private key\tset" in listed.stdout
        # this test server takes no client-credentials grant: the signed request is refused, and said so
        refused = cli(env, "auth", "login", "machine", "--config", config)
        assert refused.returncode == 1 and "login to 'machine' failed" in refused.stderr
        outputs = [
            o for done in (missing, inline, piped, from_file, listed, refused) for o in (done.stdout, done.stderr)
        ]
        assert_nowhere(body, tmp_path, *outputs)
    assert cli(env, "auth", "logout", "machine", "--config", config).returncode == 0
    assert keyring.get_password("cellblock", "machine/oauth-client-key") is None


def test_an_identity_providers_id_token_and_the_clients_secret_stay_in_the_keyring(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    forget("corp")
    id_token, secret = "eyJ.idtoken-" + os.urandom(12).hex(), "client-secret-" + os.urandom(12).hex()
    with run_remote("oauth") as url:
        origin = url.rsplit("/", 1)[0]
        idp = {"token_endpoint": "http://127.0.0.1:9/token", "client_id": "idp-client"}  # nothing listens there
        auth = {"type": "oauth", "grant": "identity_assertion", "client_id": "c", "issuer": origin, "idp": idp}
        config = str(write_config(tmp_path, {"corp": {"url": url, "auth": auth}}))
        no_secret = cli(env, "auth", "login", "corp", "--config", config)
        assert no_secret.returncode == 1 and "`cellblock auth set corp --client-secret`" in no_secret.stderr
        stored = [
            cli(env, "auth", "set", "corp", flag, "--config", config, stdin=value + "\n")
            for flag, value in (("--client-secret", secret), ("--id-token", id_token))
        ]
        assert all(done.returncode == 0 for done in stored), [done.stderr for done in stored]
        assert keyring.get_password("cellblock", "corp/idp-id-token") == id_token
        listed = cli(env, "auth", "list", "--config", config)
        assert "corp/idp-id-token\tcorp\tidentity provider ID token\tset" in listed.stdout
        # the server asks for a token; the exchange at the identity provider cannot be made, and says so
        unreachable = cli(env, "auth", "login", "corp", "--config", config)
        assert unreachable.returncode == 1 and "cannot reach the identity provider" in unreachable.stderr
        done = [no_secret, *stored, listed, unreachable]
        assert_nowhere([id_token, secret], tmp_path, *(o for d in done for o in (d.stdout, d.stderr)))
    assert cli(env, "auth", "logout", "corp", "--config", config).returncode == 0
    assert keyring.get_password("cellblock", "corp/idp-id-token") is None


async def test_a_step_up_while_serving_logs_in_through_the_client_for_more_scope_then_calls_again(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    forget("cloud")
    asked: list[types.ElicitRequestURLParams] = []

    async def person(ctx: object, params: types.ElicitRequestParams) -> types.ElicitResult:
        assert isinstance(params, types.ElicitRequestURLParams), params
        asked.append(params)
        await anyio.to_thread.run_sync(subprocess.run, [sys.executable, str(BROWSER), params.url])
        return types.ElicitResult(action="accept")

    with run_remote("oauth") as url:
        config = write_config(tmp_path, {"cloud": {"url": url, "auth": {"type": "oauth"}}})
        browser = env | {"BROWSER": f"{sys.executable} {BROWSER} %s"}
        assert cli(browser, "auth", "login", "cloud", "--config", str(config)).returncode == 0  # scope: mcp
        # control: a client that cannot open URLs is told which login, not that a connection closed
        async with gateway(config, tmp_path / "state", env=env) as client:
            refused = await client.call_tool("cloud__secret_notes", {})
            assert refused.is_error and "needs a login with the scope 'mcp notes.read'" in _text(refused)
            assert "closed" not in _text(refused)
        async with gateway(config, tmp_path / "state", env=env, elicitation_callback=person) as client:
            result = await client.call_tool("cloud__secret_notes", {})
            assert not result.is_error, _text(result)
            assert _text(result) == "the secret notes"
            assert _text(await client.call_tool("cloud__whoami", {})).endswith("scopes=mcp,notes.read")
    assert len(asked) == 1 and "scope=mcp+notes.read" in asked[0].url


def _holder_and_other() -> dict[str, Any]:
    """Two jailed probes: `holder` gets keyring entry `probe-key` as PROBE_KEY, `other` nothing."""
    jail = {"read_only": [str(PROBE.parent)]}
    return {
        "holder": {
            "command": sys.executable,
            "args": [str(PROBE)],
            "jail": jail,
            "secrets": {"PROBE_KEY": "probe-key"},
        },
        "other": {"command": sys.executable, "args": [str(PROBE)], "jail": jail},
    }


async def test_secrets_reach_only_their_server_and_never_argv(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    secret = "secret-" + os.urandom(12).hex()
    forget("probe-key")
    config = write_config(tmp_path, _holder_and_other())
    log = tmp_path / "gateway.log"
    async with gateway(config, tmp_path / "state", env=env, stderr=log, serve_args=("-v",)) as client:
        missing = await client.call_tool("holder__environment", {})
        assert missing.is_error and "cellblock auth set probe-key" in _text(missing)
        stored = cli(env, "auth", "set", "probe-key", "--config", str(config), stdin=secret)
        assert stored.returncode == 0, stored.stderr
        seen: dict[str, str] = {}

        async def holder_started() -> bool:
            result = await client.call_tool("holder__environment", {})
            if result.is_error:
                return False
            seen.update(json.loads(_text(result)))
            return True

        await until(holder_started)
        assert seen["PROBE_KEY"] == hashlib.sha256(secret.encode()).hexdigest()
        # exactly what the launcher sets, plus the secret: nothing else of the gateway's environment
        # (bwrap sets PWD on --chdir; Python itself sets LC_CTYPE when it coerces a C locale)
        assert set(seen) - {"LANG", "LC_ALL", "TZ", "PWD", "LC_CTYPE"} == {"HOME", "PATH", "TMPDIR", "PROBE_KEY"}
        other = json.loads(_text(await client.call_tool("other__environment", {})))
        assert "PROBE_KEY" not in other
        assert not any(hashlib.sha256(secret.encode()).hexdigest() == v for v in other.values())
        # a server that hands a secret back (the model's, or its own) hands the model "[redacted]"
        echoed = await client.call_tool("holder__echo", {"message": f"key={secret}"})
        assert echoed.structured_content == {"message": "key=[redacted]"}
        assert _text(echoed).startswith("key=[redacted][Cellblock redacted 2 secret value(s)")
        # and another server is not even sent it (tests/integration/test_secret_arguments.py)
        assert _text(await client.call_tool("other__echo", {"message": f"key={secret}"})).startswith("refused: secret:")
        assert_nowhere([secret], tmp_path, stored.stdout, stored.stderr)  # both servers are running now


def test_a_plaintext_keyring_is_refused_unless_allowed(tmp_path: Path, env: dict[str, str]) -> None:
    data = tmp_path / "data"
    plaintext = env | {"PYTHON_KEYRING_BACKEND": "keyrings.alt.file.PlaintextKeyring", "XDG_DATA_HOME": str(data)}
    servers = {"api": {"url": "http://127.0.0.1:9/mcp", "auth": {"type": "bearer"}}}
    config = write_config(tmp_path, servers)
    refused = cli(plaintext, "auth", "set", "api", "--config", str(config), stdin="plain-text-token")
    assert refused.returncode == 1
    assert "refusing the keyring backend keyrings.alt.file.PlaintextKeyring" in refused.stderr
    assert "gnome-keyring" in refused.stderr and "allow_insecure" in refused.stderr
    assert not data.exists() or not any(p.is_file() for p in data.rglob("*"))  # nothing was written
    doctor = cli(plaintext, "doctor", "--config", str(config))
    assert doctor.returncode == 1 and "FAIL  keyring" in doctor.stdout

    allowed = write_config(tmp_path, servers, credentials={"allow_insecure": True})
    stored = cli(plaintext, "auth", "set", "api", "--config", str(allowed), stdin="plain-text-token")
    assert stored.returncode == 0, stored.stderr
    doctor = cli(plaintext, "doctor", "--config", str(allowed))
    assert "INSECURE" in doctor.stdout and "allowed by credentials.allow_insecure" in doctor.stdout


def test_no_keyring_at_all_says_what_to_install(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"api": {"url": "http://127.0.0.1:9/mcp", "auth": {"type": "bearer"}}})
    done = cli(
        {"PYTHON_KEYRING_BACKEND": "keyring.backends.fail.Keyring"},
        "auth",
        "set",
        "api",
        "--config",
        str(config),
        stdin="token-value",
    )
    assert done.returncode == 1
    assert "no keyring that can store anything" in done.stderr and "gnome-keyring" in done.stderr


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_login_needed_while_serving_goes_through_the_clients_url_elicitation(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None], mode: str
) -> None:
    forget("cloud")
    asked: list[types.ElicitRequestURLParams] = []
    browsers: list[subprocess.Popen[bytes]] = []

    async def person(ctx: object, params: types.ElicitRequestParams) -> types.ElicitResult:
        # the client opens the URL for the person, who logs in there (the stand-in browser does)
        assert isinstance(params, types.ElicitRequestURLParams), params
        asked.append(params)
        browsers.append(subprocess.Popen([sys.executable, str(BROWSER), params.url]))  # noqa: ASYNC220 - returns at once
        return types.ElicitResult(action="accept")

    with run_remote("oauth") as url:
        config = write_config(tmp_path, {"cloud": {"url": url, "auth": {"type": "oauth"}}})
        browser = env | {"BROWSER": f"{sys.executable} {BROWSER} %s"}
        assert cli(browser, "auth", "login", "cloud", "--config", str(config)).returncode == 0
        async with gateway(config, tmp_path / "state", env=env) as client:  # the catalog is seen once
            assert "token=1" in _text(await client.call_tool("cloud__whoami", {}))
        assert cli(env, "auth", "logout", "cloud", "--config", str(config)).returncode == 0

        # no elicitation: the tool error says which command to run
        async with gateway(config, tmp_path / "state", env=env, mode=mode) as client:
            refused = await client.call_tool("cloud__whoami", {})
            assert refused.is_error and "cellblock auth login cloud" in _text(refused)
        # a client that can open URLs: the login happens through it, and the call goes through
        async with gateway(config, tmp_path / "state", env=env, mode=mode, elicitation_callback=person) as client:
            result = await client.call_tool("cloud__whoami", {})
            assert not result.is_error, _text(result)
            assert "token=" in _text(result)
    assert [b.wait(30) for b in browsers] == [0]
    assert len(asked) == 1 and asked[0].message.startswith("Question from server 'cloud' (not a Cellblock approval)")
    assert asked[0].message.splitlines()[1].startswith("Log in to 'cloud'")
    assert keyring.get_password("cellblock", "cloud/oauth-tokens")


@pytest.mark.skipif(os.getuid() != 0, reason="placing a bus at /run/user/<uid> needs a mount namespace (root)")
async def test_secrets_load_when_the_client_gives_only_home_user_and_path(
    tmp_path: Path, keyring_env: dict[str, str], forget: Callable[[str], None]
) -> None:
    # Claude Desktop passes little more than HOME, USER and PATH: no DBUS_SESSION_BUS_ADDRESS, no
    # XDG_RUNTIME_DIR. The desktop session's bus is still at /run/user/<uid>/bus.
    secret = "secret-" + os.urandom(12).hex()
    forget("probe-key")
    keyring.set_password("cellblock", "probe-key", secret)
    servers = {
        "holder": {
            "command": sys.executable,
            "args": [str(PROBE)],
            "jail": {"read_only": [str(PROBE.parent)]},
            "secrets": {"PROBE_KEY": "probe-key"},
        }
    }
    config = write_config(tmp_path, servers)
    serve = [sys.executable, "-m", "cellblock.gateway.cli.main", "serve", "--config", str(config)]
    client_env = {"HOME": os.environ["HOME"], "USER": "root", "PATH": os.environ["PATH"]}
    client_env["CELLBLOCK_STATE_DIR"] = str(tmp_path / "state")
    bus_dir = str(Path(keyring_env["DBUS_SESSION_BUS_ADDRESS"].removeprefix("unix:path=").split(",")[0]).parent)

    async def environment(prefix: list[str]) -> types.CallToolResult:
        command = [*prefix, *serve]
        params = StdioServerParameters(command=command[0], args=command[1:], env=client_env)
        async with Client(params, cache=None) as client:
            return await client.call_tool("holder__environment", {})

    # control: the same start with no bus at the standard path cannot reach the keyring, and says why
    unreachable = await environment(bus_at_the_standard_path(None))
    assert unreachable.is_error
    assert "no DBUS_SESSION_BUS_ADDRESS" in _text(unreachable) and f"/run/user/{os.getuid()}/bus" in _text(unreachable)
    reached = await environment(bus_at_the_standard_path(bus_dir))
    assert not reached.is_error, _text(reached)
    assert json.loads(_text(reached))["PROBE_KEY"] == hashlib.sha256(secret.encode()).hexdigest()


@pytest.mark.skipif(os.getuid() != 0, reason="placing a bus at /run/user/<uid> needs a mount namespace (root)")
def test_doctor_checks_the_keyring_from_the_environment_a_client_gives(
    tmp_path: Path, keyring_env: dict[str, str]
) -> None:
    servers = {"holder": {"command": sys.executable, "args": [str(PROBE)], "secrets": {"PROBE_KEY": "probe-key"}}}
    config = write_config(tmp_path, servers)
    bus_dir = str(Path(keyring_env["DBUS_SESSION_BUS_ADDRESS"].removeprefix("unix:path=").split(",")[0]).parent)
    doctor = [sys.executable, "-m", "cellblock.gateway.cli.main", "doctor", "--config", str(config)]
    shell = {**os.environ, **keyring_env}  # a shell in the desktop session: the bus address is set

    def run(prefix: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*prefix, *doctor], env=shell, capture_output=True, text=True, timeout=120)

    unreachable = run(bus_at_the_standard_path(None))
    assert "OK    keyring: Secret Service" in unreachable.stdout  # from the shell, all is well
    assert "FAIL  keyring from a client" in unreachable.stdout and "no DBUS_SESSION_BUS_ADDRESS" in unreachable.stdout
    assert unreachable.returncode == 1
    reached = run(bus_at_the_standard_path(bus_dir))
    assert "OK    keyring from a client (HOME, USER and PATH only): Secret Service" in reached.stdout, reached.stdout


async def test_a_secret_a_server_writes_to_stderr_is_redacted_from_why_it_stopped(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    secret = "sk-LEAKY-" + os.urandom(12).hex()
    forget("leaky-key")
    keyring.set_password("cellblock", "leaky-key", secret)
    servers = {
        "leaky": {
            "command": "/bin/sh",
            "args": ["-c", 'echo "401 Unauthorized: key=$API_KEY rejected" >&2; exit 1'],
            "secrets": {"API_KEY": "leaky-key"},
        },
        # a held catalog, so that the status tool is offered
        "alpha": {
            "command": sys.executable,
            "args": [str(PROBE)],
            "jail": {"read_only": [str(PROBE.parent)]},
            "lock": {"enabled": True, "first": "review"},
        },
    }
    config = write_config(tmp_path, servers)
    async with gateway(config, tmp_path / "state", env=env) as client:
        refused = _text(await client.call_tool("leaky__anything", {}))
        assert "401 Unauthorized: key=[redacted] rejected" in refused and secret not in refused
        status = _text(await client.call_tool("cellblock__status", {}))
        # every server is in the status, held ones too: what a server wrote is left out of it
        assert "- leaky: " in status and "Unauthorized" not in status and "`cellblock ps`" in status
        ps = (await anyio.to_thread.run_sync(cli, env, "ps", "--json")).stdout
        assert "key=[redacted] rejected" in ps and secret not in ps
    audit = (tmp_path / "state" / "audit.jsonl").read_text()
    assert "server_start_failed" in audit and secret not in audit


async def test_secrets_a_server_hands_back_are_taken_out_of_what_the_model_sees(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    token = "bearer-" + os.urandom(12).hex()
    key = str(10**17 + int.from_bytes(os.urandom(7)) % 10**17)  # an API key of digits only: echoed as a number
    forget("api")
    forget("api-key")
    keyring.set_password("cellblock", "api", token)
    keyring.set_password("cellblock", "api-key", key)
    with run_remote("bearer", env={"REMOTE_TOKEN": token}) as url:
        # the honest control: called directly with the same headers, the server hands both back
        headers = {"Authorization": f"Bearer {token}", "X-Api-Key": key}
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(streamable_http_client(url, http_client=http), cache=None) as direct,
        ):
            echoed = (await direct.call_tool("headers", {})).structured_content
        assert echoed is not None and echoed["authorization"] == f"Bearer {token}" and echoed["x-api-key"] == int(key)

        servers = {"api": {"url": url, "auth": {"type": "bearer"}, "secrets": {"X-Api-Key": "api-key"}}}
        config = write_config(tmp_path, servers)
        async with gateway(config, tmp_path / "state", env=env) as client:
            result = await client.call_tool("api__headers", {})
            assert not result.is_error, _text(result)
            seen = json.dumps(result.model_dump(mode="json"))
            assert token not in seen and key not in seen
            assert result.structured_content is not None
            assert result.structured_content["authorization"] == "Bearer [redacted]"
            assert result.structured_content["x-api-key"] == "[redacted]"
            assert "[Cellblock redacted 4 secret value(s) it holds from this result]" in _text(result)
            # what the model sends itself is its own: an echo of it is scrubbed all the same
            assert _text(await client.call_tool("api__echo", {"text": f"leak {token}"})).startswith("leak [redacted]")
    assert_nowhere([token, key], tmp_path)


async def test_a_secret_in_a_servers_error_is_taken_out_of_what_the_model_sees(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    from mcp.shared.exceptions import MCPError

    secret, plain, servers = held_and_plain(forget, "leaky.py")
    async with gateway(write_config(tmp_path, servers), tmp_path / "state", env=env) as client:

        async def errors(server: str) -> list[str]:
            seen = [_text(await client.call_tool(f"{server}__fail", {}))]  # the fast path: a local server
            for request in (
                client.get_prompt(f"{server}__fail"),
                client.read_resource(f"cellblock://{server}/leak://fail"),
            ):
                with pytest.raises(MCPError) as caught:
                    await request
                seen.append(str(caught.value))
            return seen

        assert all(plain in text for text in await errors("plain"))
        held = await errors("held")
        assert all("failed with key [redacted]" in text for text in held), held
        assert not any(secret in text for text in held)
        # what it lists and its instructions: to the model, and into the catalogs kept on disk
        descriptions = {t.name: t.description for t in (await client.list_tools()).tools}
        assert descriptions["plain__fail"] == f"Fails with key {plain}."
        assert descriptions["held__fail"] == "Fails with key [redacted]."
        instructions = client.instructions or ""
        assert f"[plain] Signed in with key {plain}." in instructions
        assert "[held] Signed in with key [redacted]." in instructions
    assert_nowhere([secret], tmp_path, *held, instructions)


async def test_a_secret_in_a_refused_handshake_is_taken_out_of_the_reason_the_gateway_gives(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    secret, plain, servers = held_and_plain(forget, "leaky.py", env={"LEAK_AT_START": "1"})
    log = tmp_path / "gateway.log"
    async with gateway(write_config(tmp_path, servers), tmp_path / "state", env=env, stderr=log) as client:
        control = _text(await client.call_tool("plain__fail", {}))
        assert f"initialize failed with key {plain}" in control, control
        refused = _text(await client.call_tool("held__fail", {}))
        assert "initialize failed with key [redacted]" in refused, refused
        ps = (await anyio.to_thread.run_sync(cli, env, "ps", "--json")).stdout
        assert "key [redacted]" in ps
    assert plain in log.read_text()  # the log says why, with what the gateway does not hold
    assert_nowhere([secret], tmp_path, refused, ps)


async def test_a_secret_in_a_servers_own_question_or_sampling_request_never_reaches_the_user_or_model(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    secret, plain, servers = held_and_plain(forget, "forger.py", tools={"default": "allow"}, sampling="allow")
    questions: list[types.ElicitRequestParams] = []
    prompts: list[str] = []

    async def elicit(ctx: object, params: types.ElicitRequestParams) -> types.ElicitResult:
        questions.append(params)
        return types.ElicitResult(action="accept", content={} if params.mode == "form" else None)

    async def sample(ctx: object, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        prompts.append(json.dumps(params.model_dump(mode="json")))
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="ok"), model="m")

    config = write_config(tmp_path, servers)
    async with gateway(
        config, tmp_path / "state", env=env, elicitation_callback=elicit, sampling_callback=sample
    ) as client:
        for server, shown in (("plain", plain), ("held", "[redacted]")):
            await client.call_tool(f"{server}__ask_as", {"message": "Enter the code for key $LEAK"})
            assert questions[-1].message.endswith(f"Enter the code for key {shown}"), questions[-1].message
            await client.call_tool(f"{server}__sample", {"message": "Summarise key $LEAK"})
            assert f"Summarise key {shown}" in prompts[-1]
        seen = len(questions)
        control = await client.call_tool("plain__open_url", {"url": "https://example.com/?k=$LEAK"})
        assert "answer: accept" in _text(control) and questions[-1].url == f"https://example.com/?k={plain}"
        # a page the user opens could be handed the secret: the question is not shown at all
        refused = await client.call_tool("held__open_url", {"url": "https://example.com/?k=$LEAK"})
        assert "answer: decline" in _text(refused) and len(questions) == seen + 1
    events = [json.loads(line) for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    assert any(e["event"] == "elicitation_refused" and e["server"] == "held" for e in events)
    assert_nowhere([secret], tmp_path, *prompts, *(q.model_dump_json() for q in questions))


async def test_a_secret_passed_as_a_number_never_reaches_the_audit_log(
    tmp_path: Path, env: dict[str, str], forget: Callable[[str], None]
) -> None:
    digits = str(int.from_bytes(os.urandom(8)) % 9 * 10**17 + 10**17 + int.from_bytes(os.urandom(7)) % 10**17)
    plain = 112233445566778899  # control: a number the gateway does not hold is written as it is
    forget("probe-key")
    keyring.set_password("cellblock", "probe-key", digits)
    config = write_config(tmp_path, _holder_and_other())
    async with gateway(config, tmp_path / "state", env=env) as client:
        assert not (await client.call_tool("holder__environment", {})).is_error  # the secret is fetched
        await client.call_tool("other__echo", {"message": int(digits)})
        await client.call_tool("other__echo", {"message": [float(digits[:9] + ".5"), plain]})
    calls = [
        e
        for e in map(json.loads, (tmp_path / "state" / "audit.jsonl").read_text().splitlines())
        if e["event"] == "call"
    ]
    assert [c["arguments"] for c in calls if c["tool"] == "echo"] == [
        {"message": "[redacted]"},
        {"message": [float(digits[:9] + ".5"), plain]},
    ]
    report = cli(env, "audit", "--json", "--config", str(config))
    assert report.returncode == 0 and str(plain) in report.stdout
    assert_nowhere([digits], tmp_path, report.stdout, report.stderr)
