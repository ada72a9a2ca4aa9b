"""Material for the edge guard tests: signing keys of every family, token claims, and the trivial downstream
the guards sit in front of."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jwt
from aiohttp import web
from aiohttp.test_utils import TestClient
from aiohttp.typedefs import Middleware
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa

from fleetserve.gateway.edge.identity import identity_headers

ISSUER = "https://issuer.test"
AUDIENCE = "fleetserve"
HMAC_SECRET = b"0123456789abcdef" * 4  # 64 bytes: long enough for HS512


@dataclass(frozen=True)
class SigningKey:
    """A private key (or HMAC secret), the algorithm to sign with, and its public PEM."""

    name: str
    alg: str
    private: Any
    public_pem: bytes

    def sign(self, claims: dict[str, Any], headers: dict[str, Any] | None = None) -> str:
        return jwt.encode(claims, self.private, algorithm=self.alg, headers=headers)

    def jwk(self, kid: str) -> dict[str, Any]:
        algorithm = jwt.get_algorithm_by_name(self.alg)
        public = serialization.load_pem_public_key(self.public_pem)
        data = json.loads(algorithm.to_jwk(public))
        data.update(kid=kid, use="sig")
        return data


def _pem(private: Any) -> bytes:
    return private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def make_signing_keys() -> dict[str, SigningKey]:
    """One key per supported algorithm family (RSA generation is slow: the fixture makes them once a session)."""
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    rsa_other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private_keys: dict[str, tuple[str, Any]] = {
        "rsa": ("RS256", rsa_key),
        "rsa_other": ("RS256", rsa_other),
        "ec256": ("ES256", ec.generate_private_key(ec.SECP256R1())),
        "ec384": ("ES384", ec.generate_private_key(ec.SECP384R1())),
        "ec521": ("ES512", ec.generate_private_key(ec.SECP521R1())),
        "ed25519": ("EdDSA", ed25519.Ed25519PrivateKey.generate()),
        "ed448": ("EdDSA", ed448.Ed448PrivateKey.generate()),
    }
    keys = {name: SigningKey(name, alg, key, _pem(key)) for name, (alg, key) in private_keys.items()}
    keys["hmac"] = SigningKey("hmac", "HS256", HMAC_SECRET, b"")
    return keys


def claims(**overrides: Any) -> dict[str, Any]:
    """Valid claims for the test issuer and audience, issued now and valid for an hour."""
    now = int(time.time())
    base: dict[str, Any] = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "alice",
        "iat": now,
        "nbf": now,
        "exp": now + 3600,
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def write(tmp_path: Path, name: str, data: bytes | str) -> str:
    path = tmp_path / name
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return str(path)


async def echo(request: web.Request) -> web.Response:
    """The trivial downstream: reports the body length and the identity the proxy would forward."""
    body = await request.read()
    payload = {
        "body_len": len(body),
        "identity": identity_headers(request),
        "client_sent": {k: v for k, v in request.headers.items() if k.lower().startswith("x-fleetserve")},
    }
    return web.json_response(payload)


class ServeFn(Protocol):
    def __call__(
        self,
        middlewares: Sequence[Middleware],
        app: Mapping[str, Any] | None = None,
        server: Mapping[str, Any] | None = None,
    ) -> Awaitable[TestClient[web.Request, web.Application]]: ...
