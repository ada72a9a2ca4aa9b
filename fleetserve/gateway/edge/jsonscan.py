"""Bounds on a JSON body's nesting depth and value count, checked on the raw bytes before parsing.

A deeply nested body (``[[[[...``) makes recursive parsers slow or overflow the stack, and a body of
millions of tiny values (``[0,0,0,...``) costs far more memory parsed than its size on the wire;
both are cheap to send. The scan needs no parser: one C-speed pass keeps only the opening brackets,
whose count bounds the depth, and every value but a bare scalar takes a byte of its own (an opening
bracket or a comma), so a body shorter than the value limit cannot exceed it; ``bytes.count`` over
the commas covers longer ones. That settles ordinary bodies at once (a 5 KB body in about 2 µs).
Only when a bound might be exceeded are string literals blanked out (one regex pass, so brackets and
commas inside strings do not count) and the depth computed as the running maximum of +1 per opening
and -1 per closing bracket (numpy cumsum).
Malformed JSON is not this module's concern: it passes here and fails in the parser downstream.
"""

from __future__ import annotations

import re

import numpy as np

# A JSON string literal: quote, then runs of plain characters separated by escape pairs, then quote
# (the "unrolled loop" form, which a backtracking engine matches without nested repetition).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')
_NOT_BRACKET = bytes(c for c in range(256) if c not in b"[]{}")
_NOT_OPENING = bytes(c for c in range(256) if c not in b"[{")
_DEPTH_STEP = np.zeros(256, dtype=np.int8)
_DEPTH_STEP[list(b"[{")] = 1
_DEPTH_STEP[list(b"]}")] = -1


class JsonLimitExceeded(ValueError):
    """The body breaks a bound; ``reason`` is ``json_too_deep`` or ``json_too_many_elements``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def max_depth(structure: bytes) -> int:
    """Deepest bracket nesting of ``structure`` (assumed free of string literals)."""
    brackets = structure.translate(None, _NOT_BRACKET)
    if not brackets:
        return 0
    steps = _DEPTH_STEP[np.frombuffer(brackets, dtype=np.uint8)]
    return int(np.cumsum(steps, dtype=np.int32).max())


def check_json_bounds(body: bytes, depth_limit: int, element_limit: int) -> None:
    """Raise :class:`JsonLimitExceeded` if ``body`` nests deeper than ``depth_limit`` or holds more
    than ``element_limit`` values (containers, array items and object members)."""
    opens = len(body.translate(None, _NOT_OPENING))
    # Each comma adds one value to its container; every container is a value; +1 for a bare scalar.
    if opens <= depth_limit and (len(body) < element_limit or opens + body.count(b",") + 1 <= element_limit):
        return
    structure = _STRING.sub(b'""', body)
    opens = structure.count(b"[") + structure.count(b"{")
    elements = opens + structure.count(b",") + 1
    if elements > element_limit:
        raise JsonLimitExceeded(
            "json_too_many_elements",
            f"JSON body holds about {elements} values; the limit is {element_limit}",
        )
    if opens > depth_limit:
        depth = max_depth(structure)
        if depth > depth_limit:
            raise JsonLimitExceeded("json_too_deep", f"JSON body nests {depth} levels deep; the limit is {depth_limit}")
