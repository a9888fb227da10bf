"""How a batch's gradients are summed: each chunk from zero in episode order, the chunk sums in
chunk order (pool/sums.py)."""

import numpy as np
import pytest

from pgpong.chunks import CHUNK, chunk_sizes, split
from pgpong.frames import D
from pgpong.policy import EpisodeGradient, Params
from pgpong.pool.sums import sum_in_chunks
from pgpong.rollout import EpisodeId, EpisodeResult

H = 8


def random_results(count: int, seed: int = 0) -> list[EpisodeResult]:
    """Episodes whose sparse gradients touch random pixels, with values of very
    different sizes, so that the order of a sum shows in its bits."""
    rng = np.random.default_rng(seed)
    results = []
    for k in range(count):
        columns = np.sort(rng.choice(D, size=rng.integers(1, 60), replace=False)).astype(np.int16)
        scale = 10.0 ** rng.integers(-6, 3, size=(H, len(columns)))
        W1c = np.asfortranarray((rng.standard_normal((H, len(columns))) * scale).astype(np.float32))
        grad = EpisodeGradient(columns, W1c, rng.standard_normal(H).astype(np.float32))
        results.append(EpisodeResult(EpisodeId(0, 0, k), grad, -21.0 + k, steps=100 + k, seconds=0.1))
    return results


def flat_sum(results: list[EpisodeResult]) -> Params:
    total = Params(np.zeros((H, D), np.float32, order="F"), np.zeros(H, np.float32))
    for r in results:
        r.grad.add_to(total)
    return total


def chunked_sum(results: list[EpisodeResult]) -> Params:
    total = Params(np.zeros((H, D), np.float32, order="F"), np.zeros(H, np.float32))
    for chunk in sum_in_chunks(results, chunk_sizes(len(results))):
        chunk.grad.add_to(total)
    return total


@pytest.mark.parametrize("batch", [1, 10, CHUNK])
def test_a_batch_of_one_chunk_sums_to_the_flat_sum_bit_for_bit(batch):
    results = random_results(batch)
    np.testing.assert_array_equal(chunked_sum(results).W1, flat_sum(results).W1)
    np.testing.assert_array_equal(chunked_sum(results).W2, flat_sum(results).W2)


def test_several_chunks_are_summed_chunk_by_chunk_and_the_order_shows():
    results = random_results(3 * CHUNK + 5, seed=1)
    chunks = split(results, chunk_sizes(len(results)))
    by_hand = Params(np.zeros((H, D), np.float32, order="F"), np.zeros(H, np.float32))
    for chunk in chunks:
        part = flat_sum(chunk)  # each chunk from zero, in episode order, then the chunk sums in order
        by_hand.W1 += part.W1
        by_hand.W2 += part.W2
    summed = chunked_sum(results)
    np.testing.assert_array_equal(summed.W1, by_hand.W1)
    np.testing.assert_array_equal(summed.W2, by_hand.W2)
    # the grouping matters to the bit: the flat sum differs (so the test could fail)
    assert not np.array_equal(summed.W1, flat_sum(results).W1)


def test_a_chunk_keeps_its_episodes_without_their_gradients_and_its_touched_pixels_only():
    results = random_results(20, seed=2)
    heard: list = []
    chunks = list(sum_in_chunks(results, chunk_sizes(20), heard.append))
    assert [e.episode.episode for e in heard] == list(range(20))  # every episode, in order
    assert [[e.score for e in c.episodes] for c in chunks] == [
        [r.score for r in results[:16]],
        [-5.0, -4.0, -3.0, -2.0],
    ]
    touched = np.unique(np.concatenate([r.grad.columns for r in results[:16]]))
    np.testing.assert_array_equal(chunks[0].grad.columns, touched)
    assert chunks[0].nbytes < flat_sum(results[:16]).nbytes
