"""The text batcher: concurrent callers' texts tokenised by one call, each caller's answer its own."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from fleetserve.errors import Overloaded
from fleetserve.models.store import ModelStore
from fleetserve.models.tokenizer import Encoded, TextTokenizer
from fleetserve.replica.text_batch import TextBatcher

GROUPS = [["red running shoes"], ["a blue kettle", "x"], ["the quick brown fox jumps over the lazy dog " * 4]]


@pytest.fixture
def tokenizer() -> TextTokenizer:
    model = ModelStore().resolve("tiny")
    assert model.tokenizer_path is not None
    return TextTokenizer(model.tokenizer_path, 16)


def same(a: Encoded, b: Encoded) -> None:
    for name, value in a.as_inputs().items():
        np.testing.assert_array_equal(value, b.as_inputs()[name], err_msg=name)
        assert value.dtype == np.int64
    assert a.truncated == b.truncated


def test_encode_groups_matches_encoding_each_group_alone(tokenizer: TextTokenizer) -> None:
    grouped = tokenizer.encode_groups(GROUPS)
    assert len(grouped) == len(GROUPS)
    for g, e in zip(GROUPS, grouped, strict=True):
        same(e, tokenizer.encode(g))
    assert grouped[2].truncated == [True] and grouped[1].input_ids.shape[0] == 2


class CountingTokenizer(TextTokenizer):
    def __init__(self, inner: TextTokenizer) -> None:
        self.__dict__.update(inner.__dict__)
        self.calls: list[int] = []

    def encode_groups(self, groups: list[list[str]]) -> list[Encoded]:
        self.calls.append(sum(len(g) for g in groups))
        return super().encode_groups(groups)


@pytest.mark.parametrize("max_jobs", [2, 0])
async def test_callers_in_one_loop_pass_share_one_tokenizer_call(tokenizer: TextTokenizer, max_jobs: int) -> None:
    counting = CountingTokenizer(tokenizer)
    batcher = TextBatcher(counting, max_texts=100, max_jobs=max_jobs)
    results = await asyncio.gather(*(batcher.encode([g]) for g in GROUPS))
    assert counting.calls == [4]
    for g, (e,) in zip(GROUPS, results, strict=True):
        same(e, tokenizer.encode(g))
    (alone,) = await batcher.encode([["a lone request"]])
    same(alone, tokenizer.encode(["a lone request"]))
    assert counting.calls == [4, 1]


async def test_max_texts_starts_a_job_early_and_later_arrivals_wait_for_the_next(tokenizer: TextTokenizer) -> None:
    counting = CountingTokenizer(tokenizer)
    batcher = TextBatcher(counting, max_texts=2, max_jobs=1)
    results = await asyncio.gather(*(batcher.encode([[str(i)]]) for i in range(5)))
    assert counting.calls == [2, 3]  # the first two at once; the rest parked while that job ran
    assert [r[0].input_ids.shape[0] for r in results] == [1] * 5


@pytest.mark.parametrize("max_jobs", [2, 0])
async def test_a_tokenizer_failure_reaches_every_caller_of_the_pass(tokenizer: TextTokenizer, max_jobs: int) -> None:
    class Broken(CountingTokenizer):
        def encode_groups(self, groups: list[list[str]]) -> list[Encoded]:
            raise RuntimeError("tokenizer broke")

    batcher = TextBatcher(Broken(tokenizer), max_jobs=max_jobs)
    results = await asyncio.gather(batcher.encode([["a"]]), batcher.encode([["b"]]), return_exceptions=True)
    assert [str(r) for r in results] == ["tokenizer broke", "tokenizer broke"]



@pytest.mark.parametrize(("max_jobs", "on_loop"), [(2, False), (0, True)])
async def test_max_jobs_0_tokenises_on_the_event_loop_thread_and_otherwise_beside_it(
        tokenizer: TextTokenizer, max_jobs: int, on_loop: bool) -> None:
    threads: list[threading.Thread] = []

    class Where(CountingTokenizer):
        def encode_groups(self, groups: list[list[str]]) -> list[Encoded]:
            threads.append(threading.current_thread())
            return super().encode_groups(groups)

    batcher = TextBatcher(Where(tokenizer), max_jobs=max_jobs)
    await asyncio.gather(*(batcher.encode([g]) for g in GROUPS))
    assert len(threads) == 1 and (threads[0] is threading.current_thread()) == on_loop


async def test_a_caller_that_goes_away_leaves_the_others_their_answers(tokenizer: TextTokenizer) -> None:
    counting = CountingTokenizer(tokenizer)
    batcher = TextBatcher(counting, max_texts=100)
    gone = asyncio.ensure_future(batcher.encode([GROUPS[0]]))
    stays = asyncio.ensure_future(batcher.encode([GROUPS[1]]))
    await asyncio.sleep(0)  # both parked for the same job
    gone.cancel()
    (answer,) = await stays
    same(answer, tokenizer.encode(GROUPS[1]))
    assert gone.cancelled() and counting.calls == [3]

async def test_texts_beyond_max_pending_are_refused_as_overload(tokenizer: TextTokenizer) -> None:
    batcher = TextBatcher(tokenizer, max_pending=3)
    first = asyncio.ensure_future(batcher.encode([["a", "b"]]))
    await asyncio.sleep(0)  # parked, its job not yet started
    with pytest.raises(Overloaded, match="2 texts are waiting to be tokenised; the limit is 3"):
        await batcher.encode([["c", "d"]])
    assert len(await first) == 1


def test_limits_must_be_positive(tokenizer: TextTokenizer) -> None:
    with pytest.raises(ValueError, match="max_texts and max_pending must be >= 1, max_jobs >= 0"):
        TextBatcher(tokenizer, max_jobs=-1)
