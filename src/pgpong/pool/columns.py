"""Many matches' stats on their way from a node's leader, through the queue, to the
driver: pickled as a few columns, not as an object per match.

At batch 3,000 the stats of every match cross two process boundaries (the leader's
report to the queue, the queue's to the driver). Pickled one object each (an
EpisodeStats with its EpisodeId, its Diagnostics, its timings) they cost about 9 us
per match of the driver's CPU and more of the queue's (docs/SCALING.md). As columns
(plain lists of numbers, the fired units as one packed byte string) they cost a few
arrays per report; the queue, which only passes them on, never makes the objects;
the driver makes them once, as it hands them to the trainer in episode order.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from pgpong.rollout import Diagnostics, EpisodeId, EpisodeStats

Columns = tuple[Any, ...]  # what StatsColumns pickles: lists of numbers, and bytes
# The fields the columns carry, each by hand: a field added to either class must be added
# here and below (tests/test_columns.py checks these against the classes).
STATS_FIELDS = ("episode", "score", "steps", "seconds", "timings", "record_bytes", "diagnostics")
DIAGNOSTICS_FIELDS = ("steps", "entropy", "p_up", "repeats", "losses", "quick_losses", "fired")


class StatsColumns:
    """Episodes' stats, held as the objects or as the columns they were pickled to
    (made into objects only when iterated)."""

    __slots__ = ("_stats", "_columns")

    def __init__(self, stats: list[EpisodeStats] | None = None, columns: Columns | None = None):
        self._stats = stats
        self._columns = columns

    def __len__(self) -> int:
        return len(self._stats) if self._stats is not None else len(self._columns_()[1])

    def __iter__(self) -> Iterator[EpisodeStats]:
        if self._stats is None:
            self._stats = _objects(self._columns_())
        return iter(self._stats)

    def __reduce__(self) -> tuple:
        return _from_columns, (self._columns_(),)

    def _columns_(self) -> Columns:
        if self._columns is None:
            assert self._stats is not None
            self._columns = _columns(self._stats)
        return self._columns


def _from_columns(columns: Columns) -> StatsColumns:
    return StatsColumns(columns=columns)


def _columns(stats: list[EpisodeStats]) -> Columns:
    """The stats as columns: episode ids flat, numbers in lists, each match's timings
    as a dict (their keys pickled once), diagnostics flat (None as an empty row), the
    fired units of those that have them packed 8 to a byte in one string."""
    ids = [value for s in stats for value in s.episode]
    scores = [s.score for s in stats]
    steps = [s.steps for s in stats]
    seconds = [s.seconds for s in stats]
    timings = [s.timings for s in stats]
    record_bytes = [s.record_bytes for s in stats]
    measured = [s.diagnostics is not None for s in stats]
    diagnostics = [
        value
        for s in stats
        if s.diagnostics is not None
        for value in (
            s.diagnostics.steps,
            s.diagnostics.entropy,
            s.diagnostics.p_up,
            s.diagnostics.repeats,
            s.diagnostics.losses,
            s.diagnostics.quick_losses,
        )
    ]
    fired = [s.diagnostics.fired for s in stats if s.diagnostics is not None and s.diagnostics.fired is not None]
    hidden = len(fired[0]) if fired else 0
    if any(len(f) != hidden for f in fired):
        raise ValueError("the matches' fired units differ in length")
    has_fired = [s.diagnostics is not None and s.diagnostics.fired is not None for s in stats]
    packed = np.packbits(np.asarray(fired, dtype=bool), axis=1).tobytes() if fired else b""
    return (ids, scores, steps, seconds, timings, record_bytes, measured, diagnostics, has_fired, packed, hidden)


def _objects(columns: Columns) -> list[EpisodeStats]:
    ids, scores, steps, seconds, timings, record_bytes, measured, diagnostics, has_fired, packed, hidden = columns
    rows: Any = []
    if hidden:
        width = -(-hidden // 8)
        bits = np.unpackbits(np.frombuffer(packed, np.uint8).reshape(-1, width), axis=1, count=hidden)
        rows = list(bits.view(bool))
    stats, d, f = [], 0, 0
    for k, score in enumerate(scores):
        diag = None
        if measured[k]:
            fired = None
            if has_fired[k]:
                fired, f = rows[f], f + 1
            n, entropy, p_up, repeats, losses, quick = diagnostics[d : d + 6]
            diag, d = Diagnostics(n, entropy, p_up, repeats, losses, quick, fired), d + 6
        episode = EpisodeId(ids[3 * k], ids[3 * k + 1], ids[3 * k + 2])
        stats.append(EpisodeStats(episode, score, steps[k], seconds[k], timings[k], record_bytes[k], diag))
    return stats


Finished = list[tuple[int, int, Any]]  # (batch, position, stats or result), as a leader's matches finish
Report = tuple[int, list[int], Any]  # (batch, positions, their stats as StatsColumns, or their results as a list)


def by_batch(finished: Finished) -> list[Report]:
    """A leader's finished matches as it reports them: per batch, the positions and
    their stats in columns (an evaluation's results, few and small, as they are)."""
    batches: dict[int, tuple[list[int], list[Any]]] = {}
    for batch, position, item in finished:
        positions, items = batches.setdefault(batch, ([], []))
        positions.append(position)
        items.append(item)
    return [
        (batch, positions, StatsColumns(items) if all(isinstance(i, EpisodeStats) for i in items) else items)
        for batch, (positions, items) in batches.items()
    ]
