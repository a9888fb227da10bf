"""The reducer's books (pool/reducer.py), without Ray: a batch's total is the exact sum
of the nodes' parts, given once every match is in; a lost node's later parts and a
cancelled batch's are refused; the step on a total is claimed by the only leader once,
or left to the reducer."""

import asyncio

import numpy as np
import pytest

from pgpong.policy import Params
from pgpong.pool.base import BatchMeasures, BatchResult
from pgpong.pool.reducer import NodeShare, Reducer, StepOrder, StepTaken, WholeBatch
from pgpong.pool.sums import ExactSum, IntegerGradient
from test_sums import H, random_gradients


def parts(count: int) -> list[IntegerGradient]:
    return [IntegerGradient.of(grad) for grad in random_gradients(count, seed=3)]


def test_the_total_waits_for_every_match_and_is_their_exact_sum():
    async def scenario():
        reducer, (first, second, third) = Reducer(), parts(3)
        await reducer.open(1, 3)
        result = asyncio.ensure_future(reducer.result([1]))
        assert await reducer.add(1, 0, first, [0], None)  # sent ahead of node 0's last match
        assert await reducer.add(1, 1, second, [2], NodeShare(2, 0.5))
        await asyncio.sleep(0.01)
        assert not result.done()  # two of three
        assert await reducer.add(1, 0, third, [1], NodeShare(2, 0.25))
        total = await asyncio.wait_for(result, 5)
        expected = ExactSum(H)
        for part in (third, first, second):
            expected.add(part)
        assert np.array_equal(total.grad.dense().W1, expected.rounded().dense().W1)
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
            await reducer.result([1])

    asyncio.run(scenario())


def test_a_batch_in_two_parts_leaves_as_one_array_with_the_bits_of_their_dense_sum():
    """--lag-share: the reducer waits for both parts, rounds each exact sum to float32
    and adds them in float32, first part first: what BatchResult.plus gives from the
    two parts' dense arrays, to the bit; the idle time is the last part's."""

    async def scenario():
        reducer, grads = Reducer(), random_gradients(5, seed=4)
        await reducer.open(1, 2)
        await reducer.open(2, 3)
        result = asyncio.ensure_future(reducer.result([1, 2]))
        first_done = asyncio.ensure_future(reducer.complete(1))
        for position, grad in enumerate(grads[2:]):
            assert await reducer.add(
                2, 0, IntegerGradient.of(grad), [position], NodeShare(1, 0.0) if position == 2 else None
            )
        await asyncio.sleep(0.01)
        assert not result.done() and not first_done.done()  # the second part is in, not the first
        assert await reducer.add(1, 1, IntegerGradient.of(grads[0]), [0], None)
        assert await reducer.add(1, 1, IntegerGradient.of(grads[1]), [1], NodeShare(7, 100.0))
        await asyncio.wait_for(first_done, 5)
        total = await asyncio.wait_for(result, 5)
        dense, parts = [], []
        for part in (grads[:2], grads[2:]):
            exact = ExactSum(H)
            for grad in part:
                exact.add(grad)
            dense.append(exact.rounded().dense())
            parts.append(exact.rounded())
        expected = Params(dense[0].W1 + dense[1].W1, dense[0].W2 + dense[1].W2)  # (float32, in this order)
        plus = BatchResult(parts[0], BatchMeasures()).plus(BatchResult(parts[1], BatchMeasures())).grad
        for got in (plus.dense(), total.grad.dense()):  # the trainer's sum of two parts, and the reducer's
            assert np.array_equal(got.W1, expected.W1) and np.array_equal(got.W2, expected.W2)
        assert len(total.grad.columns) < got.W1.shape[1]  # kept on the pixels the parts touched
        assert total.workers == 1 and total.idle_s < 100  # the last part's node alone
        assert await reducer.sent_ahead() == {0: 2, 1: 1}
        await asyncio.wait_for(reducer.complete(1), 5)  # over here: no wait
        with pytest.raises(KeyError):  # both parts were summed
            await reducer.result([2])

    asyncio.run(scenario())


def test_a_nodes_sum_of_the_whole_batch_is_the_total_as_it_came_and_comes_alone():
    """One leader played every match: it rounds its sum, which is the total, to the bits
    of the reducer's sum of its matches in any order and grouping. Rounded, nothing can
    be added to it exactly: a part beside it is refused as the bug it would be."""

    async def scenario():
        reducer, grads = Reducer(), random_gradients(6, seed=5)
        node_sum, expected = ExactSum(H), ExactSum(H)
        for grad in grads:
            node_sum.add(grad)
        for grad in reversed(grads):
            expected.add(IntegerGradient.of(grad))
        await reducer.open(1, 6)
        assert await reducer.add(1, 0, WholeBatch(node_sum.rounded(), 6), list(range(6)), NodeShare(8, 0.0))
        assert reducer.batches[1].total is None and await reducer.sent_whole() == {0: 1}  # no sum made of it here
        total = await asyncio.wait_for(reducer.result([1]), 5)
        want = expected.rounded()
        assert np.array_equal(total.grad.columns, want.columns)
        assert np.array_equal(total.grad.W1_columns, want.W1_columns) and np.array_equal(total.grad.W2, want.W2)

        await reducer.open(2, 7)  # a whole batch of 6 for a batch of 7
        with pytest.raises(ValueError, match="6 matches came as a whole batch of 7"):
            await reducer.add(2, 0, WholeBatch(node_sum.rounded(), 6), list(range(6)), NodeShare(8, 0.0))
        await reducer.open(3, 6)
        assert await reducer.add(3, 0, WholeBatch(node_sum.rounded(), 6), list(range(6)), NodeShare(8, 0.0))
        with pytest.raises(ValueError, match="after a node's sum of the whole batch"):
            await reducer.add(3, 1, IntegerGradient.of(grads[0]), [0], NodeShare(1, 0.0))

    asyncio.run(scenario())


