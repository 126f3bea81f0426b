"""A pre-registered OAuth client that proves itself with a signed JWT (`client_auth: private_key_jwt`):
the assertion the token request carries, the algorithm picked for the key, and how a key gets
into the keyring (`cellblock auth set NAME --private-key`) and what is refused on the way.

The assertions are checked with the public key, as an authorization server would check them.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import jwt
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from cellblock.gateway.cli.auth import auth_set, read_private_key
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import ConfigError
from cellblock.gateway.credentials import CredentialError, Keyring, client_key_entry
from cellblock.gateway.downstream.clientkey import key_algorithms, signing_algorithm
from tests.gateway.downstream.test_oauth import METADATA, anyio_backend, machine, server

__all__ = ["anyio_backend", "server"]  # fixtures, used by name

ISSUER = "https://auth.example/"


def pem_of(key: Any, password: bytes | None = None) -> str:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption).decode()


@pytest.fixture(scope="module")
def ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def form_of(request: Any) -> dict[str, str]:
    return {name: values[0] for name, values in parse_qs(request.content.decode()).items()}


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("kind", "supported", "alg"),
    [
        ("ec", ["ES256"], "ES256"),  # what the conformance suite's authorization server takes
        ("ec", None, "ES256"),  # nothing said: the key's own
        ("rsa", None, "RS256"),
        ("rsa", ["ES256", "PS256"], "PS256"),  # the first of the key's that the server lists
    ],
)
async def test_the_token_request_carries_an_assertion_signed_with_the_key_in_the_keyring(
    server: str,
    kind: str,
    supported: list[str] | None,
    alg: str,
    ec_key: ec.EllipticCurvePrivateKey,
    rsa_key: rsa.RSAPrivateKey,
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = ec_key if kind == "ec" else rsa_key
    pem = pem_of(key)
    Keyring().set(client_key_entry(server), pem)
    told: list[str] = []
    provider = await machine(server, "notes.read", client_auth="private_key_jwt", on_secret=told.append)
    provider.context.oauth_metadata = METADATA.model_copy(
        update={
            "token_endpoint_auth_methods_supported": ["private_key_jwt"],
            "token_endpoint_auth_signing_alg_values_supported": supported,
        }
    )
    with caplog.at_level(logging.DEBUG):
        request = await provider._perform_authorization()
    form = form_of(request)
    assert (request.method, str(request.url)) == ("POST", "https://auth.example/token")
    assert form["grant_type"] == "client_credentials" and form["scope"] == "notes.read"
    assert form["client_assertion_type"] == "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
    assert "client_secret" not in form and "Authorization" not in request.headers  # no secret: the key proves it
    assertion = form["client_assertion"]
    assert jwt.get_unverified_header(assertion)["alg"] == alg
    claims = jwt.decode(assertion, key.public_key(), algorithms=[alg], audience=ISSUER)
    assert claims["iss"] == claims["sub"] == "machine"
    assert claims["jti"] and 0 < claims["exp"] - claims["iat"] <= 60 and abs(claims["iat"] - time.time()) < 30
    # the audit log is told both the key and the assertion, so either is redacted where it turns up
    assert told == [pem, assertion]
    assert "PRIVATE KEY" not in caplog.text and assertion not in caplog.text
    again = form_of(await provider._perform_authorization())["client_assertion"]
    assert jwt.decode(again, key.public_key(), algorithms=[alg], audience=ISSUER)["jti"] != claims["jti"]


@pytest.mark.anyio
async def test_without_the_key_the_error_says_which_command_stores_it(server: str) -> None:
    provider = await machine(server, None, client_auth="private_key_jwt")
    with pytest.raises(CredentialError, match=f"cellblock auth set {server} --private-key KEY.pem"):
        await provider._perform_authorization()


def test_an_authorization_server_that_takes_none_of_the_keys_algorithms_says_which_it_takes(
    ec_key: ec.EllipticCurvePrivateKey,
) -> None:
    pem = pem_of(ec_key)
    with pytest.raises(CredentialError, match="signed with RS256, PS256; this key signs with ES256"):
        signing_algorithm(pem, ["RS256", "PS256"])
    assert signing_algorithm(pem, ["RS256", "ES256"]) == "ES256"  # the control


def test_what_cannot_sign_is_refused_without_quoting_it(
    ec_key: ec.EllipticCurvePrivateKey, rsa_key: rsa.RSAPrivateKey
) -> None:
    public = ec_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    cases = {
        "not-a-key-" * 8: "not a PEM private key",
        public.decode(): "not a PEM private key",  # a public key, pasted by mistake
        pem_of(rsa_key, b"passphrase"): "the private key is encrypted; give it unencrypted",
    }
    for text, said in cases.items():
        with pytest.raises(CredentialError, match=said) as refused:
            key_algorithms(text)
        assert text.splitlines()[1 if "BEGIN" in text else 0][:40] not in str(refused.value)
    assert key_algorithms(pem_of(ec.generate_private_key(ec.SECP384R1()))) == ["ES384"]


@pytest.fixture
def key_file(tmp_path: Path, ec_key: ec.EllipticCurvePrivateKey) -> Path:
    path = tmp_path / "client.pem"
    path.write_text(pem_of(ec_key))
    path.chmod(0o600)
    return path


def test_a_key_is_read_from_its_file_or_stdin_and_never_from_the_argument(key_file: Path) -> None:
    pem = key_file.read_text()
    assert read_private_key("s/oauth-client-key", str(key_file)) == pem
    assert read_private_key("s/oauth-client-key", "-", io.StringIO(pem)) == pem
    with pytest.raises(CredentialError, match="a key given as an argument is refused"):
        read_private_key("s/oauth-client-key", pem)
    with pytest.raises(CredentialError, match=r"cannot read the key file .*missing\.pem: FileNotFoundError"):
        read_private_key("s/oauth-client-key", str(key_file.parent / "missing.pem"))

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    # a PEM cannot be typed at a hidden prompt: the error says how to give it
    with pytest.raises(CredentialError, match=r"as a file \(--private-key KEY.pem\) or on stdin"):
        read_private_key("s/oauth-client-key", "-", Terminal())


@pytest.fixture
def signed_config(server: str) -> Iterator[Any]:
    auth = {"type": "oauth", "grant": "client_credentials", "client_id": "m", "client_auth": "private_key_jwt"}
    servers = {server: {"url": "https://api.example/mcp", "auth": auth}, "plain": {"url": "https://b.example/mcp"}}
    yield parse_config(yaml.safe_dump({"version": 1, "servers": servers}))


def test_auth_set_stores_a_usable_key_and_nothing_else(server: str, signed_config: Any, key_file: Path) -> None:
    notified: list[str] = []
    entry = client_key_entry(server)
    junk = key_file.parent / "junk.pem"
    junk.write_text("-----BEGIN PRIVATE KEY-----\nnot base64 at all\n-----END PRIVATE KEY-----\n")
    with pytest.raises(CredentialError, match="not a PEM private key"):
        auth_set(signed_config, entry, notified.append, key_file=str(junk))
    assert Keyring().get(entry) is None and notified == []
    assert auth_set(signed_config, entry, notified.append, key_file=str(key_file)) == 0
    assert Keyring().get(entry) == key_file.read_text() and notified == [server]
    # a server that does not sign its assertions has no key to set: the error says what to configure
    with pytest.raises(ConfigError, match="client_auth: private_key_jwt"):
        auth_set(signed_config, client_key_entry("plain"), notified.append, key_file=str(key_file))
