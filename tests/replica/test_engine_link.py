"""The link between a replica's front ends and its engine process (``fleetserve.replica.engine_link``): the frame
codec, errors across the link, and :class:`RemoteEngine` connections to a stand-in engine process on a Unix
socket. The real engine process's side is ``test_engine_host.py``."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from fleetserve.engine.base import ShapeProfile, TensorSpec
from fleetserve.errors import FleetserveError, InvalidInput, NotReady, Overloaded, PayloadTooLarge, RequestExpired
from fleetserve.replica.engine_link import (
    MAX_HEADER_BYTES,
    PREFIX,
    LinkError,
    RemoteEngine,
    decode,
    encode,
    error_fields,
    raise_error,
    sizes,
)


def round_trip(frame: bytes) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    head_len, body_len = sizes(frame[: PREFIX.size])
    assert PREFIX.size + head_len + body_len == len(frame)
    return decode(frame[PREFIX.size : PREFIX.size + head_len], frame[PREFIX.size + head_len :])


def raw_frame(tensors: list[list[object]], body: bytes) -> tuple[bytes, bytes]:
    """A frame's JSON and body written by hand, past ``encode``'s checks."""
    return json.dumps({"tensors": tensors}).encode(), body


# --- the frame codec --------------------------------------------------------------------------------------------

ARRAYS: dict[str, np.ndarray] = {
    "int64 2-D": np.arange(12, dtype=np.int64).reshape(3, 4) - 5,
    "float32 3-D": np.random.default_rng(1).normal(size=(2, 3, 4)).astype(np.float32),
    "float16 2-D": np.array([[0.5, -1.25, 65504.0], [np.inf, -0.0, 1e-4]], dtype=np.float16),
    "int64 0 rows": np.zeros((0, 5), dtype=np.int64),
    "float32 0 rows 3-D": np.zeros((0, 7, 3), dtype=np.float32),
    "int64 transposed (not contiguous)": np.arange(6, dtype=np.int64).reshape(2, 3).T,
    "bool": np.array([[True, False, True]]),
    "uint8 big shape": np.arange(256, dtype=np.uint8).reshape(4, 8, 8),
}


@pytest.mark.parametrize("name", list(ARRAYS))
def test_one_array_survives_a_round_trip(name: str) -> None:
    array = ARRAYS[name]
    header, arrays = round_trip(encode({"x": array}))
    assert header == {}
    got = arrays["x"]
    assert got.dtype == array.dtype and got.shape == array.shape
    np.testing.assert_array_equal(got, array)


def test_several_arrays_and_header_fields_survive_a_round_trip_in_order() -> None:
    sent = {name.replace(" ", "_"): array for name, array in ARRAYS.items()}
    header, arrays = round_trip(encode(sent, outputs=["a", "b"], note="x"))
    assert header == {"outputs": ["a", "b"], "note": "x"}
    assert list(arrays) == list(sent)
    for name, array in sent.items():
        assert arrays[name].dtype == array.dtype and arrays[name].shape == array.shape
        np.testing.assert_array_equal(arrays[name], array)


def test_an_empty_frame_carries_only_its_header() -> None:
    header, arrays = round_trip(encode({}, error={"kind": "NotReady", "message": "m", "retry_after_s": None}))
    assert arrays == {}
    assert header == {"error": {"kind": "NotReady", "message": "m", "retry_after_s": None}}


@pytest.mark.parametrize("dtype", ["|O", "<U4", "|S4", "V8"])
def test_decode_refuses_a_non_numeric_dtype(dtype: str) -> None:
    head, body = raw_frame([["x", dtype, [1]]], bytes(np.dtype(dtype).itemsize))
    with pytest.raises(LinkError, match="non-numeric dtype"):
        decode(head, body)


@pytest.mark.parametrize("change", [b"\x00", -1], ids=["one byte too many", "one byte too few"])
def test_decode_refuses_a_body_whose_length_differs_from_its_tensors(change: bytes | int) -> None:
    frame = encode({"a": np.arange(4, dtype=np.int64), "b": np.ones((2, 2), dtype=np.float32)})
    head_len, _ = sizes(frame[: PREFIX.size])
    head, body = frame[PREFIX.size : PREFIX.size + head_len], frame[PREFIX.size + head_len :]
    body = body + change if isinstance(change, bytes) else body[:change]
    with pytest.raises(LinkError):
        decode(head, body)


@pytest.mark.parametrize(
    "tensors",
    [[["x", "<i8", [-1]]], [["x", "<i8", [2, -1]]], [["x", "<i8", "ab"]], [["x", "<i8"]], [["x", 5, [1]]]],
    ids=["negative dim", "negative inner dim", "shape not a list", "no shape", "dtype not a string"],
)
def test_decode_refuses_malformed_tensor_entries(tensors: list[list[object]]) -> None:
    head, body = raw_frame(tensors, bytes(16))
    with pytest.raises(LinkError):
        decode(head, body)


@pytest.mark.parametrize("head", [b"{not json", b"{}", b'{"tensors": null}', b"\xff"])
def test_decode_refuses_a_header_that_is_not_a_frame_header(head: bytes) -> None:
    with pytest.raises(LinkError, match="malformed frame"):
        decode(head, b"")


@pytest.mark.parametrize("head", [b"null", b"5", b'"tensors"'])
def test_decode_refuses_a_header_that_is_not_a_json_object(head: bytes) -> None:
    with pytest.raises(LinkError):
        decode(head, b"")


def test_sizes_refuses_a_header_past_its_bound() -> None:
    assert sizes(PREFIX.pack(MAX_HEADER_BYTES, 10)) == (MAX_HEADER_BYTES, 10)
    with pytest.raises(LinkError, match="exceeds the link's bounds"):
        sizes(PREFIX.pack(MAX_HEADER_BYTES + 1, 0))


# --- errors across the link ---------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "exc",
    [Overloaded("queue full", retry_after_s=2.5), NotReady("warming up", retry_after_s=0.5), InvalidInput("bad rows"),
     RequestExpired("too late"), PayloadTooLarge("too big"), FleetserveError("plain")],
    ids=lambda e: type(e).__name__,
)
def test_an_error_is_raised_again_as_its_own_class_and_message(exc: FleetserveError) -> None:
    header, _ = round_trip(encode({}, error=error_fields(exc)))  # as it crosses the link: through JSON
    with pytest.raises(FleetserveError) as raised:
        raise_error(header["error"])  # type: ignore[arg-type]
    assert type(raised.value) is type(exc)
    assert raised.value.message == exc.message
    assert raised.value.retry_after_s == exc.retry_after_s
    assert raised.value.http_status == exc.http_status


def test_an_unexpected_error_becomes_a_fleetserve_error_naming_it() -> None:
    with pytest.raises(FleetserveError) as raised:
        raise_error(error_fields(RuntimeError("CUDA out of memory")))
    assert type(raised.value) is FleetserveError
    assert "RuntimeError" in raised.value.message and "CUDA out of memory" in raised.value.message
    assert raised.value.http_status == 500


def test_a_fleetserve_error_subclass_the_link_does_not_know_arrives_as_its_base() -> None:
    class EngineHiccup(FleetserveError):
        pass

    with pytest.raises(FleetserveError) as raised:
        raise_error(error_fields(EngineHiccup("hiccup")))
    assert type(raised.value) is FleetserveError and raised.value.message == "hiccup"


# --- a RemoteEngine's connections -------------------------------------------------------------------------------

SPECS = (TensorSpec("input_ids", "INT64", (-1, -1)),)
OUT_SPECS = (TensorSpec("doubled", "INT64", (-1, -1)),)
PROFILE = ShapeProfile(max_batch=4, max_seq=8, seq_buckets=(8,), batch_buckets=(1, 2, 4))


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    # Not tmp_path: a Unix socket's path must fit in 108 bytes, and pytest's can be longer.
    path = Path(tempfile.mkdtemp(prefix="fs-link-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def serve_once(socket_dir: Path, answer: Callable[[dict[str, object], dict[str, np.ndarray]], bytes | None],
                     ) -> tuple[asyncio.Server, RemoteEngine]:
    """A stand-in engine process that answers each frame with ``answer(header, arrays)`` (None: hang up)."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head_len, body_len = sizes(await reader.readexactly(PREFIX.size))
                reply = answer(*decode(await reader.readexactly(head_len), await reader.readexactly(body_len)))
                if reply is None:
                    return
                writer.write(reply)
                await writer.drain()
        except asyncio.IncompleteReadError:
            return
        finally:
            writer.close()

    path = str(socket_dir / "engine.sock")
    server = await asyncio.start_unix_server(serve, path)
    return server, RemoteEngine(path, SPECS, OUT_SPECS, PROFILE, "cpu", timeout_s=10)


