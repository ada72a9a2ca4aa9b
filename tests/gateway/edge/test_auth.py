"""JWT middleware over HTTP: an attack corpus (each 401/403, never 200 or 500), RFC 6750 challenges,
route scopes, exempt paths and the identity forwarded to replicas."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from fleetserve.gateway.edge.auth import JwtAuthMiddleware, challenge
from fleetserve.gateway.edge.identity import StripIdentityHeaders
from fleetserve.gateway.edge.jwtconfig import JwtConfig, KeySpec, RouteScope
from tests.support.clock import FakeClock
from tests.support.jwt_keys import AUDIENCE, HMAC_SECRET, ISSUER, ServeFn, SigningKey, claims, write

Client = TestClient[web.Request, web.Application]


def b64(data: bytes | dict[str, Any]) -> str:
    raw = json.dumps(data).encode() if isinstance(data, dict) else data
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unsigned(header: dict[str, Any], payload: dict[str, Any], signature: bytes = b"") -> str:
    return f"{b64(header)}.{b64(payload)}.{b64(signature) if signature else ''}"


def hs256_with(secret: bytes, header: dict[str, Any], payload: dict[str, Any]) -> str:
    """Sign by hand, as an attacker would (PyJWT refuses a PEM as an HMAC secret)."""
    signing_input = f"{b64(header)}.{b64(payload)}"
    signature = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(signature)}"


def swap_segment(token: str, index: int, value: dict[str, Any]) -> str:
    parts = token.split(".")
    parts[index] = b64(value)
    return ".".join(parts)


@pytest.fixture
def config(tmp_path: Path, signing_keys: dict[str, SigningKey]) -> JwtConfig:
    return JwtConfig(
        keys=(
            KeySpec("pem", write(tmp_path, "rsa.pem", signing_keys["rsa"].public_pem), ("RS256",), kid="rsa"),
            KeySpec("pem", write(tmp_path, "ec.pem", signing_keys["ec256"].public_pem), ("ES256",), kid="ec"),
            KeySpec("secret_file", write(tmp_path, "hmac", HMAC_SECRET), ("HS256",), kid="hmac"),
        ),
        issuers=(ISSUER,),
        audiences=(AUDIENCE,),
        tenant_claim="org",
        max_token_bytes=4096,
        route_scopes=(
            RouteScope("/v2/repository", scopes=("admin",)),
            RouteScope("/v2/models/secret", claims=(("org", "acme"),)),
        ),
    )


@pytest.fixture
async def client(serve: ServeFn, config: JwtConfig) -> Client:
    auth = JwtAuthMiddleware.create(config, exempt_paths=("/healthz",))
    return await serve([StripIdentityHeaders(), auth])


def attack_corpus(keys: dict[str, SigningKey]) -> list[tuple[str, str, str]]:
    """(name, Authorization value, expected error_description fragment)."""
    rsa, now = keys["rsa"], int(time.time())
    good = rsa.sign(claims(), {"kid": "rsa"})
    header, payload, signature = good.split(".")
    pem = rsa.public_pem
    return [
        ("alg none", "Bearer " + unsigned({"alg": "none", "typ": "JWT"}, claims()), "alg none"),
        ("alg None", "Bearer " + unsigned({"alg": "None"}, claims(), b"x"), "alg none"),
        ("alg NONE with kid", "Bearer " + unsigned({"alg": "NONE", "kid": "rsa"}, claims()), "alg none"),
        ("HS256 with RSA public key, kid", "Bearer " + hs256_with(pem, {"alg": "HS256", "kid": "rsa"}, claims()),
         "algorithm HS256 is not allowed for key 'rsa'"),
        ("HS256 with RSA public key, no kid", "Bearer " + hs256_with(pem, {"alg": "HS256"}, claims()),
         "bad signature"),
        ("ES256 token naming the RSA key", "Bearer " + keys["ec256"].sign(claims(), {"kid": "rsa"}),
         "algorithm ES256 is not allowed for key 'rsa'"),
        ("signed by another RSA key", "Bearer " + keys["rsa_other"].sign(claims(), {"kid": "rsa"}), "bad signature"),
        ("expired", "Bearer " + rsa.sign(claims(exp=now - 3600, iat=now - 7200, nbf=None), {"kid": "rsa"}),
         "token expired"),
        ("not yet valid", "Bearer " + rsa.sign(claims(nbf=now + 3600), {"kid": "rsa"}), "not yet valid"),
        ("issued in the future", "Bearer " + rsa.sign(claims(iat=now + 3600), {"kid": "rsa"}), "future"),
        ("wrong issuer", "Bearer " + rsa.sign(claims(iss="https://evil.test"), {"kid": "rsa"}), "wrong issuer"),
        ("wrong audience", "Bearer " + rsa.sign(claims(aud="other-service"), {"kid": "rsa"}), "wrong audience"),
        ("no audience", "Bearer " + rsa.sign(claims(aud=None), {"kid": "rsa"}), "required claim 'aud'"),
        ("no exp", "Bearer " + rsa.sign(claims(exp=None), {"kid": "rsa"}), "required claim 'exp'"),
        ("tampered payload", "Bearer " + swap_segment(good, 1, claims(sub="mallory")), "bad signature"),
        ("tampered header", "Bearer " + swap_segment(good, 0, {"alg": "RS256", "kid": "rsa", "x": 1}),
         "bad signature"),
        ("alg swapped in header", "Bearer " + swap_segment(good, 0, {"alg": "RS384", "kid": "rsa"}),
         "algorithm RS384 is not allowed"),
        ("unknown kid", "Bearer " + rsa.sign(claims(), {"kid": "who"}), "unknown key id 'who'"),
        ("signature short by a byte", "Bearer " + good[:-2], "bad signature"),
        ("signature cut mid-character", "Bearer " + good[:-1], "malformed token"),
        ("truncated to two segments", f"Bearer {header}.{payload}", "malformed token"),
        ("signature only", f"Bearer {signature}", "malformed token"),
        ("garbage", "Bearer abc.def.ghi", "malformed token"),
        ("not a jwt", "Bearer not-a-jwt", "malformed token"),
        ("dots", "Bearer ....", "malformed token"),
        ("binary junk", "Bearer " + b64(bytes(range(256))), "malformed token"),
        ("payload is a list", "Bearer " + hs256_with(HMAC_SECRET, {"alg": "HS256", "kid": "hmac"}, {}).replace(
            b64({}), base64.urlsafe_b64encode(b"[1]").rstrip(b"=").decode()), "bad signature"),
        ("header not an object", "Bearer " + b64(b"[1]") + "." + payload + "." + signature, "malformed token"),
        ("non-string kid", "Bearer " + unsigned({"alg": "RS256", "kid": 7}, claims(), b"s"), "malformed"),
        ("deeply nested header", "Bearer " + b64(b"[" * 1200 + b"]" * 1200) + "." + payload + "." + signature,
         "malformed token"),
        ("deeply nested payload", "Bearer " + hs256_with(HMAC_SECRET, {"alg": "HS256", "kid": "hmac"}, {}).replace(
            b64({}), b64(b"[" * 1200 + b"]" * 1200)), "bad signature"),
        ("very long kid", "Bearer " + unsigned({"alg": "RS256", "kid": "k" * 300}, claims(), b"s"),
         "'kid' must be a short string"),
        ("oversized", "Bearer " + "a" * 5000, "longer than 4096 bytes"),
        ("unsupported alg", "Bearer " + unsigned({"alg": "XS999"}, claims(), b"s"), "unsupported algorithm"),
        ("empty bearer", "Bearer ", "empty bearer token"),
        ("no subject", "Bearer " + rsa.sign(claims(sub=None), {"kid": "rsa"}), "required claim 'sub'"),
    ]  # fmt: skip


async def test_attack_corpus_is_refused_with_a_reason(client: Client, signing_keys: dict[str, SigningKey]) -> None:
    failures = []
    for name, authorization, reason in attack_corpus(signing_keys):
        response = await client.get("/v2/models/m", headers={"Authorization": authorization})
        body = await response.json()
        header = response.headers.get("WWW-Authenticate", "")
        if (
            response.status != 401
            or not header.startswith('Bearer error="invalid_token"')
            or reason not in header
            or reason not in body["error"]
        ):
            failures.append(f"{name}: {response.status} {header!r} {body}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Basic dXNlcjpwYXNz"}, {"Authorization": "Token abc"}, {"Authorization": ""}],
    ids=["missing", "basic", "other-scheme", "blank"],
)
async def test_missing_token_or_other_scheme_gets_a_bare_challenge(client: Client, headers: dict[str, str]) -> None:
    response = await client.get("/v2/models/m", headers=headers)
    assert response.status == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert "Bearer" in (await response.json())["error"]


@pytest.mark.parametrize("name", ["rsa", "ec256", "hmac"])
async def test_valid_tokens_pass_and_identity_is_forwarded(
    client: Client, signing_keys: dict[str, SigningKey], name: str
) -> None:
    kid = {"rsa": "rsa", "ec256": "ec", "hmac": "hmac"}[name]
    token = signing_keys[name].sign(claims(org="acme"), {"kid": kid})
    response = await client.get(
        "/v2/models/m",
        headers={"Authorization": f"bearer {token}", "X-Fleetserve-Subject": "root", "X-Fleetserve-Tenant": "x"},
    )
    assert response.status == 200
    body = await response.json()
    assert body["identity"] == {"X-Fleetserve-Subject": "alice", "X-Fleetserve-Tenant": "acme"}
    assert body["client_sent"] == {}


async def test_route_scopes_and_claims_give_403(client: Client, signing_keys: dict[str, SigningKey]) -> None:
    rsa = signing_keys["rsa"]
    reader = rsa.sign(claims(scope="read"), {"kid": "rsa"})
    admin = rsa.sign(claims(scope="read admin"), {"kid": "rsa"})
    denied = await client.post("/v2/repository/index", headers={"Authorization": f"Bearer {reader}"})
    assert denied.status == 403
    assert denied.headers["WWW-Authenticate"] == (
        'Bearer error="insufficient_scope", scope="admin", error_description="token lacks required scope admin"'
    )
    assert (await denied.json())["error"] == "token lacks required scope admin"
    allowed = await client.post("/v2/repository/index", headers={"Authorization": f"Bearer {admin}"})
    assert allowed.status == 200
    assert (await client.get("/v2/models/m", headers={"Authorization": f"Bearer {reader}"})).status == 200

    other_org = rsa.sign(claims(org="globex"), {"kid": "rsa"})
    wrong = await client.get("/v2/models/secret/infer", headers={"Authorization": f"Bearer {other_org}"})
    assert wrong.status == 403
    assert "claim org" in (await wrong.json())["error"]
    right = rsa.sign(claims(org="acme"), {"kid": "rsa"})
    assert (await client.get("/v2/models/secret/infer", headers={"Authorization": f"Bearer {right}"})).status == 200


async def test_exempt_paths_need_no_token(client: Client) -> None:
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/healthz/x")).status == 401


def test_challenge_quotes_only_safe_characters() -> None:
    assert challenge() == "Bearer"
    value = challenge("invalid_token", "unknown key id 'a\"b\\c\r\n\u00e9'")
    assert value == 'Bearer error="invalid_token", error_description="unknown key id \'a?b?c???\'"'


async def test_rotated_jwks_key_is_picked_up_through_the_middleware(
    serve: ServeFn, signing_keys: dict[str, SigningKey]
) -> None:
    document = {"keys": [signing_keys["rsa"].jwk("2024")]}
    hits = []

    async def jwks(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.json_response(document)

    key_app = web.Application()
    key_app.router.add_get("/jwks.json", jwks)
    key_server = TestServer(key_app)
    await key_server.start_server()
    try:
        url = str(key_server.make_url("/jwks.json"))
        clock = FakeClock()
        config = JwtConfig(keys=(KeySpec("jwks_url", url, ("RS256", "ES256")),), jwks_min_refresh_interval_s=30)
        client = await serve([JwtAuthMiddleware.create(config, clock=clock)])

        old = signing_keys["rsa"].sign(claims(), {"kid": "2024"})
        assert (await client.get("/", headers={"Authorization": f"Bearer {old}"})).status == 200
        document = {"keys": [signing_keys["ec256"].jwk("2025")]}
        new = signing_keys["ec256"].sign(claims(), {"kid": "2025"})
        early = await client.get("/", headers={"Authorization": f"Bearer {new}"})
        assert early.status == 401 and "unknown key id '2025'" in early.headers["WWW-Authenticate"]
        clock.now += 31
        assert (await client.get("/", headers={"Authorization": f"Bearer {new}"})).status == 200
        assert len(hits) == 2
    finally:
        await key_server.close()
