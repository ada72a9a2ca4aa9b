from importlib import resources
from pathlib import Path

import pytest

from fleetserve.deploy import templating
from fleetserve.deploy.templating import render, template_text, write_tree


def test_placeholders_are_filled_and_dollars_left_alone() -> None:
    text = render("nginx.conf", {
        "workers": 1, "files": "", "access_log": "off", "max_body": "1m", "balance": "", "servers": "server a:1;",
        "keepalive": 8, "maxconn": 64, "listen": "127.0.0.1:1", "connect_timeout": "1s", "timeout": "2s", "tries": 2,
    })
    assert "@{" not in text
    assert "$upstream_response_time" in text and "server a:1;" in text


def test_a_missing_value_is_an_error() -> None:
    with pytest.raises(KeyError, match="workers"):
        render("nginx.conf", {})


def test_every_template_uses_only_well_formed_placeholders() -> None:
    root = resources.files("fleetserve.deploy").joinpath("templates")
    names = [p.relative_to(Path(str(root))).as_posix() for p in Path(str(root)).rglob("*") if p.is_file()]
    assert len(names) >= 15
    for name in names:
        placeholders = templating.AtTemplate(template_text(name)).get_identifiers()
        assert templating.AtTemplate(template_text(name)).is_valid(), name
        assert all(p.isidentifier() for p in placeholders)


def test_write_tree_creates_folders(tmp_path: Path) -> None:
    written = write_tree(tmp_path, {"a/b/c.yaml": "x: 1\n", "d.txt": "d"})
    assert [p.relative_to(tmp_path).as_posix() for p in written] == ["a/b/c.yaml", "d.txt"]
    assert (tmp_path / "a" / "b" / "c.yaml").read_text() == "x: 1\n"