async def test_a_remote_instance_sends_its_batch_and_the_outputs_wanted_and_reads_the_answer(
        socket_dir: Path) -> None:
    seen: list[tuple[dict[str, object], dict[str, np.ndarray]]] = []

    def double(header: dict[str, object], arrays: dict[str, np.ndarray]) -> bytes:
        seen.append((header, {name: array.copy() for name, array in arrays.items()}))
        return encode({"doubled": arrays["input_ids"] * 2})

    server, remote = await serve_once(socket_dir, double)
    try:
        instance = remote.instance()
        ids = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
        answer = await asyncio.to_thread(instance.infer, {"input_ids": ids}, ["doubled"])
        np.testing.assert_array_equal(answer["doubled"], ids * 2)
        again = await asyncio.to_thread(instance.infer, {"input_ids": ids[:1]})  # the same connection, again
        np.testing.assert_array_equal(again["doubled"], ids[:1] * 2)
        assert [header for header, _ in seen] == [{"outputs": ["doubled"]}, {"outputs": None}]
        np.testing.assert_array_equal(seen[0][1]["input_ids"], ids)
    finally:
        remote.close()
        server.close()
        await server.wait_closed()


async def test_a_remote_instance_raises_the_error_the_engine_process_answers(socket_dir: Path) -> None:
    server, remote = await serve_once(
        socket_dir, lambda header, arrays: encode({}, error=error_fields(Overloaded("engine queue full", 3.0))))
    try:
        with pytest.raises(Overloaded, match="engine queue full") as raised:
            await asyncio.to_thread(remote.instance().infer, {"input_ids": np.ones((1, 2), dtype=np.int64)})
        assert raised.value.retry_after_s == 3.0
    finally:
        remote.close()
        server.close()
        await server.wait_closed()


