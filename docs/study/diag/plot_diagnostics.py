"""Draw docs/study/diag/diagnostics.png: the diagnostics of the four default runs of
docs/LEARNING.md's "Fast and slow seeds" (seeds 0 and 2 fast, 5 and 7 slow), against
env steps, from their progress.csv files beside this script. With --table, print
that section's table instead (means over the batches within 50k env steps of each mark).

    .venv/bin/python docs/study/diag/plot_diagnostics.py [--table]

Each panel shows every batch (thin) and a running mean over 5 batches (thick).
"""

from __future__ import annotations

import csv
import os
import sys
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

HERE = Path(__file__).resolve().parent
RUNS = {  # seed: (label, colour); fast seeds in blues, slow ones in reds
    0: ("seed 0 (fast)", "#1f5fa8"),
    2: ("seed 2 (fast)", "#5fa8e0"),
    5: ("seed 5 (slow)", "#c0392b"),
    7: ("seed 7 (slow)", "#f0883e"),
}
PANELS = [  # column, title, y label, y range (None: the data's)
    ("running_reward", "Running reward", "points (0 = as good as the built-in player)", (-21, 1)),
    ("entropy", "Policy entropy (mean over the batch's steps)", "nats (ln 2 = 0.693: a coin)", (0, 0.72)),
    ("w1_norm", "W1 norm after the update", "L2 norm", None),
    ("update_norm", "Update norm (W1 and W2, as added)", "L2 norm", None),
    ("repeat_share", "Repeat share (action = the step before's)", "share of steps", None),
    ("quick_loss_share", "Quick-loss share (lost without a return)", "share of points lost", (0, 1)),
]
SMOOTH = 5  # batches in the running mean
MAX_STEPS = 2.5e6


def read(seed: int) -> dict[str, list[float]]:
    with open(HERE / f"default-s{seed}" / "progress.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if float(row["env_steps"]) <= MAX_STEPS * 1.02]
    return {name: [float(row[name]) for row in rows] for name in rows[0]}


def running_mean(values: list[float], n: int) -> list[float]:
    return [sum(values[max(0, i - n + 1) : i + 1]) / (i + 1 - max(0, i - n + 1)) for i in range(len(values))]


def draw() -> Figure:
    runs = {seed: read(seed) for seed in RUNS}
    fig = Figure(figsize=(12, 10.5), layout="constrained")
    axes = fig.subplots(3, 2, sharex=True).ravel()
    for ax, (column, title, ylabel, ylim) in zip(axes, PANELS, strict=True):
        for seed, (label, colour) in RUNS.items():
            x = [s / 1e6 for s in runs[seed]["env_steps"]]
            y = runs[seed][column]
            ax.plot(x, y, color=colour, linewidth=0.6, alpha=0.35)
            ax.plot(x, running_mean(y, SMOOTH), color=colour, linewidth=2.0, label=label)
        if column == "entropy":
            ax.axhline(0.6931, color="grey", linewidth=0.8, linestyle=":")
        if column == "running_reward":
            ax.axhline(0, color="grey", linewidth=0.8, linestyle=":")
            ax.axvline(0.6, color="grey", linewidth=0.8, linestyle="--")
            ax.annotate("the runs part\nfrom about 0.6M", (0.62, -6), fontsize=9, color="dimgrey")
        ax.set_title(title, fontsize=11)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.set_xlim(0, MAX_STEPS / 1e6)
        if ylim:
            ax.set_ylim(*ylim)
        ax.grid(alpha=0.3)
    for ax in axes[-2:]:
        ax.set_xlabel("env steps (millions)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.suptitle("The default (batch 10, lr 2e-3) on two fast and two slow seeds", fontsize=13)
    labels = [*labels, f"thin: each batch; thick: running mean over {SMOOTH} batches"]
    handles = [*handles, Line2D([], [], color="none")]
    fig.legend(handles, labels, loc="outside lower center", ncol=5, frameon=False, fontsize=10)
    return fig


MARKS = (0.25e6, 0.5e6, 1e6, 2.5e6)
TABLE = [  # column, heading, digits
    ("running_reward", "running reward", 1),
    ("entropy", "entropy", 3),
    ("p_up", "P(UP)", 2),
    ("dead_units", "dead units", 0),
    ("w1_norm", "W1 norm", 1),
    ("update_norm", "update norm", 2),
    ("repeat_share", "repeat share", 2),
    ("quick_loss_share", "quick losses", 2),
]


def table() -> str:
    """The markdown table: per mark and seed, the mean of each column over the batches
    within 50k env steps of the mark."""
    runs = {seed: read(seed) for seed in RUNS}
    lines = [
        "| env steps | seed | " + " | ".join(heading for _, heading, _ in TABLE) + " |",
        "| ---: | --- |" + " ---: |" * len(TABLE),
    ]
    for mark in MARKS:
        for i, (seed, (label, _)) in enumerate(RUNS.items()):
            near = [k for k, steps in enumerate(runs[seed]["env_steps"]) if abs(steps - mark) <= 50e3]
            means = [sum(runs[seed][column][k] for k in near) / len(near) for column, _, _ in TABLE]
            cells = [f"{m:.{digits}f}" for m, (_, _, digits) in zip(means, TABLE, strict=True)]
            lines.append(f"| {f'{mark / 1e6:g}M' if i == 0 else ''} | {label[5:]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    if "--table" in sys.argv[1:]:
        print(table())
        return
    out = HERE / "diagnostics.png"
    tmp = out.with_name(out.name + ".tmp.png")
    draw().savefig(tmp, dpi=90)
    os.replace(tmp, out)
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KB)")


if __name__ == "__main__":
    main()
