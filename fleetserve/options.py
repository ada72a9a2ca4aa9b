"""Command-line options generated from config dataclasses: each knob is declared once.

A config field declared with :func:`option` is a command-line option: its flag comes from the field name
(``max_delay_ms`` → ``--max-delay-ms``), its type from the annotation, its default from the field, and its help
line from the declaration. A field declared with :func:`section` holds a nested config whose options join the
same flat list (shown as their own group in ``--help``). Fields declared with plain ``dataclasses.field`` are
not options: code sets them.

:func:`add_options` puts a config class's options on an ``argparse`` parser; :func:`resolve` builds the
config from the parsed flags, the environment and the ``--config`` file with one precedence rule, for
repeatable options too::

    flag  >  FLEETSERVE_<NAME>  >  config file  >  the field's default

A repeatable option (a ``tuple[...]`` field) given on the command line replaces the environment's and the
file's values instead of adding to them; its environment form is comma-separated (``FLEETSERVE_BACKEND=a,b``),
its file form a list. Booleans take ``--x`` / ``--no-x``, and ``1/true/yes/on`` or ``0/false/no/off``
elsewhere. Every bad value is a :class:`~fleetserve.errors.UsageError` naming where it came from, so the CLI
prints one line and exits 2.

The model is uvicorn's ``Config`` (defaults, validation and help in one place); unlike uvicorn the option
list is derived from the dataclass, so a default is never typed twice.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from fleetserve.errors import UsageError

ENV_PREFIX = "FLEETSERVE_"
_OPTION = "fleetserve.option"
_SECTION = "fleetserve.section"
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})

C = TypeVar("C")


@dataclasses.dataclass(frozen=True)
class Option:
    """How one config field appears on the command line."""

    help: str
    flag: str | None = None  # None: derived from the field name
    metavar: str | None = None
    choices: tuple[str, ...] | Callable[[], Iterable[str]] | None = None
    parse: Callable[[str], Any] | None = None  # text -> value (an item's, when repeatable); None: the annotation's
    repeat: bool | None = None  # None: tuple fields are repeatable
    positional: bool = False
    required: bool = False  # the flag, the environment or the file must give it; the default is for code
    default_text: str | None = None  # how --help describes the default
    file_only: bool = False  # set only in the --config file (structured values), never a flag


class Parser(argparse.ArgumentParser):
    """argparse whose usage errors raise :class:`UsageError` (the CLI prints one line and exits 2)."""

    def error(self, message: str) -> typing.NoReturn:
        raise UsageError(f"{message} (see {self.prog} --help)")


def option(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    flag: str | None = None,
    metavar: str | None = None,
    choices: tuple[str, ...] | Callable[[], Iterable[str]] | None = None,
    parse: Callable[[str], Any] | None = None,
    repeat: bool | None = None,
    positional: bool = False,
    required: bool = False,
    default_text: str | None = None,
    file_only: bool = False,
) -> Any:
    """A dataclass field that is also a command-line option (see the module docstring)."""
    if not help:
        raise ValueError("every option needs one line of help")
    meta = {_OPTION: Option(help, flag, metavar, choices, parse, repeat, positional, required, default_text,
                            file_only)}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def positive_ints(text: str) -> tuple[int, ...]:
    """A comma list of positive integers, e.g. ``8,16`` -> ``(8, 16)`` (the parser of list options like
    ``--preferred-batch`` and ``--seq-buckets``)."""
    try:
        values = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise ValueError(f"expected a comma list of integers like 8,16, got {text!r}") from None
    if not values or min(values) < 1:
        raise ValueError(f"expected a comma list of positive integers like 8,16, got {text!r}")
    return values


def section(cls: type, title: str | None = None) -> Any:
    """A nested config field whose options join the parent's (``title`` heads their group in ``--help``)."""
    return dataclasses.field(default_factory=cls, metadata={_SECTION: title})


