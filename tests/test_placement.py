"""How a cluster pool's workers are spread over its nodes (placement.py)."""

import numpy as np
import pytest

from pgpong.placement import (
    auto_per_cpu,
    cluster_workers,
    cpu_share,
    lower_bound,
    node_workers,
    report_seconds,
    request_size,
    requests,
    shared_cores,
    shared_first_free,
    shares,
)


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


def test_a_lag_share_lets_a_batch_s_first_matches_fill_the_workers_the_last_ones_leave_idle():
    import numpy as np

    from pgpong.placement import pipelined

    # four workers, batches of a 3 s match then two 1 s ones, 0.5 s per update: without
    # a lag 3.5 s an update. With the first third of each batch (its 3 s match) one
    # update behind, it starts when update k - 2 is done: update k is done at
    # max(done[k-2] + 3, done[k-1] + 1) + 0.5, a steady 1.75 s an update (1.5 and 2 by turns)
    batches = [[3.0, 1.0, 1.0]] * 8
    assert np.diff(pipelined(batches, 4, 0.0, 0.5, 0)).tolist() == [3.5] * 7
    shared = np.diff(pipelined(batches, 4, 0.0, 0.5, 0, share=1 / 3))
    assert shared[-6:].tolist() == [2.0, 1.5] * 3
    # a share of 0 is no lag, all of a batch is --lag 1, and --lag 1 ignores a share
    rng = np.random.default_rng(7)
    for workers in (3, 16, 64):
        batches = [list(rng.uniform(0.2, 2.0, size=rng.integers(1, 100))) for _ in range(12)]
        plain, lagged = pipelined(batches, workers, 0.003, 0.06, 0), pipelined(batches, workers, 0.003, 0.06, 1)
        assert pipelined(batches, workers, 0.003, 0.06, 0, share=0.0) == plain
        assert pipelined(batches, workers, 0.003, 0.06, 0, share=1.0) == lagged
        assert pipelined(batches, workers, 0.003, 0.06, 1, share=0.3) == lagged
        half = pipelined(batches, workers, 0.003, 0.06, 0, share=0.5)
        assert all(b <= a + 1e-12 for a, b in zip(plain, half, strict=True))


def test_updates_under_a_lag_end_in_order():
    from pgpong.placement import pipelined

    # a long first batch: the short ones after it are played, but their updates wait for its
    done = pipelined([[10.0], [1.0], [1.0], [1.0]], 2, 0.0, 0.5, 1)
    assert done == sorted(done) and done[1] == 11.0


def test_requests_counts_a_leaders_asks_of_the_queue_by_hand():
    # one leader of 2 workers, 4 matches: all in the first answer (2 per worker), then a last, empty one
    assert requests([1.0] * 4, [2], answer=0.0) == 2
    # two leaders of a worker each, 6 matches: 2 each at first (2 per worker left), one each when
    # its worker has played both, then a last, empty one each
    assert requests([1.0] * 6, [1, 1], answer=0.0) == 6
    # the model's count for 1x64, batch 300 (two leaders of 32): bench measured 32 requests per update
    lengths = [(900 + 37 * k % 300) / 2600 for k in range(300)]  # 0.35-0.46 s, in no order
    assert 26 <= requests(lengths, [32, 32], pause=0.0035) <= 36


def test_the_leaders_periodic_reports_reach_the_queue_at_most_32_times_a_second():
    assert [report_seconds(n) for n in (1, 3, 11, 16)] == [0.5] * 4  # the cadence of clusters up to 16 leaders
    assert report_seconds(32) == 1.0 and report_seconds(110) == pytest.approx(3.4375)
    for leaders in range(1, 2000):
        assert leaders / report_seconds(leaders) <= 32 + 1e-9


def test_a_request_brings_a_free_worker_each_or_a_quarter_of_the_share_left():
    assert request_size(free=18, left=300, size=18, workers=198) == 18
    assert request_size(free=1, left=282, size=18, workers=198) == 7  # ceil(282 * 18 / (4 * 198))
    assert request_size(free=3, left=20, size=18, workers=198) == 3
    assert request_size(free=5, left=2, size=18, workers=198) == 2
    assert request_size(free=10, left=500, size=10, workers=100) == 20  # 2 per free worker: at least 2 per worker left


def test_shared_cores_by_hand_and_at_its_limits():
    # [1, 1, 2] on 2 cores: each at 2/3 until the two short ones end at 1.5, then the
    # long one alone has 1 left at full speed: 2.5.
    assert shared_cores([2.0, 1.0, 1.0], 2) == 2.5
    rng = np.random.default_rng(0)
    lengths = list(rng.uniform(1, 3, size=30))
    assert shared_cores(lengths, 30) == max(lengths)  # a core each
    assert abs(shared_cores(lengths, 1) - sum(lengths)) < 1e-9  # one core: the work, one after another
    assert lower_bound(lengths, 7) <= shared_cores(lengths, 7) < sum(lengths)


