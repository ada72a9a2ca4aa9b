"""The ``fleetserve`` command line: a thin layer that turns flags, ``FLEETSERVE_<NAME>`` environment variables and
an optional YAML config file into config objects and calls the library.

Each command lives in its package's ``command`` module: ``OPTIONS``, a config dataclass whose fields declared
with :func:`fleetserve.options.option` are the command's options, and ``run(options) -> int``. Only the chosen
command's module is imported, so ``fleetserve build`` never loads the gateway and ``fleetserve gateway`` never
loads ONNX Runtime. Precedence, for every option: flag > environment variable > config file (the section named
after the command, then top-level keys) > built-in default (:mod:`fleetserve.options`).

A user's mistake — a bad flag or value, an unknown model, a missing file or optional dependency — is one line
on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from fleetserve import __version__
from fleetserve.errors import FleetserveError, UsageError
from fleetserve.importer import Registry
from fleetserve.options import ENV_PREFIX, Parser, add_options, file_keys, help_formatter, option, resolve
from fleetserve.telemetry import logs

COMMANDS: Registry[Any] = Registry("command", {
    "build": "fleetserve.engine.command",
    "engines": "fleetserve.engine.engines_command",
    "serve": "fleetserve.replica.command",
    "gateway": "fleetserve.gateway.command",
    "up": "fleetserve.fleet.command",
    "bench": "fleetserve.bench.command",
    "deploy": "fleetserve.deploy.command",
    "profile": "fleetserve.sim.profile_command",
    "plan": "fleetserve.sim.plan_command",
})
SUMMARIES = {
    "build": "build an optimized engine (cached) from a zoo model or ONNX file",
    "engines": "list or remove cached engines",
    "serve": "run one replica: KServe v2 HTTP + gRPC, /inference, metrics",
    "gateway": "run the load-balancing gateway in front of replicas",
    "up": "run a local fleet: N supervised replicas + a gateway",
    "bench": "load-test a URL (open or closed loop) and report latency",
    "deploy": "render deployment assets (Kubernetes, NGINX, HAProxy, Prometheus, Grafana)",
    "profile": "measure an engine's service times and a replica's and gateway's CPU costs",
    "plan": "simulate fleets: the smallest one per GPU type that holds a p99 SLO, with its cost",
}
# Python packages of the optional extras, for the one-line hint when one is missing.
EXTRAS = {"torch": "export", "transformers": "export", "safetensors": "export", "matplotlib": "plot",
          "pynvml": "gpu", "uvloop": "fast"}


@dataclasses.dataclass(frozen=True)
class GlobalOptions:
    """Options every command takes."""

    config: Path | None = option(None, "YAML config file: top-level keys, then a section named after the command",
                                 metavar="FILE")
    log_level: str = option("info", "log verbosity", choices=logs.LEVELS)
    log_format: str = option("text", "log lines as text, or as one JSON object each", choices=logs.FORMATS)


def _top_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="fleetserve",
        description="Serve BERT-class encoders fast on one GPU and evenly across many.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {n:<9} {SUMMARIES[n]}" for n in COMMANDS)
        + "\n\nRun `fleetserve COMMAND --help` for a command's options. Every option also reads "
        f"{ENV_PREFIX}<OPTION> and the --config file.",
    )
    parser.add_argument("--version", action="version", version=f"fleetserve {__version__}")
    parser.add_argument("command", choices=COMMANDS.names(), help=argparse.SUPPRESS)
    return parser


def command_parser(command: str, options: type) -> argparse.ArgumentParser:
    """The parser of ``fleetserve COMMAND``: the global options, then the command's."""
    parser = Parser(
        prog=f"fleetserve {command}", description=SUMMARIES[command] + ".", formatter_class=help_formatter,
        epilog=f"Every option also reads {ENV_PREFIX}<OPTION> (e.g. {ENV_PREFIX}LOG_LEVEL=debug; lists are "
        f"comma-separated) and the --config file (the `{command}:` section, then top-level keys); a flag wins "
        "over the environment, which wins over the file.",
    )
    add_options(parser, GlobalOptions)
    add_options(parser, options)
    return parser


def load_config_file(path: Path | None) -> dict[str, Any]:
    """The YAML mapping of ``path`` (empty without a file); UsageError for an unreadable or malformed file."""
    if path is None:
        return {}
    import yaml

    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"config file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a mapping of option names to values")
    return data


def file_section(data: Mapping[str, Any], command: str, options: type, path: Path | None) -> dict[str, Any]:
    """Top-level keys overlaid with the command's own section; a key the section holds must be an option."""
    section = data.get(command)
    if section is not None and not isinstance(section, dict):
        raise UsageError(f"config file {path}: {command}: must be a mapping of option names to values")
    section = section or {}
    known = file_keys(options) | file_keys(GlobalOptions)
    for key in section:
        if key not in known:
            raise UsageError(f"config file {path}: unknown option {key!r} for `fleetserve {command}`")
    top = {k: v for k, v in data.items() if k not in COMMANDS and (not isinstance(v, dict) or k in known)}
    return top | section


def parse(command: str, argv: Sequence[str], environ: Mapping[str, str]) -> tuple[GlobalOptions, Any, Any]:
    """(global options, the command's options, the command module) for ``fleetserve COMMAND ARGV...``."""
    module = COMMANDS.load(command)
    parser = command_parser(command, module.OPTIONS)
    namespace = parser.parse_args(argv)
    early = resolve(GlobalOptions, namespace, environ=environ)
    data = load_config_file(early.config)
    file = file_section(data, command, module.OPTIONS, early.config)
    name = f"config file {early.config}"
    globals_ = resolve(GlobalOptions, namespace, environ=environ, file=file, file_name=name)
    return globals_, resolve(module.OPTIONS, namespace, environ=environ, file=file, file_name=name), module


def _missing_dependency(exc: ModuleNotFoundError) -> str:
    top = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(top)
    hint = f"pip install 'fleetserve[{extra}]'" if extra else f"pip install {top}"
    return f"needs the Python package {top!r}, which is not installed: {hint}"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        try:
            _top_parser().parse_args(argv[:1] or ["--help"])
        except UsageError as exc:
            print(f"fleetserve: error: {exc.message}", file=sys.stderr)
        return 2
    command, rest = argv[0], argv[1:]
    try:
        globals_, options, module = parse(command, rest, os.environ)
        logs.install(globals_.log_level, globals_.log_format)
        return int(module.run(options))
    except (FleetserveError, ValueError) as exc:
        message = exc.message if isinstance(exc, FleetserveError) else str(exc)
        print(f"fleetserve {command}: error: {message}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        print(f"fleetserve {command}: error: {_missing_dependency(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file or folder the user named or set up: unreadable, missing, full
        print(f"fleetserve {command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