@dataclasses.dataclass(frozen=True)
class _Spec:
    """One option: where it lives in the config tree and how to read its values."""

    path: tuple[str, ...]  # field names from the root config
    field: dataclasses.Field[Any]
    option: Option
    kind: Any  # the annotation without ``| None``
    optional: bool
    repeat: bool
    item: Any  # what one value converts to: a repeatable option's element type, else ``kind``

    @property
    def name(self) -> str:
        """The option's name: its flag without dashes, or the field's name."""
        if self.option.positional or self.option.file_only:
            return self.field.name.replace("_", "-")
        return self.flag[2:]

    @property
    def flag(self) -> str:
        return self.option.flag or "--" + self.field.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return ".".join(self.path)

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.replace("-", "_").upper()

    def choices(self) -> list[str] | None:
        c = self.option.choices
        if c is None and isinstance(self.item, type) and issubclass(self.item, enum.Enum):
            return [str(m.value) for m in self.item]
        if callable(c):
            return list(c())
        return list(c) if c is not None else None

    def default(self) -> Any:
        if self.field.default is not dataclasses.MISSING:
            return self.field.default
        if self.field.default_factory is not dataclasses.MISSING:
            return self.field.default_factory()
        return dataclasses.MISSING

    def help(self) -> str:
        """The ``--help`` line (argparse %-formats help strings, so a literal ``%`` is doubled here)."""
        text = self.option.help
        if not self.option.required:
            text = f"{text} (default: {self.option.default_text or _show(self.default())})"
        return text.replace("%", "%%")

    def parse_text(self, text: str, origin: str) -> Any:
        """A value from text (an environment variable's; a list is comma-separated), UsageError naming ``origin``."""
        if self.repeat:
            return tuple(self.item_value(part.strip(), origin) for part in text.split(",") if part.strip())
        return self.item_value(text, origin)

    def item_value(self, text: str, origin: str) -> Any:
        """One value from text: a flag's, or one item of a list."""
        if self.option.parse is not None:
            try:
                return self.option.parse(text)
            except (TypeError, ValueError) as exc:
                raise UsageError(f"{origin}: {exc}") from None
        choices = self.choices()
        if choices is not None and text not in choices:
            raise UsageError(f"{origin}: {text!r} is not one of {', '.join(choices)}")
        if self.item is bool:
            lowered = text.strip().lower()
            if lowered in _TRUE | _FALSE:
                return lowered in _TRUE
            raise UsageError(f"{origin}: {text!r} is not a boolean (true/false, 1/0, yes/no, on/off)")
        try:
            return _convert(self.item, text)
        except (TypeError, ValueError):
            raise UsageError(f"{origin}: {text!r} is not {_article(self.item)}") from None

    def coerce(self, value: Any, origin: str) -> Any:
        """A value from the config file: YAML's typed values are checked, text is parsed like a flag's."""
        if value is None:
            if self.optional:
                return None
            raise UsageError(f"{origin}: a value is required")
        if self.option.file_only:
            return value
        if self.repeat:
            if isinstance(value, str):
                return self.parse_text(value, origin)
            items = value if isinstance(value, list) else [value]
            return tuple(self.item_value(str(v), origin) for v in items)
        if isinstance(value, list) and typing.get_origin(self.kind) is tuple:
            return tuple(x for v in value for x in self.item_value(str(v), origin))
        if isinstance(value, bool):
            if self.item is not bool:
                raise UsageError(f"{origin}: {value!r} is not {_article(self.item)}")
            return value
        if isinstance(value, (int, float, str)):
            return self.item_value(str(value), origin)
        raise UsageError(f"{origin}: {value!r} is not {_article(self.item)}")


def _convert(kind: Any, text: str) -> Any:
    if kind is int:
        return int(text)
    if kind is float:
        return float(text)
    if kind in (str, Path) or (isinstance(kind, type) and issubclass(kind, enum.Enum)):
        return kind(text)
    raise TypeError(f"options of type {kind!r} need parse=")


def _article(kind: Any) -> str:
    names = {int: "an integer", float: "a number", bool: "a boolean", str: "text", Path: "a path"}
    return names.get(kind, f"a valid {getattr(kind, '__name__', kind)}")


