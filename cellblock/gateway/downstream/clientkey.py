"""A pre-registered OAuth client that proves itself with a signed JWT (`private_key_jwt`, RFC 7523).

The private key (PEM) is the keyring entry `<server>/oauth-client-key`, stored by
`cellblock auth set NAME --private-key`. The assertion itself is made by the SDK
(`SignedJWTParameters`, PyJWT underneath): this module only reads the key's type, to pick the
signing algorithm the authorization server takes for it, and says plainly what is wrong with a
key that cannot be used. No message here quotes the key.
"""

from __future__ import annotations

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key
from mcp.client.auth.extensions.client_credentials import SignedJWTParameters

from cellblock.gateway.credentials import CredentialError

__all__ = ["ASSERTION_TYPE", "client_assertion", "key_algorithms", "signing_algorithm"]

ASSERTION_TYPE = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
# How long an assertion is good for: it is made for one token request, sent at once.
ASSERTION_SECONDS = 60
# The JWS algorithms (RFC 7518, RFC 8037) each kind of key signs with, the usual one first.
_RSA = ["RS256", "PS256", "RS384", "PS384", "RS512", "PS512"]
_CURVES = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


def key_algorithms(pem: str) -> list[str]:
    """The algorithms the private key `pem` can sign with, the usual one first.

    Raises:
        CredentialError: it is not an unencrypted PEM private key of a kind JWTs are signed with.
    """
    try:
        key = load_pem_private_key(pem.encode(), password=None)
    except TypeError:  # the message names the case; the key is never in it
        raise CredentialError(
            "the private key is encrypted; give it unencrypted (the keyring is what protects it): "
            "`openssl pkey -in key.pem -out plain.pem`"
        ) from None
    except (ValueError, UnsupportedAlgorithm):
        raise CredentialError(
            "that is not a PEM private key (-----BEGIN PRIVATE KEY----- ...); nothing stored"
        ) from None
    if isinstance(key, rsa.RSAPrivateKey):
        return list(_RSA)
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name in _CURVES:
        return [_CURVES[key.curve.name]]
    if isinstance(key, ed25519.Ed25519PrivateKey | ed448.Ed448PrivateKey):
        return ["EdDSA"]
    raise CredentialError("the private key is of a kind JWTs are not signed with (RSA, EC P-256/384/521, Ed25519)")


def signing_algorithm(pem: str, supported: list[str] | None) -> str:
    """The algorithm to sign with: the key's usual one, or the first of its own that the
    authorization server lists (`token_endpoint_auth_signing_alg_values_supported`).

    Raises:
        CredentialError: the key is unusable, or the server takes none of its algorithms.
    """
    own = key_algorithms(pem)
    if not supported:
        return own[0]
    taken = [alg for alg in own if alg in supported]
    if not taken:
        raise CredentialError(
            f"the authorization server takes client assertions signed with {', '.join(supported)}; "
            f"this key signs with {', '.join(own)}"
        )
    return taken[0]


async def client_assertion(client_id: str, pem: str, audience: str, supported: list[str] | None) -> str:
    """A client assertion for `client_id` (RFC 7523 section 3: `iss` and `sub` the client id, `aud`
    the authorization server's issuer, a short life and a unique `jti`), signed by the SDK."""
    parameters = SignedJWTParameters(
        issuer=client_id,
        subject=client_id,
        signing_key=pem,
        signing_algorithm=signing_algorithm(pem, supported),
        lifetime_seconds=ASSERTION_SECONDS,
    )
    return await parameters.create_assertion_provider()(audience)
