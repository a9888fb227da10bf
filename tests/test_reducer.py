"""The reducer's books (pool/reducer.py), without Ray: a batch's total is the exact sum
of the nodes' parts, given once every match is in; a lost node's later parts and a
cancelled batch's are refused."""

import asyncio

import numpy as np
import pytest

from pgpong.pool.reducer import NodeShare, Reducer
from pgpong.pool.sums import ExactSum, IntegerGradient
from test_sums import H, random_gradients


def parts(count: int) -> list[IntegerGradient]:
    return [IntegerGradient.of(grad) for grad in random_gradients(count, seed=3)]


def test_the_total_waits_for_every_match_and_is_their_exact_sum():
    async def scenario():
        reducer, (first, second, third) = Reducer(), parts(3)
        await reducer.open(1, 3)
        result = asyncio.ensure_future(reducer.result(1))
        assert await reducer.add(1, 0, first, [0], None)  # sent ahead of node 0's last match
        assert await reducer.add(1, 1, second, [2], NodeShare(2, 0.5))
        await asyncio.sleep(0.01)
        assert not result.done()  # two of three
        assert await reducer.add(1, 0, third, [1], NodeShare(2, 0.25))
        total = await asyncio.wait_for(result, 5)
        expected = ExactSum(H)
        for part in (third, first, second):
            expected.add(part)
        assert np.array_equal(total.grad.dense().W1, expected.to_params().W1)
        assert total.workers == 4 and total.idle_s >= 0.75
        assert await reducer.sent_ahead() == {0: 1, 1: 0}
        assert not await reducer.add(1, 1, second, [2], None)  # the batch is over: refused

    asyncio.run(scenario())


def test_a_lost_node_and_a_cancelled_batch_take_nothing_more():
    async def scenario():
        reducer, (first, second) = Reducer(), parts(2)
        await reducer.open(1, 2)
        assert await reducer.add(1, 0, first, [0], None)
        assert await reducer.close(0) == {1: [0]}  # what node 0's sums brought stays in the sum
        assert not await reducer.add(1, 0, second, [1], NodeShare(1, 0.0))
        await reducer.forget(1)
        assert not await reducer.add(1, 1, second, [1], NodeShare(1, 0.0))
        with pytest.raises(KeyError):
            await reducer.result(1)

    asyncio.run(scenario())