def _show(value: Any) -> str:
    if value is None or value is dataclasses.MISSING:
        return "none"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(_show(v) for v in value) if value else "none"
    return str(value)


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` -> (X, True); anything else -> (annotation, False)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            return args[0], True
    return annotation, False


def specs(cls: type, path: tuple[str, ...] = ()) -> list[_Spec]:
    """Every option of ``cls`` and its sections, depth first, in field order."""
    hints = typing.get_type_hints(cls)
    found: list[_Spec] = []
    for f in dataclasses.fields(cls):
        if _SECTION in f.metadata:
            found.extend(specs(hints[f.name], (*path, f.name)))
            continue
        opt = f.metadata.get(_OPTION)
        if opt is None:
            continue
        kind, optional = _unwrap(hints[f.name])
        is_tuple = typing.get_origin(kind) is tuple
        repeat = is_tuple and opt.repeat is not False
        if is_tuple and not repeat and opt.parse is None:
            raise TypeError(f"{cls.__name__}.{f.name}: a tuple option that is not repeatable needs parse=")
        item = typing.get_args(kind)[0] if repeat else kind
        found.append(_Spec((*path, f.name), f, opt, kind, optional, repeat, item))
    return found


def _groups(cls: type) -> dict[tuple[str, ...], str]:
    """Section paths -> their ``--help`` titles."""
    titles: dict[tuple[str, ...], str] = {}

    def walk(c: type, path: tuple[str, ...]) -> None:
        for f in dataclasses.fields(c):
            if _SECTION in f.metadata:
                sub = (*path, f.name)
                if f.metadata[_SECTION]:
                    titles[sub] = f.metadata[_SECTION]
                walk(typing.get_type_hints(c)[f.name], sub)

    walk(cls, ())
    return titles


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add every option of config class ``cls`` to ``parser`` (defaults stay unset: see :func:`resolve`)."""
    titles = _groups(cls)
    groups: dict[tuple[str, ...], argparse._ArgumentGroup] = {}
    seen: dict[str, str] = {}
    for spec in specs(cls):
        if spec.option.file_only:
            continue
        if spec.name in seen:
            raise ValueError(f"option {spec.name} is declared twice ({seen[spec.name]} and {spec.dest})")
        seen[spec.name] = spec.dest
        target: argparse.ArgumentParser | argparse._ArgumentGroup = parser
        for depth in range(len(spec.path) - 1, 0, -1):
            prefix = spec.path[:depth]
            if prefix in titles:
                if prefix not in groups:
                    groups[prefix] = parser.add_argument_group(titles[prefix])
                target = groups[prefix]
                break
        kwargs: dict[str, Any] = {"help": spec.help(), "default": argparse.SUPPRESS, "metavar": _metavar(spec)}
        if spec.option.positional:
            target.add_argument(spec.dest, nargs="?", type=_flag_parser(spec, spec.name.upper()), **kwargs)
        elif spec.kind is bool:
            del kwargs["metavar"]
            target.add_argument(spec.flag, dest=spec.dest, action=argparse.BooleanOptionalAction, **kwargs)
        else:
            target.add_argument(spec.flag, dest=spec.dest, action="append" if spec.repeat else "store",
                                type=_flag_parser(spec, spec.flag), **kwargs)


_UNIT_METAVARS = (("_ms", "MS"), ("_s", "S"), ("_bytes", "BYTES"), ("_percent", "PERCENT"))
_TYPE_METAVARS = {int: "N", float: "X", Path: "PATH"}


def _metavar(spec: _Spec) -> str:
    """``--max-delay-ms MS``, ``--instances N``, ``--precision {fp32,...}``, ``--host HOST``."""
    if spec.option.metavar:
        return spec.option.metavar
    choices = spec.choices()
    if choices is not None:
        return "{" + ",".join(choices) + "}"
    for suffix, metavar in _UNIT_METAVARS:
        if spec.field.name.endswith(suffix) and spec.item in (int, float):
            return metavar
    if not spec.option.positional and spec.item in _TYPE_METAVARS:
        return _TYPE_METAVARS[spec.item]
    return spec.name.upper().replace("-", "_")


def help_formatter(prog: str) -> argparse.HelpFormatter:
    """Help laid out for terminals of up to 110 columns, options aligned at column 34."""
    import shutil

    return argparse.HelpFormatter(prog, max_help_position=34, width=min(shutil.get_terminal_size().columns, 110))


def _flag_parser(spec: _Spec, origin: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        if text is argparse.SUPPRESS:  # argparse converts an absent optional positional's default too
            return text
        try:
            return spec.item_value(text, origin)
        except UsageError as exc:
            # argparse turns ArgumentTypeError into "argument X: MESSAGE"; drop our own prefix.
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{origin}: ")) from None

    parse.__name__ = spec.name
    return parse


def file_keys(cls: type) -> set[str]:
    """The keys ``cls`` reads from a config file (option names, dashes or underscores)."""
    names = {s.name for s in specs(cls)}
    return names | {n.replace("-", "_") for n in names}


def resolve(
    cls: type[C],
    namespace: argparse.Namespace,
    *,
    environ: Mapping[str, str] | None = None,
    file: Mapping[str, Any] | None = None,
    file_name: str = "config file",
    overrides: Mapping[str, Any] | None = None,
) -> C:
    """Build ``cls`` from flags (``namespace``), the environment and the file's mapping, in that order.

    ``overrides`` (dotted field paths) win over everything: a parent command setting a child's field.
    Validation errors of the configs' own ``__post_init__`` become :class:`UsageError`.
    """
    environ = {} if environ is None else environ
    file = {} if file is None else file
    values: dict[str, Any] = {}
    for spec in specs(cls):
        value = _value(spec, namespace, environ, file, file_name)
        if value is not dataclasses.MISSING:
            values[spec.dest] = value
        elif spec.option.required:
            raise UsageError(f"{spec.name if spec.option.positional else spec.flag} is required "
                             f"({spec.option.help}; or set {spec.env})")
    values.update(overrides or {})
    try:
        return _build(cls, (), values)
    except (TypeError, ValueError) as exc:
        raise UsageError(str(exc)) from None


def _value(spec: _Spec, namespace: argparse.Namespace, environ: Mapping[str, str], file: Mapping[str, Any],
           file_name: str) -> Any:
    if hasattr(namespace, spec.dest):
        value = getattr(namespace, spec.dest)
        return tuple(value) if spec.repeat else value
    if not spec.option.file_only and spec.env in environ:
        return spec.parse_text(environ[spec.env], spec.env)
    for key in (spec.name, spec.name.replace("-", "_")):
        if key in file:
            return spec.coerce(file[key], f"{file_name}: {key}")
    return dataclasses.MISSING


def _build(cls: type[C], path: tuple[str, ...], values: Mapping[str, Any]) -> C:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        dest = ".".join((*path, f.name))
        if _SECTION in f.metadata:
            kwargs[f.name] = _build(hints[f.name], (*path, f.name), values)
        elif dest in values:
            kwargs[f.name] = values[dest]
    return cls(**kwargs)

