"""TokenVerifier: every algorithm with its key, time claims on a fake clock, identity, the cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jwt
import pytest

from fleetserve.gateway.edge.identity import Identity
from fleetserve.gateway.edge.jwtconfig import JwtConfig, KeySpec
from fleetserve.gateway.edge.keyset import KeySet
from fleetserve.gateway.edge.tokens import AuthError, TokenCache, TokenVerifier
from tests.support.clock import FakeClock
from tests.support.jwt_keys import AUDIENCE, HMAC_SECRET, ISSUER, SigningKey, write

NOW = 1_800_000_000.0

ALGORITHMS = [
    ("rsa", "RS256"), ("rsa", "RS384"), ("rsa", "RS512"),
    ("rsa", "PS256"), ("rsa", "PS384"), ("rsa", "PS512"),
    ("ec256", "ES256"), ("ec384", "ES384"), ("ec521", "ES512"),
    ("ed25519", "EdDSA"), ("ed448", "EdDSA"),
    ("hmac", "HS256"), ("hmac", "HS384"), ("hmac", "HS512"),
]  # fmt: skip


def _claims(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": NOW, "exp": NOW + 600}
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def _specs(tmp_path: Path, keys: dict[str, SigningKey]) -> tuple[KeySpec, ...]:
    specs = [KeySpec("secret_file", write(tmp_path, "hmac", HMAC_SECRET), ("HS256", "HS384", "HS512"), kid="hmac")]
    families = {"rsa": ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512"), "ec256": ("ES256",),
                "ec384": ("ES384",), "ec521": ("ES512",), "ed25519": ("EdDSA",), "ed448": ("EdDSA",)}  # fmt: skip
    for name, algorithms in families.items():
        specs.append(KeySpec("pem", write(tmp_path, f"{name}.pem", keys[name].public_pem), algorithms, kid=name))
    return tuple(specs)


def _verifier(tmp_path: Path, keys: dict[str, SigningKey], clock: FakeClock, **config: Any) -> TokenVerifier:
    settings: dict[str, Any] = {"issuers": (ISSUER,), "audiences": (AUDIENCE,), "tenant_claim": "org"}
    settings.update(config)
    jwt_config = JwtConfig(keys=_specs(tmp_path, keys), **settings)
    return TokenVerifier(jwt_config, KeySet.from_config(jwt_config), clock)


@pytest.mark.parametrize(("name", "alg"), ALGORITHMS)
async def test_every_supported_algorithm_verifies_with_its_key(
    tmp_path: Path, signing_keys: dict[str, SigningKey], name: str, alg: str
) -> None:
    verifier = _verifier(tmp_path, signing_keys, FakeClock(NOW))
    token = jwt.encode(_claims(), signing_keys[name].private, algorithm=alg, headers={"kid": name})
    identity = await verifier.verify(token)
    assert identity.subject == "alice"


@pytest.mark.parametrize(
    ("now", "overrides", "message"),
    [
        (NOW + 661, {}, "token expired"),
        (NOW, {"nbf": NOW + 61}, r"not yet valid \(nbf\)"),
        (NOW, {"iat": NOW + 61}, r"issued in the future \(iat\)"),
        (NOW, {"exp": "tomorrow"}, "claim 'exp' must be a number"),
        (NOW, {"exp": True}, "claim 'exp' must be a number"),
        (NOW, {"exp": None}, "lacks the required claim 'exp'"),
        (NOW, {"iat": None}, "lacks the required claim 'iat'"),
        (NOW, {"sub": None}, "lacks the required claim 'sub'"),
        (NOW, {"sub": 42}, "invalid token"),
        (NOW, {"iss": "https://evil.test"}, "wrong issuer"),
        (NOW, {"aud": "someone-else"}, "wrong audience"),
        (NOW, {"aud": None}, "lacks the required claim 'aud'"),
        (NOW, {"scope": 7}, "claim 'scope' must be a string or a list"),
        (NOW, {"org": ["a"]}, "claim 'org' must be a string"),
    ],
)
async def test_claim_failures_name_the_cause(
    tmp_path: Path, signing_keys: dict[str, SigningKey], now: float, overrides: dict[str, Any], message: str
) -> None:
    verifier = _verifier(tmp_path, signing_keys, FakeClock(now))
    token = signing_keys["ec256"].sign(_claims(**overrides), {"kid": "ec256"})
    with pytest.raises(AuthError, match=message):
        await verifier.verify(token)


async def test_leeway_tolerates_small_skew(tmp_path: Path, signing_keys: dict[str, SigningKey]) -> None:
    verifier = _verifier(tmp_path, signing_keys, FakeClock(NOW + 659))
    token = signing_keys["ec256"].sign(_claims(nbf=NOW + 659 + 59, iat=NOW + 659 + 59), {"kid": "ec256"})
    assert (await verifier.verify(token)).subject == "alice"


async def test_identity_carries_tenant_scopes_and_claims(tmp_path: Path, signing_keys: dict[str, SigningKey]) -> None:
    verifier = _verifier(tmp_path, signing_keys, FakeClock(NOW))
    key = signing_keys["ed25519"]
    spaced = await verifier.verify(key.sign(_claims(org="acme", scope="read  write"), {"kid": "ed25519"}))
    assert spaced.tenant == "acme" and spaced.scopes == {"read", "write"}
    assert spaced.claims["org"] == "acme"
    listed = await verifier.verify(key.sign(_claims(sub="bob", scope=["admin"]), {"kid": "ed25519"}))
    assert listed.subject == "bob" and listed.tenant is None and listed.scopes == {"admin"}


async def test_cache_skips_signature_checks_until_the_token_expires(
    tmp_path: Path, signing_keys: dict[str, SigningKey], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock(NOW)
    verifier = _verifier(tmp_path, signing_keys, clock, leeway_s=10)
    decodes = []
    real_decode = jwt.decode

    def counting_decode(*args: Any, **kwargs: Any) -> Any:
        decodes.append(1)
        return real_decode(*args, **kwargs)

    monkeypatch.setattr(jwt, "decode", counting_decode)
    token = signing_keys["rsa"].sign(_claims(exp=NOW + 100), {"kid": "rsa"})
    for _ in range(50):
        await verifier.verify(token)
    assert len(decodes) == 1
    clock.now = NOW + 110  # exp + leeway: still valid, still cached
    await verifier.verify(token)
    assert len(decodes) == 1
    clock.now = NOW + 111
    with pytest.raises(AuthError, match="token expired"):
        await verifier.verify(token)
    assert len(decodes) == 2


async def test_cache_entries_live_at_most_cache_max_ttl(
    tmp_path: Path, signing_keys: dict[str, SigningKey], monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock(NOW)
    verifier = _verifier(tmp_path, signing_keys, clock, cache_max_ttl_s=30)
    token = signing_keys["hmac"].sign(_claims(exp=NOW + 3600), {"kid": "hmac"})
    await verifier.verify(token)
    assert verifier.cache.get(token, NOW + 30) is not None
    assert verifier.cache.get(token, NOW + 31) is None


def test_token_cache_is_a_bounded_lru() -> None:
    cache = TokenCache(max_entries=3)
    identity = Identity("s", None, frozenset(), {})
    for name in "abc":
        cache.put(name, identity, expires_at=100.0)
    assert cache.get("a", 0.0) is identity  # "a" is now most recent
    cache.put("d", identity, expires_at=100.0)
    assert len(cache) == 3
    assert cache.get("b", 0.0) is None
    assert all(cache.get(name, 0.0) is identity for name in "acd")
