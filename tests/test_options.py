"""Options generated from config dataclasses: flags, help, precedence (flag > env > file > default) and errors."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from pathlib import Path

import pytest

from fleetserve.errors import UsageError
from fleetserve.options import Parser, add_options, option, resolve, section, specs


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def sizes(text: str) -> tuple[int, ...]:
    return tuple(int(s) for s in text.split(","))


@dataclass(frozen=True)
class Inner:
    depth: int = option(3, "how deep")
    color: Color = option(Color.RED, "which color")


@dataclass(frozen=True)
class Outer:
    name: str = option("x", "the name", positional=True)
    delay_ms: float = option(2.0, "how long (at most 100%)")
    limit: int | None = option(None, "at most", default_text="no limit")
    verbose: bool = option(False, "say more")
    backend: tuple[str, ...] = option((), "a backend (repeatable)")
    batches: tuple[int, ...] = option((), "batch sizes, comma list", parse=sizes, repeat=False)
    path: Path | None = option(None, "a file")
    inner: Inner = section(Inner, "inner things")
    hidden: int = 7

    def __post_init__(self) -> None:
        if self.delay_ms < 0:
            raise ValueError(f"delay_ms must be >= 0, got {self.delay_ms}")


def build(argv: list[str], environ: dict[str, str] | None = None, file: dict[str, object] | None = None) -> Outer:
    parser = Parser(prog="t")
    add_options(parser, Outer)
    return resolve(Outer, parser.parse_args(argv), environ=environ or {}, file=file or {})


def test_defaults_when_nothing_is_given() -> None:
    assert build([]) == Outer()


def test_flags_types_and_sections() -> None:
    got = build(["n", "--delay-ms", "5", "--limit", "9", "--verbose", "--backend", "a", "--backend", "b",
                 "--batches", "8,16", "--path", "/tmp/f", "--depth", "4", "--color", "blue"])
    assert got == Outer(name="n", delay_ms=5.0, limit=9, verbose=True, backend=("a", "b"), batches=(8, 16),
                        path=Path("/tmp/f"), inner=Inner(depth=4, color=Color.BLUE))


def test_flag_beats_environment_beats_file() -> None:
    file = {"delay-ms": 1, "depth": 5, "limit": 2}
    env = {"FLEETSERVE_DELAY_MS": "3", "FLEETSERVE_DEPTH": "6"}
    got = build(["--delay-ms", "4"], env, file)
    assert (got.delay_ms, got.inner.depth, got.limit) == (4.0, 6, 2)


def test_a_repeatable_flag_replaces_the_environment_and_file_lists() -> None:
    env = {"FLEETSERVE_BACKEND": "e1,e2"}
    assert build(["--backend", "f"], env, {"backend": ["y"]}).backend == ("f",)
    assert build([], env, {"backend": ["y"]}).backend == ("e1", "e2")
    assert build([], {}, {"backend": ["y", "z"]}).backend == ("y", "z")
    assert build([], {}, {"backend": "y,z"}).backend == ("y", "z")


def test_booleans_from_every_source() -> None:
    assert build(["--no-verbose"], {"FLEETSERVE_VERBOSE": "yes"}).verbose is False
    assert build([], {"FLEETSERVE_VERBOSE": "on"}).verbose is True
    assert build([], {}, {"verbose": True}).verbose is True
    assert build([], {}, {"verbose": "false"}).verbose is False


def test_file_keys_take_dashes_or_underscores_and_lists_for_parsed_tuples() -> None:
    got = build([], {}, {"delay_ms": 7, "batches": [8, 32]})
    assert (got.delay_ms, got.batches) == (7.0, (8, 32))


@pytest.mark.parametrize(
    ("argv", "env", "file", "message"),
    [
        (["--delay-ms", "soon"], {}, {}, "argument --delay-ms: 'soon' is not a number"),
        ([], {"FLEETSERVE_DELAY_MS": "soon"}, {}, "FLEETSERVE_DELAY_MS: 'soon' is not a number"),
        ([], {}, {"delay-ms": "soon"}, "config file: delay-ms: 'soon' is not a number"),
        ([], {}, {"delay-ms": True}, "True is not a number"),
        ([], {"FLEETSERVE_COLOR": "green"}, {}, "'green' is not one of red, blue"),
        ([], {"FLEETSERVE_VERBOSE": "maybe"}, {}, "'maybe' is not a boolean"),
        (["--batches", "8,x"], {}, {}, "--batches"),
        (["--delay-ms", "-1"], {}, {}, "delay_ms must be >= 0"),
        (["--nope"], {}, {}, "unrecognized arguments: --nope"),
        ([], {}, {"limit": [1, 2]}, "is not an integer"),
    ],
)
def test_every_mistake_is_a_usage_error_naming_its_source(argv: list[str], env: dict[str, str],
                                                          file: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError) as info:
        build(argv, env, file)
    assert message in str(info.value)


def test_required_options_say_how_to_give_them() -> None:
    @dataclass(frozen=True)
    class Needs:
        model: str = option("m", "which model", positional=True, required=True)

    parser = Parser(prog="t")
    add_options(parser, Needs)
    with pytest.raises(UsageError, match=r"model is required .*FLEETSERVE_MODEL"):
        resolve(Needs, parser.parse_args([]))
    assert resolve(Needs, parser.parse_args([]), environ={"FLEETSERVE_MODEL": "e"}).model == "e"


def test_help_shows_every_option_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    parser = Parser(prog="t")
    add_options(parser, Outer)
    parser.print_help()
    text = " ".join(capsys.readouterr().out.split())
    for needle in ("--delay-ms MS how long (at most 100%) (default: 2.0)", "at most (default: no limit)",
                   "inner things:", "--color {red,blue}", "--verbose, --no-verbose say more (default: off)"):
        assert needle in text
    assert "hidden" not in text


def test_overrides_win_over_everything() -> None:
    parser = Parser(prog="t")
    add_options(parser, Outer)
    got = resolve(Outer, parser.parse_args(["--depth", "1"]), overrides={"inner.depth": 9, "name": "o"})
    assert (got.inner.depth, got.name) == (9, "o")


def test_a_flag_declared_twice_is_refused() -> None:
    @dataclass(frozen=True)
    class Twice:
        a: Inner = section(Inner)
        b: Inner = section(Inner)

    with pytest.raises(ValueError, match="declared twice"):
        add_options(Parser(prog="t"), Twice)


def test_specs_list_only_declared_options() -> None:
    assert [s.dest for s in specs(Outer)] == ["name", "delay_ms", "limit", "verbose", "backend", "batches", "path",
                                              "inner.depth", "inner.color"]
