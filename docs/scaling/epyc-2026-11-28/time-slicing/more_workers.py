"""More rollout workers than cores, but fewer than the batch's matches: does it help?
(docs/SCALING.md, "Sharing a node's cores instead".)

Batch 300 on 11 nodes of 18 cores, with W workers dealt evenly over the nodes: each
worker takes the next match from one queue when free (episode order), and a node's
cores are shared equally among the matches it is playing (each of k advances at
min(1, 18 / k) of a core). No overhead, no pause; batches drawn from the model's
banks (pgpong.scaling.PHASES) at its pace. Prints the median, over 100 batches, of
seconds per update over the best whole-match schedule on 198 workers.

    python more_workers.py        # a few seconds
"""

from __future__ import annotations

import statistics

import numpy as np

from pgpong.placement import best_whole_matches, shares
from pgpong.scaling import PHASES


def shared_nodes(durations: list[float], cores: int, per_node: list[int]) -> float:
    """When the last match ends (an event per match end)."""
    todo = list(reversed(durations))
    playing: list[list[float]] = [[todo.pop() for _ in range(min(n, len(todo)))] for n in per_node]
    now = 0.0
    while any(playing):
        rates = [min(1.0, cores / len(work)) if work else 0.0 for work in playing]
        step = min(min(work) / rate for work, rate in zip(playing, rates, strict=True) if work)
        now += step
        for node, work in enumerate(playing):
            left = [w - step * rates[node] for w in work]
            playing[node] = [w for w in left if w > 1e-12]
            for _ in range(len(left) - len(playing[node])):
                if todo:
                    playing[node].append(todo.pop())
    return now


def main() -> None:
    batch, nodes, cores = 300, 11, 18
    counts = [198, 217, 247, 267, 297, 300]
    print(f"batch {batch} on {nodes}x{cores}, W workers: seconds per update over the best whole-match schedule")
    print()
    print("| phase | " + " | ".join(f"W = {w}" for w in counts) + " |")
    print("| --- |" + " ---: |" * len(counts))
    for phase, c in PHASES.items():
        rng = np.random.default_rng(0)
        draws = [list(rng.choice(c.lengths, size=batch) / c.steps_per_s_per_core) for _ in range(100)]
        cells = []
        for workers in counts:
            per_node = shares(workers, [workers] * nodes)  # as even as can be
            ratios = [shared_nodes(d, cores, per_node) / best_whole_matches(d, nodes * cores) for d in draws]
            cells.append(f"{statistics.median(ratios):.2f}")
        print(f"| {phase} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