ORDER = StepOrder(("a test", 4), 0.01, 0.9, None, None, None)  # (no weights: the reducer's copy is not of its state)


def test_the_only_leader_claims_the_step_once_and_its_word_on_it_is_the_reducers_answer():
    """The claim waits for the trainer's order, and gets it once; the leader's sum of the
    whole batch comes with its word on the step it took, which is what the reducer
    answers the trainer: it takes no step of its own, nor keeps the order."""

    async def scenario():
        reducer, grads = Reducer(), random_gradients(3, seed=7)
        node_sum = ExactSum(H)
        for grad in grads:
            node_sum.add(grad)
        await reducer.open(1, 3)
        claim = asyncio.ensure_future(reducer.claim(1))
        await asyncio.sleep(0.01)
        assert not claim.done()  # no order yet
        stepped = asyncio.ensure_future(reducer.step_ahead(None, [1], ORDER, 2))
        assert await asyncio.wait_for(claim, 5) == (ORDER, 2)
        assert await reducer.claim(1) is None  # once
        taken = StepTaken(("a test", 5), (1.5, 2.5))
        assert await reducer.add(1, 0, WholeBatch(node_sum.rounded(), 3), [0, 1, 2], NodeShare(3, 0.0), taken)
        answer = await asyncio.wait_for(stepped, 5)
        assert (answer.batch, answer.state, answer.squares) == (2, ("a test", 5), (1.5, 2.5))
        assert np.array_equal(answer.total.grad.W1_columns, node_sum.rounded().W1_columns)
        assert await reducer.stepped_by_leaders() == 1 and reducer.mirror.weights is None  # no step here
        assert reducer.orders == {} and reducer.claimed == {}

    asyncio.run(scenario())


def test_a_claim_gets_no_step_where_there_is_none_or_the_reducer_has_it():
    """None for a batch collected without a step, cancelled, in two parts (--lag-share),
    or summed here in part before the claim came (a word on a step then is not taken).
    Claimed, but the leader's sum came without its word (the answer was not in yet): the
    reducer's own step (here its copy is not of the order's state: none; the trainer's
    publish brings the weights)."""

    async def scenario():
        reducer, (first, second) = Reducer(), parts(2)
        await reducer.open(1, 1)
        claim = asyncio.ensure_future(reducer.claim(1))
        assert await reducer.add(1, 0, first, [0], NodeShare(1, 0.0))
        await reducer.result([1])  # collected without a step
        assert await asyncio.wait_for(claim, 5) is None

        await reducer.open(2, 1)
        claim = asyncio.ensure_future(reducer.claim(2))
        await reducer.forget(2)
        assert await asyncio.wait_for(claim, 5) is None

        await reducer.open(3, 1)
        await reducer.open(4, 1)
        stepped = asyncio.ensure_future(reducer.step_ahead(None, [3, 4], ORDER, 5))
        claim = asyncio.ensure_future(reducer.claim(3))
        assert await reducer.add(3, 0, first, [0], NodeShare(1, 0.0))
        assert await reducer.add(4, 0, second, [0], NodeShare(1, 0.0))
        assert await asyncio.wait_for(claim, 5) is None
        assert (await asyncio.wait_for(stepped, 5)).squares is None

        await reducer.open(6, 2)
        assert await reducer.add(6, 0, first, [0], None)  # a sum ahead of the node's last match
        stepped = asyncio.ensure_future(reducer.step_ahead(None, [6], ORDER, 7))
        assert await asyncio.wait_for(reducer.claim(6), 5) is None
        assert await reducer.add(6, 0, second, [1], NodeShare(1, 0.0), StepTaken(("a test", 5), (1.0, 1.0)))
        answer = await asyncio.wait_for(stepped, 5)
        assert answer.state is None and answer.squares is None  # not the word nobody asked for

        await reducer.open(8, 1)
        stepped = asyncio.ensure_future(reducer.step_ahead(None, [8], ORDER, 9))
        assert await asyncio.wait_for(reducer.claim(8), 5) == (ORDER, 9)
        assert await reducer.add(8, 0, first, [0], NodeShare(1, 0.0))  # without the leader's word
        answer = await asyncio.wait_for(stepped, 5)
        assert answer.state is None and answer.squares is None
        assert await reducer.stepped_by_leaders() == 0 and reducer.orders == {} and reducer.claimed == {}

    asyncio.run(scenario())
