"""The reducer's books (pool/reducer.py), without Ray: a batch's total is complete only
once it is opened and every match is in, whichever comes first; a batch that is over
takes nothing more."""

import asyncio

import numpy as np
import pytest

from pgpong.pool.reducer import NodeShare, Reducer
from pgpong.pool.sums import ExactSum, IntegerGradient
from test_sums import H, random_gradients


def parts(count: int) -> list[IntegerGradient]:
    return [IntegerGradient.of(grad) for grad in random_gradients(count, seed=3)]


def test_a_sum_that_comes_before_the_batch_is_opened_waits_for_it():
    async def scenario():
        reducer, (first, second) = Reducer(), parts(2)
        # The driver opens a batch without waiting, so a node's sum may come first.
        assert await reducer.add(1, 0, first, [0], NodeShare(2, 0.0))
        result = asyncio.ensure_future(reducer.result(1))
        await asyncio.sleep(0.01)
        assert not result.done()  # the number of matches is not known yet
        await reducer.open(1, 2)
        await asyncio.sleep(0.01)
        assert not result.done()  # one of two
        assert await reducer.add(1, 1, second, [1], NodeShare(2, 0.0))
        total = await asyncio.wait_for(result, 5)
        expected = ExactSum(H)
        for part in (first, second):
            expected.add(part)
        assert np.array_equal(total.grad.dense().W1, expected.to_params().W1)
        assert total.workers == 4
        # The batch is over: a late sum of it is refused, and so is a late opening.
        assert not await reducer.add(1, 0, first, [0], None)
        await reducer.open(1, 2)
        assert 1 not in reducer.batches

    asyncio.run(scenario())


def test_a_batch_complete_when_opened_is_told_at_once():
    async def scenario():
        reducer, (only,) = Reducer(), parts(1)
        assert await reducer.add(2, 0, only, [0], NodeShare(1, 0.0))
        result = asyncio.ensure_future(reducer.result(2))
        await asyncio.sleep(0.01)
        await reducer.open(2, 1)
        assert pytest.approx(only.to_float().W2) == (await asyncio.wait_for(result, 5)).grad.dense().W2

    asyncio.run(scenario())


def test_a_cancelled_batch_takes_nothing_more():
    async def scenario():
        reducer, (only,) = Reducer(), parts(1)
        await reducer.open(1, 3)
        await reducer.forget(1)
        assert not await reducer.add(1, 0, only, [0], None)
        assert 1 not in reducer.batches
        with pytest.raises(KeyError):
            await reducer.result(1)

    asyncio.run(scenario())
