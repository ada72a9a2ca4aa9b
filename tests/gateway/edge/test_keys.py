"""Key loading and the per-key algorithm rules (families, sizes, curves, JWK ``alg``)."""

from __future__ import annotations

import datetime
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from fleetserve.gateway.edge.keys import (
    family_algorithms,
    keys_from_jwks,
    load_pem,
    load_secret,
    make_key,
)
from tests.support.jwt_keys import SigningKey, write


def test_pem_public_key_allows_its_configured_family(tmp_path: Path, signing_keys: dict[str, SigningKey]) -> None:
    key = load_pem(write(tmp_path, "rsa.pem", signing_keys["rsa"].public_pem), ["RS256", "PS256"], "k1")
    assert key.algorithms == {"RS256", "PS256"}
    assert key.kid == "k1"
    assert isinstance(key.key, rsa.RSAPublicKey)


def test_pem_private_key_and_certificate_yield_the_public_key(
    tmp_path: Path, signing_keys: dict[str, SigningKey]
) -> None:
    private = signing_keys["ec256"].private
    private_pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    from_private = load_pem(write(tmp_path, "priv.pem", private_pem), ["ES256"], None)
    assert isinstance(from_private.key, ec.EllipticCurvePublicKey)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "issuer.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(private, hashes.SHA256())
    )
    from_cert = load_pem(write(tmp_path, "cert.pem", cert.public_bytes(serialization.Encoding.PEM)), ["ES256"], None)
    assert from_cert.key == from_private.key


def test_pem_file_without_a_key_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no PEM public key"):
        load_pem(write(tmp_path, "junk.pem", "not a key"), ["RS256"], None)


@pytest.mark.parametrize(
    ("name", "algorithms", "message"),
    [
        ("rsa", ["ES256"], r"RSAPublicKey key cannot verify ES256"),
        ("rsa", ["EdDSA"], r"cannot verify EdDSA"),
        ("ec256", ["ES384"], r"cannot verify ES384"),
        ("ec384", ["ES256", "ES384"], r"cannot verify ES256"),
        ("ed25519", ["RS256"], r"cannot verify RS256"),
    ],
)
def test_asymmetric_key_only_allows_its_family(
    signing_keys: dict[str, SigningKey], name: str, algorithms: list[str], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        make_key(signing_keys[name].private.public_key(), algorithms, None, "test")


def test_family_rules() -> None:
    assert family_algorithms(b"s" * 32) == {"HS256"}
    assert family_algorithms(b"s" * 48) == {"HS256", "HS384"}
    assert family_algorithms(b"s" * 64) == {"HS256", "HS384", "HS512"}
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key()
    with pytest.raises(ValueError, match="1024 bits is too small"):
        family_algorithms(small)
    with pytest.raises(ValueError, match="unsupported key type"):
        family_algorithms("a string")


def test_secret_file_rules(tmp_path: Path) -> None:
    key = load_secret(write(tmp_path, "s", b"k" * 32 + b"\n"), ["HS256"], "h")
    assert key.key == b"k" * 32 and key.algorithms == {"HS256"}
    with pytest.raises(ValueError, match="cannot verify HS512"):
        load_secret(write(tmp_path, "s2", b"k" * 32), ["HS256", "HS512"], None)
    with pytest.raises(ValueError, match="cannot verify HS256"):
        load_secret(write(tmp_path, "s3", b"short"), ["HS256"], None)
    with pytest.raises(ValueError, match="holds a PEM key"):
        load_secret(write(tmp_path, "s4", b"-----BEGIN PUBLIC KEY-----\nabc\n"), ["HS256"], None)
    with pytest.raises(ValueError, match="is empty"):
        load_secret(write(tmp_path, "s5", b"\n"), ["HS256"], None)


def test_jwks_keeps_usable_signature_keys_only(signing_keys: dict[str, SigningKey]) -> None:
    rsa_jwk = signing_keys["rsa"].jwk("r1") | {"alg": "RS256"}
    ec_jwk = signing_keys["ec256"].jwk("e1")
    document = {
        "keys": [
            rsa_jwk,
            ec_jwk,
            {"kty": "oct", "k": "c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0", "kid": "h1"},
            signing_keys["rsa_other"].jwk("enc") | {"use": "enc"},
            {"kty": "nope", "kid": "x"},
            "garbage",
            signing_keys["ec384"].jwk("e2"),  # ES384 is not in the allow-list below
        ]
    }
    keys = keys_from_jwks(document, ["RS256", "PS256", "ES256"], "test")
    assert [(k.kid, sorted(k.algorithms)) for k in keys] == [("r1", ["RS256"]), ("e1", ["ES256"])]


@pytest.mark.parametrize("document", [[], {"keys": "x"}, {"nokeys": []}, "text"])
def test_non_jwks_document_is_an_error(document: object) -> None:
    with pytest.raises(ValueError, match="not a JWK Set"):
        keys_from_jwks(document, ["RS256"], "test")
