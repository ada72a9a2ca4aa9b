import pytest

from fleetserve.gateway.balance.endpoint import Endpoint


def test_from_url_normalizes_scheme_port_and_trailing_slash() -> None:
    ep = Endpoint.from_url("HTTP://Replica-1:8000/")
    assert ep.url == "http://replica-1:8000"
    assert (ep.host, ep.port, ep.weight) == ("replica-1", 8000, 1)
    assert Endpoint.from_url("https://r.example").port == 443
    assert Endpoint.from_url("http://r.example").url == "http://r.example:80"


def test_ipv6_host_is_bracketed_in_url() -> None:
    ep = Endpoint.from_url("http://[fd00::5]:8000")
    assert ep.host == "fd00::5"
    assert ep.url == "http://[fd00::5]:8000"


def test_parse_weight_suffix() -> None:
    ep = Endpoint.parse("http://10.0.0.5:8000=3")
    assert ep.url == "http://10.0.0.5:8000"
    assert ep.weight == 3
    assert str(ep) == "http://10.0.0.5:8000=3"
    half = Endpoint.parse("http://10.0.0.5:8000=0.5")
    assert half.weight == 0.5 and str(half) == "http://10.0.0.5:8000=0.5"


def test_identity_is_the_url_alone() -> None:
    a = Endpoint.parse("http://a:1=1")
    b = Endpoint.from_url("http://a:1/", weight=5, labels={"zone": "x"})
    assert a == b
    assert hash(a) == hash(b)
    assert a in {b}
    assert a != Endpoint.parse("http://a:2")


def test_labels_are_a_private_read_only_copy() -> None:
    labels = {"zone": "a"}
    ep = Endpoint.from_url("http://a:1", labels=labels)
    labels["zone"] = "b"
    assert ep.labels["zone"] == "a"
    with pytest.raises(TypeError):
        ep.labels["zone"] = "c"  # type: ignore[index]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("10.0.0.1:8000", "needs a scheme"),
        ("ftp://a:1", "scheme must be http or https"),
        ("http://a:1?x=1", "query"),
        ("http://u:p@a:1", "credentials"),
        ("http://:8000", "no host"),
        ("http://a:99999", "a:99999"),
        ("http://a:1=zero", "weight 'zero' is not a number"),
        ("http://a:1=0", "weight must be a positive number up to 1000000, got 0.0"),
        ("http://a:1=inf", "weight must be a positive number"),
        ("http://a:1=2000000", "weight must be a positive number"),
    ],
)
def test_bad_specs_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Endpoint.parse(spec)
