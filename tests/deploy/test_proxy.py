from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fleetserve.deploy.proxy import Backend, ProxyConfig, canonical_policy, duration, integer_weights


def test_parse_url_and_weight() -> None:
    b = Backend.parse("http://10.0.0.5:8000=2.5")
    assert (b.host, b.port, b.weight) == ("10.0.0.5", 8000, 2.5)
    assert Backend.parse("http://replica-1").port == 80
    assert Backend.parse(" http://r:9000/ ").address == "r:9000"


def test_ipv6_address_is_bracketed() -> None:
    assert Backend.parse("http://[fd00::5]:8000").address == "[fd00::5]:8000"


@pytest.mark.parametrize(("spec", "message"), [
    ("10.0.0.5:8000", "needs a scheme"),
    ("https://r:8000", "only http://"),
    ("http://r:8000/v2", "no path"),
    ("http://r:8000?x=1", "no path"),
    ("http://u:p@r:8000", "credentials"),
    ("http://r:8000=heavy", "not a number"),
    ("http://r:8000=0", "positive"),
    ("http://r:8000=nan", "positive"),
    ("http://r:99999", "(?i)port"),
    ("http://r;evil:80", "not a valid host"),
])
def test_bad_backends_are_refused_with_the_reason(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Backend.parse(spec)


def test_policy_spellings_of_both_proxies_map_to_one_name() -> None:
    assert {canonical_policy(p) for p in ("round-robin", "roundrobin", "ROUND_ROBIN")} == {"round-robin"}
    assert {canonical_policy(p) for p in ("least_conn", "leastconn", "least-conn")} == {"least-conn"}
    with pytest.raises(ValueError, match="random"):
        canonical_policy("random")


def test_config_validation() -> None:
    one = (Backend("a", 1),)
    assert ProxyConfig(one, policy="leastconn").policy == "least-conn"
    with pytest.raises(ValueError, match="at least one"):
        ProxyConfig(())
    with pytest.raises(ValueError, match="distinct"):
        ProxyConfig((Backend("a", 1), Backend("a", 1, 2.0)))
    with pytest.raises(ValueError, match="tries"):
        ProxyConfig(one, tries=0)
    with pytest.raises(ValueError, match="timeout_s"):
        ProxyConfig(one, timeout_s=0)
    with pytest.raises(ValueError, match="listen host"):
        ProxyConfig(one, host="0.0.0.0; evil")


def test_from_pairs_builds_backends() -> None:
    config = ProxyConfig.from_pairs([("http://127.0.0.1:8000", 1.0), ("http://127.0.0.1:8002", 3.0)], port=9000)
    assert [b.address for b in config.backends] == ["127.0.0.1:8000", "127.0.0.1:8002"]
    assert config.port == 9000


def test_integer_weights_exact_when_possible() -> None:
    assert integer_weights([1.5, 1.0], 256) == [3, 2]
    assert integer_weights([2.0, 4.0, 6.0], 256) == [1, 2, 3]
    assert integer_weights([1000.0, 1.0], 256) == [256, 1]


@given(st.lists(st.floats(min_value=0.01, max_value=1000), min_size=1, max_size=8))
def test_integer_weights_stay_in_range_and_keep_order(weights: list[float]) -> None:
    ints = integer_weights(weights, 256)
    assert all(1 <= i <= 256 for i in ints)
    for (a, ia) in zip(weights, ints, strict=True):
        for (b, ib) in zip(weights, ints, strict=True):
            if a < b:
                assert ia <= ib


@given(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=6))
def test_integer_weights_keep_exact_ratios_of_small_integers(weights: list[int]) -> None:
    ints = integer_weights([float(w) for w in weights], 256)
    assert [Fraction(i, ints[0]) for i in ints] == [Fraction(w, weights[0]) for w in weights]


def test_duration_formats() -> None:
    assert duration(2) == "2s"
    assert duration(0.25) == "250ms"
    assert duration(1.5) == "1500ms"
