"""`--workers-per-cpu auto` against one worker a CPU, in the model (docs/SCALING.md,
"auto"): seconds per update on one machine of CPUS cores for batches larger than its
CPUs, early and late in training, at the model's pace (pgpong.scaling.PHASES).

    python docs/scaling/epyc-2026-11-28/auto/auto_table.py      # about a second

Each cell is auto's seconds per update over one-a-CPU's (below 1: auto is faster), with
the N auto picks; "1" where auto keeps one a CPU (the batch would need more than 4).
"""

from __future__ import annotations

from pgpong.placement import auto_per_cpu
from pgpong.scaling import PHASES, predict

CPUS = (2, 4, 8, 16, 32, 64)
BATCHES = (10, 20, 30, 60, 100, 300)


def main() -> None:
    print("| CPUs | " + " | ".join(f"batch {b}: early / late" for b in BATCHES) + " |")
    print("| ---: |" + " ---: |" * len(BATCHES))
    for cpus in CPUS:
        cells = []
        for batch in BATCHES:
            per_cpu = auto_per_cpu(batch, [cpus])
            if batch <= cpus:
                cells.append("-")
                continue
            if per_cpu == 1:
                cells.append("1")
                continue
            ratios = []
            for constants in PHASES.values():
                one = predict(batch, 1, cpus, constants, samples=100)["seconds_per_update"]
                auto = predict(batch, 1, cpus, constants, samples=100, per_cpu=per_cpu)["seconds_per_update"]
                ratios.append(auto / one)
            cells.append(f"{ratios[0]:.2f} / {ratios[1]:.2f} ({per_cpu:.3g})")
        print(f"| {cpus} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
