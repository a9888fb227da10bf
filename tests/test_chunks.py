"""How a batch is cut into chunks, and chunks and workers spread over nodes (chunks.py)."""

import pytest

from pgpong.chunks import assign_units, chunk_sizes, shares, split


@pytest.mark.parametrize("batch,sizes", [(1, [1]), (10, [10]), (16, [16]), (17, [16, 1]), (60, [16, 16, 16, 12])])
def test_chunks_depend_on_the_batch_size_alone(batch, sizes):
    assert chunk_sizes(batch) == sizes
    assert [len(piece) for piece in split(list(range(batch)), sizes)] == sizes


def test_chunks_go_to_nodes_in_proportion_to_their_workers():
    given = assign_units(19, [18] * 11)  # batch 300 on 11 x 18: 19 chunks
    assert sorted(len(units) for units in given) == [1] * 3 + [2] * 8
    assert sorted(u for units in given for u in units) == list(range(19))
    assert assign_units(4, [1, 3]) == [[2], [0, 1, 3]]  # the tie at unit 2 goes to the first
    assert assign_units(3, [2, 2, 2]) == [[0], [1], [2]]


def test_workers_spread_over_nodes_by_their_cpus():
    assert shares(6, [2, 2, 2]) == [2, 2, 2]
    assert shares(5, [2, 2, 2]) == [2, 2, 1]
    assert shares(100, [1, 3]) == [1, 3]  # never more than a node has
    assert sum(shares(198, [18] * 11)) == 198
