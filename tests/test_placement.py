"""How a cluster pool's workers are spread over its nodes (placement.py)."""

from pgpong.placement import shares


def test_workers_spread_over_nodes_by_their_cpus():
    assert shares(6, [2, 2, 2]) == [2, 2, 2]
    assert shares(5, [2, 2, 2]) == [2, 2, 1]
    assert shares(100, [1, 3]) == [1, 3]  # never more than a node has
    assert sum(shares(198, [18] * 11)) == 198
    assert shares(3, [1, 1, 1, 1]) == [1, 1, 1, 0]
