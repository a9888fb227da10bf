"""What if a node ran every match it is given at once, more matches than cores, and
let the operating system share its cores among them? (docs/SCALING.md, "What limits
pgpong, and where".) Not something pgpong does: a what-if for the 11x18 row.

Each match is still played whole by one worker, so the weights would not change;
only when each match gets a core changes. A node's scheduler then shares its cores
equally among the matches it holds (processor sharing: each of k matches on c cores
advances at min(1, c / k) of a core), which finishes short matches early and lets the
long ones have a core each at the end, where whole matches on one worker per core
start the second wave's matches late.

    python docs/scaling/processor_sharing.py          # under a second

It draws batches from the model's banks (pgpong.scaling: EARLY, LATE) at its pace,
with no overhead and no pause between matches, and prints seconds per update as a
fraction of the best whole-match schedule (the clairvoyant one the issue names).
"""

from __future__ import annotations

import statistics

import numpy as np

from pgpong.placement import best_whole_matches, first_free, lower_bound, shared_cores
from pgpong.scaling import PHASES


def shared_by_node(durations: list[float], nodes: int, cpus: int) -> float:
    """Every match starts at once, dealt to the nodes in turn (as many per node as it
    gets: 27 or 28 of 300 on 11 nodes); each node shares its own cores."""
    dealt: list[list[float]] = [durations[node::nodes] for node in range(nodes)]
    return max(shared_cores(matches, cpus) for matches in dealt)


def main() -> None:
    batch, nodes, cpus = 300, 11, 18
    workers = nodes * cpus
    print(f"batch {batch} on {nodes}x{cpus}: seconds per update over the best whole-match schedule")
    print("(medians of 200 batches drawn from the bank; no overhead, no pause between matches)")
    print()
    print(
        "| phase | one worker per core, first free (pgpong) | a node's cores shared by all its matches "
        "| one node of 198 cores shared | the lower bound |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for phase, constants in PHASES.items():
        rng = np.random.default_rng(0)
        rows = []
        for _ in range(200):
            durations = list(rng.choice(constants.lengths, size=batch) / constants.steps_per_s_per_core)
            best = best_whole_matches(durations, workers)
            rows.append(
                (
                    first_free(durations, workers) / best,
                    shared_by_node(durations, nodes, cpus) / best,
                    shared_cores(durations, workers) / best,
                    lower_bound(durations, workers) / best,
                )
            )
        cells = " | ".join(f"{statistics.median(column):.2f}" for column in zip(*rows, strict=True))
        print(f"| {phase} | {cells} |")


if __name__ == "__main__":
    main()