def test_workers_sharing_a_nodes_cores_by_hand_and_at_their_limits():
    from pgpong.placement import first_free

    # 3 matches of 1 on 2 cores: with 3 workers all play at 2/3 of a core and end at 1.5;
    # with 2, the third waits for a free core: 2.
    assert shared_first_free([1.0, 1.0, 1.0], [(3, 2)]) == pytest.approx(1.5)
    assert shared_first_free([1.0, 1.0, 1.0], [(2, 2)]) == first_free([1.0, 1.0, 1.0], 2) == 2.0
    # two nodes: the first fills first (4 on its 2 cores, at 1/2), the second has one on its 2
    assert shared_first_free([1.0] * 5, [(4, 2), (4, 2)]) == pytest.approx(2.0)
    rng = np.random.default_rng(1)
    for _ in range(20):
        lengths = list(rng.uniform(1, 3, size=int(rng.integers(1, 40))))
        workers = int(rng.integers(1, 12))  # no more workers than cores: a core each, first free
        assert shared_first_free(lengths, [(workers, workers)], 0.01) == pytest.approx(
            first_free(lengths, workers, 0.01)
        )
        cores = int(rng.integers(1, 12))  # every match started at once: the cores shared
        assert shared_first_free(lengths, [(len(lengths), cores)]) == pytest.approx(shared_cores(lengths, cores))
        for nowhere in ([], [(0, 2)], [(2, 0)]):  # no node that can play
            with pytest.raises(ValueError, match="no node with workers and cores"):
                shared_first_free(lengths, nowhere)
        split = [(workers, cores), (workers + 1, cores)]  # never below the lower bound of the cores
        assert shared_first_free(lengths, split) >= lower_bound(lengths, 2 * cores) - 1e-9


def _shared_step_by_step(durations: list[float], nodes: list[tuple[int, int]], pause: float) -> float:
    """shared_first_free's schedule the obvious way: at each end anywhere, every match in
    play on every node advanced by its node's share of the time."""
    todo = [d + pause for d in durations]
    playing: list[list[float]] = [[] for _ in nodes]  # the work left of each match in play
    for n, (workers, cores) in enumerate(nodes):
        while todo and len(playing[n]) < workers and cores > 0:
            playing[n].append(todo.pop(0))
    now = 0.0
    while any(playing):
        rates = [min(1.0, cores / len(left)) if left else 0.0 for left, (_, cores) in zip(playing, nodes, strict=True)]
        step, n = min((min(left) / rates[n], n) for n, left in enumerate(playing) if left)
        now += step
        for m, left in enumerate(playing):
            playing[m] = [w - step * rates[m] for w in left]
        playing[n].remove(min(playing[n]))
        if todo:
            playing[n].append(todo.pop(0))
    return now


def test_workers_sharing_cores_end_as_a_step_by_step_simulation_says():
    """The schedule that follows each node's own clock (one event heap entry a node) ends
    when the obvious simulation, which advances every match at every end, does: on random
    clusters of 1-12 nodes with more workers than cores, fewer, and as many (lengths
    drawn from a continuum: at a tie the two may give the next match to different nodes)."""
    rng = np.random.default_rng(7)
    for _ in range(300):
        lengths = list(rng.uniform(0.5, 2.0, size=int(rng.integers(1, 60))))
        nodes = [(int(rng.integers(1, 9)), int(rng.integers(1, 5))) for _ in range(int(rng.integers(1, 13)))]
        pause = float(rng.choice([0.0, 0.01]))
        expected = _shared_step_by_step(lengths, nodes, pause)
        assert shared_first_free(lengths, nodes, pause) == pytest.approx(expected, rel=1e-9), (lengths, nodes)