async def test_an_engine_process_that_hangs_up_mid_call_is_not_ready(socket_dir: Path) -> None:
    server, remote = await serve_once(socket_dir, lambda header, arrays: None)
    try:
        with pytest.raises(NotReady, match="unreachable"):
            await asyncio.to_thread(remote.instance().infer, {"input_ids": np.ones((1, 2), dtype=np.int64)})
    finally:
        remote.close()
        server.close()
        await server.wait_closed()


async def test_an_awaited_remote_instance_shares_its_connection_with_later_calls_from_threads(
        socket_dir: Path) -> None:
    frames: list[dict[str, object]] = []

    def double(header: dict[str, object], arrays: dict[str, np.ndarray]) -> bytes:
        frames.append(header)
        return encode({"doubled": arrays["input_ids"] * 2})

    server, remote = await serve_once(socket_dir, double)
    try:
        instance = remote.instance()
        ids = np.array([[1, 2], [3, 4]], dtype=np.int64)
        warm = await asyncio.to_thread(instance.infer, {"input_ids": ids[:1]})  # warm-up: blocking, from a thread
        np.testing.assert_array_equal(warm["doubled"], ids[:1] * 2)
        for _ in range(2):
            answer = await instance.infer_async({"input_ids": ids}, ["doubled"])
            np.testing.assert_array_equal(answer["doubled"], ids * 2)
        # The loop owns the connection now; a thread's call runs there, on the same connection.
        late = await asyncio.to_thread(instance.infer, {"input_ids": ids[1:]})
        np.testing.assert_array_equal(late["doubled"], ids[1:] * 2)
        assert frames == [{"outputs": None}, {"outputs": ["doubled"]}, {"outputs": ["doubled"]}, {"outputs": None}]
    finally:
        remote.close()
        server.close()
        await server.wait_closed()


async def test_an_awaited_remote_instance_raises_the_engines_error_and_is_not_ready_once_hung_up(
        socket_dir: Path) -> None:
    calls: list[int] = []

    def answer(header: dict[str, object], arrays: dict[str, np.ndarray]) -> bytes | None:
        calls.append(1)
        return encode({}, error=error_fields(Overloaded("engine queue full", 3.0))) if len(calls) == 1 else None

    server, remote = await serve_once(socket_dir, answer)
    try:
        instance = remote.instance()
        ones = {"input_ids": np.ones((1, 2), dtype=np.int64)}
        with pytest.raises(Overloaded, match="engine queue full"):
            await instance.infer_async(ones)
        with pytest.raises(NotReady, match="unreachable"):
            await instance.infer_async(ones)  # hung up mid-call
        with pytest.raises(NotReady, match="failed before"):
            await asyncio.wait_for(instance.infer_async(ones), 5)  # at once, not a wait on a dead stream
        assert len(calls) == 2
    finally:
        remote.close()
        server.close()
        await server.wait_closed()


async def test_an_awaited_call_that_outlives_its_timeout_is_not_ready(socket_dir: Path) -> None:
    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # reads the frame, never answers
        writer.close()

    path = str(socket_dir / "mute.sock")
    server = await asyncio.start_unix_server(mute, path)
    remote = RemoteEngine(path, SPECS, OUT_SPECS, PROFILE, "cpu", timeout_s=0.2)
    try:
        with pytest.raises(NotReady, match="unreachable"):
            await remote.instance().infer_async({"input_ids": np.ones((1, 2), dtype=np.int64)})
    finally:
        remote.close()
        server.close()
        await server.wait_closed()


def test_a_remote_engine_presents_the_engine_processs_tensors_and_profile(socket_dir: Path) -> None:
    remote = RemoteEngine(str(socket_dir / "none.sock"), SPECS, OUT_SPECS, PROFILE, "cuda:0")
    assert list(remote.inputs) == list(SPECS) and list(remote.outputs) == list(OUT_SPECS)
    assert remote.profile == PROFILE and remote.device == "cuda:0"
    with pytest.raises(OSError):  # nothing listens there: each instance is a connection, made at once
        remote.instance()
