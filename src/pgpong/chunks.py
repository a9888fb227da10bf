"""How a batch is cut into chunks, and how chunks are handed to nodes: pure arithmetic,
shared by the pools (pool/) and the model of seconds per update (scaling.py).

Float sums depend on their order, so the grouping depends on the batch size alone:
episodes 0-15 are chunk 0, 16-31 chunk 1, and so on. Each chunk's gradients are
summed in episode order wherever the chunk is played (pool/sums.py), and the driver
adds the chunk sums in chunk order: the weights are the same to the bit for any
number of workers and nodes.
"""

from __future__ import annotations

CHUNK = 16  # episodes per partial sum: batches up to 16 are one chunk


def chunk_sizes(batch_size: int) -> list[int]:
    """The sizes of a batch's chunks, in order: CHUNK each, the last one the rest."""
    full, rest = divmod(batch_size, CHUNK)
    return [CHUNK] * full + ([rest] if rest else [])


def split(items: list, sizes: list[int]) -> list[list]:
    """`items` cut into consecutive pieces of the given sizes."""
    pieces, start = [], 0
    for size in sizes:
        pieces.append(items[start : start + size])
        start += size
    return pieces


def assign_units(units: int, workers: list[int]) -> list[list[int]]:
    """Units 0..units-1, in order, each to the node with the fewest units per worker
    once it has it (the first such node on a tie): which units each node's leader
    plays, given each node's workers."""
    given: list[list[int]] = [[] for _ in workers]
    for unit in range(units):
        best = min(range(len(workers)), key=lambda i: (len(given[i]) + 1) / workers[i])
        given[best].append(unit)
    return given


def shares(workers: int, cpus: list[int]) -> list[int]:
    """`workers` spread over nodes with these CPUs: each node's share in proportion
    to its CPUs (largest remainders first), never more than it has."""
    total = sum(cpus)
    workers = min(workers, total)
    exact = [workers * c / total for c in cpus]
    counts = [int(x) for x in exact]
    for i in sorted(range(len(cpus)), key=lambda i: exact[i] - counts[i], reverse=True)[: workers - sum(counts)]:
        counts[i] += 1
    return counts
