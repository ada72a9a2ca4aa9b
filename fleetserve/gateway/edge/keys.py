"""Verification keys and the algorithms each may verify (RFC 7518 key families, RFC 8725 §3.1).

A key's allowed algorithms are the configured allow-list intersected with what its type can do:
an HMAC secret only HS* (and only the variants its length supports: RFC 7518 §3.2 wants a secret
at least as long as the hash), an RSA key (2048 bits or more) only RS*/PS*, an EC key only the ES*
of its curve, an Ed25519/Ed448 key only EdDSA, and a JWK's own ``alg`` narrows it further. A token
is only ever checked with a key that allows the token's ``alg``, so no key is used in a way its owner
did not mean; for static keys a configured algorithm the key cannot do is a configuration error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_private_key, load_pem_public_key
from jwt import PyJWK

from fleetserve.gateway.edge.jwtconfig import HMAC_ALGORITHMS

log = logging.getLogger(__name__)

MIN_RSA_BITS = 2048
_HMAC_MIN_BYTES = {"HS256": 32, "HS384": 48, "HS512": 64}
_RSA_ALGORITHMS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_EC_ALGORITHMS = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey | ed448.Ed448PublicKey


@dataclass(frozen=True, slots=True)
class VerificationKey:
    """One key: ``key`` is ``bytes`` (HMAC) or a ``cryptography`` public key."""

    key: bytes | PublicKey
    algorithms: frozenset[str]
    kid: str | None
    origin: str


def _public(key: Any) -> Any:
    private_types = (
        rsa.RSAPrivateKey, ec.EllipticCurvePrivateKey, ed25519.Ed25519PrivateKey, ed448.Ed448PrivateKey,
    )  # fmt: skip
    return key.public_key() if isinstance(key, private_types) else key


def family_algorithms(key: object) -> frozenset[str]:
    """Every algorithm a key of this type (and size or curve) can verify; raises for unusable keys."""
    if isinstance(key, bytes):
        return frozenset(alg for alg in HMAC_ALGORITHMS if len(key) >= _HMAC_MIN_BYTES[alg])
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise ValueError(f"RSA key of {key.key_size} bits is too small (minimum {MIN_RSA_BITS})")
        return _RSA_ALGORITHMS
    if isinstance(key, ec.EllipticCurvePublicKey):
        alg = _EC_ALGORITHMS.get(key.curve.name)
        if alg is None:
            raise ValueError(f"EC curve {key.curve.name} is not supported")
        return frozenset({alg})
    if isinstance(key, ed25519.Ed25519PublicKey | ed448.Ed448PublicKey):
        return frozenset({"EdDSA"})
    raise ValueError(f"unsupported key type {type(key).__name__}")


def make_key(key: Any, configured: Iterable[str], kid: str | None, origin: str) -> VerificationKey:
    """A static key: every configured algorithm must suit it."""
    key = _public(key)
    family = family_algorithms(key)
    wanted = frozenset(configured)
    unusable = sorted(wanted - family)
    if unusable:
        kind = "HMAC secret" if isinstance(key, bytes) else f"{type(key).__name__} key"
        raise ValueError(f"{origin}: a {kind} cannot verify {', '.join(unusable)}")
    return VerificationKey(key, wanted, kid, origin)


def load_pem(path: str, algorithms: Iterable[str], kid: str | None) -> VerificationKey:
    """A public key, certificate or (its public half taken) private key from a PEM file."""
    data = Path(path).read_bytes()
    loaders = (
        load_pem_public_key,
        lambda d: x509.load_pem_x509_certificate(d).public_key(),
        lambda d: load_pem_private_key(d, password=None),
    )
    for loader in loaders:
        try:
            key = loader(data)
        except (ValueError, TypeError):
            continue
        return make_key(key, algorithms, kid, f"pem {path}")
    raise ValueError(f"pem {path}: no PEM public key, certificate or unencrypted private key found")


def load_secret(path: str, algorithms: Iterable[str], kid: str | None) -> VerificationKey:
    """An HMAC secret: the file's bytes, less one trailing newline (as ``echo`` writes)."""
    data = Path(path).read_bytes()
    data = data[:-2] if data.endswith(b"\r\n") else data[:-1] if data.endswith(b"\n") else data
    if b"-----BEGIN" in data:
        raise ValueError(f"secret_file {path} holds a PEM key; configure it as pem, not as an HMAC secret")
    if not data:
        raise ValueError(f"secret_file {path} is empty")
    return make_key(data, algorithms, kid, f"secret_file {path}")


def keys_from_jwks(document: object, algorithms: Iterable[str], origin: str) -> list[VerificationKey]:
    """The usable signature keys of a JWK Set (RFC 7517 §5); unusable entries are skipped and logged."""
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError(f"{origin}: not a JWK Set (expected an object with a 'keys' list)")
    wanted = frozenset(algorithms)
    keys = []
    for index, jwk in enumerate(document["keys"]):
        try:
            keys.append(_jwk_key(jwk, wanted, origin))
        except Exception as exc:  # one odd entry (unknown kty, encryption key) must not hide the rest
            log.warning("%s: skipping key %d: %s", origin, index, exc)
    return keys


def _jwk_key(jwk: object, wanted: frozenset[str], origin: str) -> VerificationKey:
    if not isinstance(jwk, dict):
        raise ValueError("not a JSON object")
    if jwk.get("use", "sig") != "sig":
        raise ValueError(f"use is {jwk.get('use')!r}, not 'sig'")
    kid = jwk.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise ValueError("kid is not a string")
    key = _public(PyJWK(jwk).key)
    allowed = wanted & family_algorithms(key)
    if isinstance(jwk.get("alg"), str):
        allowed &= {jwk["alg"]}
    if not allowed:
        raise ValueError(f"no allowed algorithm for a {jwk.get('kty')} key (allowed: {', '.join(sorted(wanted))})")
    return VerificationKey(key, allowed, kid, origin)
