"""The ``fleetserve`` command line: a thin layer that turns flags, ``FLEETSERVE_<NAME>`` environment variables and
an optional YAML config file into config objects and calls the library.

Precedence: command-line flag > environment variable > config file (top-level keys, then the section named
after the command) > built-in default. Each command lives in its package's ``command`` module with
``add_arguments(parser)`` and ``run(args) -> int``; only the chosen command's module is imported, so
``fleetserve build`` never loads the gateway and ``fleetserve gateway`` never loads ONNX Runtime.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleetserve import __version__
from fleetserve.errors import FleetserveError
from fleetserve.telemetry import logs

COMMANDS: dict[str, tuple[str, str]] = {
    "build": ("fleetserve.engine.command", "build an optimized engine (cached) from a zoo model or ONNX file"),
    "engines": ("fleetserve.engine.engines_command", "list or remove cached engines"),
    "serve": ("fleetserve.replica.command", "run one replica: KServe v2 HTTP + gRPC, /inference, metrics"),
    "gateway": ("fleetserve.gateway.server", "run the load-balancing gateway in front of replicas"),
    "up": ("fleetserve.fleet.command", "run a local fleet: N supervised replicas + a gateway"),
    "bench": ("fleetserve.bench.command", "load-test a URL (open or closed loop) and report latency"),
    "deploy": ("fleetserve.deploy.command", "render deployment assets (Kubernetes, NGINX, HAProxy)"),
}


def _load_config_file(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise FleetserveError(f"cannot read config file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise FleetserveError(f"config file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise FleetserveError(f"config file {path} must hold a mapping of option names to values")
    return data


def _apply_defaults(parser: argparse.ArgumentParser, command: str, config: dict[str, Any]) -> None:
    section = config.get(command, {}) if isinstance(config.get(command), dict) else {}
    merged = {k: v for k, v in config.items() if not isinstance(v, dict)} | section
    known = {a.dest: a for a in parser._actions if a.dest not in ("help", "config")}
    for key, setting in merged.items():
        dest = key.replace("-", "_")
        if dest not in known:
            if key in section:
                raise FleetserveError(f"config file: unknown option {key!r} for `fleetserve {command}`")
            continue
        parser.set_defaults(**{dest: setting})
    for dest, action in known.items():
        env = os.environ.get(f"FLEETSERVE_{dest.upper()}")
        if env is None or not action.option_strings:
            continue
        value: Any = env
        if action.nargs in ("*", "+") or isinstance(action, argparse._AppendAction):
            value = [v for v in env.split(",") if v]
        elif action.nargs == 0:  # store_true / store_false
            value = env.lower() in ("1", "true", "yes", "on")
        elif action.type is not None and callable(action.type):
            try:
                value = action.type(env)
            except (TypeError, ValueError) as exc:
                raise FleetserveError(f"FLEETSERVE_{dest.upper()}={env!r}: {exc}") from None
        parser.set_defaults(**{dest: value})


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetserve",
        description="Serve BERT-class encoders fast on one GPU and evenly across many.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n" + "\n".join(f"  {n:<9} {h}" for n, (_, h) in COMMANDS.items())
        + "\n\nRun `fleetserve COMMAND --help` for a command's options. Every option also reads "
        "FLEETSERVE_<OPTION> and the --config file.",
    )
    parser.add_argument("--version", action="version", version=f"fleetserve {__version__}")
    parser.add_argument("command", choices=list(COMMANDS), help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    logs.install(os.environ.get("FLEETSERVE_LOG_LEVEL", "INFO"))
    top = _top_parser()
    if not argv or argv[0] not in COMMANDS:
        top.parse_args(argv[:1] or ["--help"])
        return 2
    command, rest = argv[0], argv[1:]
    module_name, help_text = COMMANDS[command]
    try:
        module = importlib.import_module(module_name)
        parser = argparse.ArgumentParser(prog=f"fleetserve {command}", description=help_text)
        parser.add_argument("--config", default=os.environ.get("FLEETSERVE_CONFIG"),
                            help="YAML config file (top-level keys and a section per command)")
        module.add_arguments(parser)
        pre, _ = parser.parse_known_args(rest)
        _apply_defaults(parser, command, _load_config_file(pre.config))
        args = parser.parse_args(rest)
        return int(module.run(args))
    except (FleetserveError, ValueError) as exc:
        print(f"fleetserve {command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
