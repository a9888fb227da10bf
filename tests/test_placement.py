"""How a cluster pool's workers are spread over its nodes (placement.py)."""

from pgpong.placement import shares


def test_workers_spread_over_nodes_by_their_cpus():
    assert shares(6, [2, 2, 2]) == [2, 2, 2]
    assert shares(5, [2, 2, 2]) == [2, 2, 1]
    assert shares(100, [1, 3]) == [1, 3]  # never more than a node has
    assert sum(shares(198, [18] * 11)) == 198
    assert shares(3, [1, 1, 1, 1]) == [1, 1, 1, 0]


def test_pipelined_without_a_lag_is_the_first_free_schedule_plus_the_step_batch_after_batch():
    import numpy as np

    from pgpong.placement import first_free, pipelined

    rng = np.random.default_rng(5)
    batches = [list(rng.uniform(0.3, 1.2, size=n)) for n in (7, 30, 1, 64, 12)]
    done = pipelined(batches, 8, pause=0.01, step=0.25, lag=0)
    took = np.diff([0.0, *done])
    np.testing.assert_allclose(took, [first_free(b, 8, 0.01) + 0.25 for b in batches])


def test_a_lag_of_one_hides_the_step_and_the_barrier_and_is_not_slower_on_random_batches():
    import numpy as np

    from pgpong.placement import pipelined

    # two workers, batches of two 1 s matches, 0.5 s per update: 1.5 s an update without
    # a lag; with lag 1 the next batch's matches fill the workers while the step runs
    same = [[1.0, 1.0]] * 6
    assert np.diff(pipelined(same, 2, 0.0, 0.5, 0)).tolist() == [1.5] * 5
    assert np.diff(pipelined(same, 2, 0.0, 0.5, 1)).tolist() == [1.0] * 5
    rng = np.random.default_rng(6)
    for workers in (3, 16, 64):
        batches = [list(rng.uniform(0.2, 2.0, size=rng.integers(1, 100))) for _ in range(12)]
        plain, lagged = pipelined(batches, workers, 0.003, 0.06, 0), pipelined(batches, workers, 0.003, 0.06, 1)
        assert all(b <= a + 1e-12 for a, b in zip(plain, lagged, strict=True))
        # never before its own matches could all be played, one batch after another at best
        assert lagged[-1] >= sum(sum(b) for b in batches) / workers


def test_updates_under_a_lag_end_in_order():
    from pgpong.placement import pipelined

    # a long first batch: the short ones after it are played, but their updates wait for its
    done = pipelined([[10.0], [1.0], [1.0], [1.0]], 2, 0.0, 0.5, 1)
    assert done == sorted(done) and done[1] == 11.0
