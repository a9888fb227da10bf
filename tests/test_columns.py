"""The matches' stats in columns (pool/columns.py): what a leader reports, read back
through pickle as the queue and the driver read it, is the same, field by field."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np

from pgpong.pool.columns import DIAGNOSTICS_FIELDS, STATS_FIELDS, StatsColumns, by_batch
from pgpong.rollout import Diagnostics, EpisodeId, EpisodeStats, MatchResult


def some_stats(count: int, hidden: int = 13) -> list[EpisodeStats]:
    rng = np.random.default_rng(7)
    stats = []
    for k in range(count):
        diagnostics = None
        if k % 3 != 2:  # some matches not measured (a simulated one), some without fired units
            fired = rng.random(hidden) < 0.4 if k % 3 == 0 else None
            diagnostics = Diagnostics(
                int(rng.integers(50, 5000)),
                float(rng.random()) * 100,
                float(rng.random()) * 50,
                int(rng.integers(0, 40)),
                int(rng.integers(0, 21)),
                int(rng.integers(0, 21)),
                fired,
            )
        timings = {"env": float(rng.random()), "backward": float(rng.random())} if k % 2 else {}
        stats.append(
            EpisodeStats(
                EpisodeId(3, 17, k), float(rng.integers(-21, 22)), int(rng.integers(50, 5000)), float(rng.random()),
                timings, int(rng.integers(0, 10**6)), diagnostics,
            )
        )  # fmt: skip
    return stats


def same(a: EpisodeStats, b: EpisodeStats) -> None:
    """Every field of the two, compared with its type (an int read back as a float fails)."""
    assert type(a.episode) is EpisodeId
    for name in (f.name for f in dataclasses.fields(EpisodeStats) if f.name != "diagnostics"):
        x, y = getattr(a, name), getattr(b, name)
        assert type(x) is type(y) and x == y, name
    if b.diagnostics is None:
        assert a.diagnostics is None
        return
    assert a.diagnostics is not None
    for name in (f.name for f in dataclasses.fields(Diagnostics) if f.name != "fired"):
        x, y = getattr(a.diagnostics, name), getattr(b.diagnostics, name)
        assert type(x) is type(y) and x == y, name
    fired, expected = a.diagnostics.fired, b.diagnostics.fired
    if expected is None:
        assert fired is None
    else:
        assert fired is not None and fired.dtype == bool and np.array_equal(fired, expected)


def test_the_columns_carry_every_field_of_the_stats() -> None:
    """A field added to EpisodeStats or Diagnostics must be added to the columns too."""
    assert tuple(f.name for f in dataclasses.fields(EpisodeStats)) == STATS_FIELDS
    assert tuple(f.name for f in dataclasses.fields(Diagnostics)) == DIAGNOSTICS_FIELDS


def test_stats_read_back_through_pickle_field_by_field() -> None:
    stats = some_stats(40)
    columns = StatsColumns(stats)
    once = pickle.loads(pickle.dumps(columns))
    twice = pickle.loads(pickle.dumps(once))  # the queue passes on what it was given, unread
    assert twice._stats is None  # never made into objects on the way
    assert len(twice) == 40
    back = list(twice)
    assert len(back) == 40
    for a, b in zip(back, stats, strict=True):
        same(a, b)


def test_a_batch_diagnostics_sum_is_the_same_from_columns() -> None:
    stats = some_stats(30, hidden=200)
    direct, read = Diagnostics(), Diagnostics()
    for s in stats:
        if s.diagnostics is not None:
            direct.add(s.diagnostics)
    for s in pickle.loads(pickle.dumps(StatsColumns(stats))):
        if s.diagnostics is not None:
            read.add(s.diagnostics)
    fields = ("steps", "entropy", "p_up", "repeats", "losses", "quick_losses")
    assert [getattr(read, f) for f in fields] == [getattr(direct, f) for f in fields]
    assert read.fired is not None and direct.fired is not None
    assert np.array_equal(read.fired, direct.fired) and read.fired.sum() > 0


def test_a_leaders_report_groups_by_batch_in_order() -> None:
    stats = some_stats(5)
    result = MatchResult(EpisodeId(3, 9, 0), 4.0, 21, 17, 3000, 1.5)
    finished = [(17, 4, stats[4]), (9, 0, result), (17, 1, stats[1]), (17, 3, stats[3])]
    report = pickle.loads(pickle.dumps(by_batch(finished)))
    assert [(batch, positions) for batch, positions, _ in report] == [(17, [4, 1, 3]), (9, [0])]
    assert isinstance(report[0][2], StatsColumns)
    for a, b in zip(report[0][2], [stats[4], stats[1], stats[3]], strict=True):
        same(a, b)
    assert report[1][2] == [result]  # an evaluation's results go as they are