def test_batches_pipelined_on_shared_cores_by_hand():
    """Four matches of 1 a batch, four workers on 2 cores, a step of 0.5: each batch plays
    at half a core a match, 2 s; with a lag of 1 the next batch's matches take the
    workers as they free up, so the step is hidden. And with no more workers than cores,
    pipelined's schedule; with one batch, shared_first_free's plus the step."""
    from pgpong.placement import pipelined, shared_pipelined

    four = [[1.0] * 4 for _ in range(4)]
    assert shared_pipelined(four, [(4, 2)], 0.0, 0.5, 0) == pytest.approx([2.5, 5.0, 7.5, 10.0])
    assert shared_pipelined(four, [(4, 2)], 0.0, 0.5, 1) == pytest.approx([2.5, 4.5, 6.5, 8.5])
    # lag 0 with the first half of batch 1 early: it starts as batch 0 ends (2.0) at a
    # core each, the rest at 2.5, when all four share the cores; the first half ends at
    # 3.5, the rest at 4.0 (a core each again): 4.5
    assert shared_pipelined(four[:2], [(4, 2)], 0.0, 0.5, 0, share=0.5) == pytest.approx([2.5, 4.5])
    with pytest.raises(ValueError, match="no node with workers and cores"):
        shared_pipelined(four, [(2, 0)], 0.0, 0.5, 0)
    rng = np.random.default_rng(3)
    for _ in range(100):
        batches = [list(rng.uniform(0.3, 1.5, size=int(rng.integers(1, 30)))) for _ in range(int(rng.integers(1, 7)))]
        nodes, each = int(rng.integers(1, 4)), int(rng.integers(1, 9))
        lag = int(rng.integers(0, 3))
        share = float(rng.choice([0.0, 0.3, 1.0])) if lag == 0 else 0.0
        shared = shared_pipelined(batches, [(each, each)] * nodes, 0.003, 0.05, lag, share)
        assert shared == pytest.approx(pipelined(batches, nodes * each, 0.003, 0.05, lag, share), rel=1e-9)
        crowded = [(int(rng.integers(1, 12)), int(rng.integers(1, 6))) for _ in range(nodes)]
        [alone] = shared_pipelined(batches[:1], crowded, 0.003, 0.05, 0)
        assert alone == pytest.approx(shared_first_free(batches[0], crowded, 0.003) + 0.05, rel=1e-9)
        lagged = shared_pipelined(batches, crowded, 0.003, 0.05, 1)
        assert lagged[-1] <= shared_pipelined(batches, crowded, 0.003, 0.05, 0)[-1] + 1e-9
        assert lagged == sorted(lagged)  # updates end in order


def test_workers_a_cpu_fit_in_what_ray_counts():
    assert (cpu_share(1.0), cpu_share(1.5), cpu_share(1.6), cpu_share(3.0)) == (1.0, 0.6666, 0.625, 0.3333)
    assert [node_workers(18, n) for n in (1.0, 1.5, 1.6, 2.0)] == [18, 27, 28, 36]
    assert node_workers(2, 1.5) == 3 and node_workers(1, 1.5) == 1 and node_workers(0, 2.0) == 0
    for cpus in range(1, 65):
        for per_cpu in (1.0, 1.3, 1.5, 1.6, 2.0, 2.5, 3.7, 4.0):
            count = node_workers(cpus, per_cpu)
            assert count * cpu_share(per_cpu) <= cpus + 1e-9 < (count + 1) * cpu_share(per_cpu)
    # no more workers than a batch's matches need, or than the CPUs if they are more
    assert cluster_workers([18] * 11, 2.0) == 396 and cluster_workers([18] * 11, 2.0, 300) == 300
    assert cluster_workers([18] * 11, 1.5, 300) == 297  # what 1.5 has room for: too few
    assert cluster_workers([18] * 11, 2.0, 60) == 198 and cluster_workers([18] * 11, 1.0, 300) == 198
    assert cluster_workers([2, 2], 1.5, 6) == 6 and cluster_workers([2, 2], 2.0, 6) == 6


def test_auto_gives_each_match_a_worker_when_that_is_at_most_four_a_cpu():
    assert auto_per_cpu(300, [18] * 11, 4.0) == 28 / 18  # 28 a node (27.3 on average): all 300 at once
    assert auto_per_cpu(10, [8], 4.0) == 1.25 and auto_per_cpu(4, [2], 4.0) == 2.0
    assert auto_per_cpu(10, [2, 4], 4.0) == 1.75  # room for 3 on 2 CPUs and 7 on 4 (at 1.5: 3 and 6)
    assert auto_per_cpu(300, [1] + [18] * 11, 4.0) == 28 / 18  # a small node does not raise it for all
    # the batch fits the CPUs, or would need more than the most: one a CPU
    assert auto_per_cpu(60, [64], 4.0) == auto_per_cpu(64, [64], 4.0) == auto_per_cpu(10, [2], 4.0) == 1.0
    assert auto_per_cpu(None, [8], 4.0) == auto_per_cpu(10, [], 4.0) == auto_per_cpu(10, [0, 0], 4.0) == 1.0
    rng = np.random.default_rng(0)
    for _ in range(300):  # any nodes and batch: the fewest a CPU with room for a worker for every match
        cpus = [int(c) for c in rng.integers(0, 40, size=rng.integers(1, 12))]
        matches = int(rng.integers(1, 5 * sum(cpus) + 2))
        per_cpu = auto_per_cpu(matches, cpus, 4.0)

        def room(n: float, cpus: list[int] = cpus) -> int:
            return sum(node_workers(c, n) for c in cpus)

        fewer = [k / c for c in cpus if c for k in range(c, 4 * c + 1) if k / c < per_cpu]
        if per_cpu > 1:
            assert per_cpu <= 4.0 and room(per_cpu) >= matches and cluster_workers(cpus, per_cpu, matches) == matches
            assert all(room(n) < matches for n in fewer)
        else:
            assert matches <= sum(cpus) or room(4.0) < matches
