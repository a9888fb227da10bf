"""Studies of the same seeds side by side: each trial's running reward by env steps (a
thin line) and each study's median (a thick one), with how many trials reached 0.

    .venv/bin/python docs/study/plot_compare.py docs/study/default12/compare.png default12 ent001
    .venv/bin/python docs/study/plot_compare.py docs/study/clipbonus/compare.png default12 ent001 clipbonus
"""

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from pgpong.runlog import read_progress  # noqa: E402

HERE = Path(__file__).resolve().parent
SETTINGS = {  # a study's directory here -> what its trials played
    "default12": "2016's maths (the default before 2026-11-25; batch 10, lr 2e-3)",
    "ent001": "--entropy-bonus 0.01 alone",
    "clipbonus": "the default since 2026-11-25: --entropy-bonus 0.01 with --max-update-norm 4",
}
COLORS = ["tab:red", "tab:blue", "tab:green", "tab:purple"]
GRID = np.linspace(0, 7e6, 141)  # env steps where the medians are taken


def curves(study: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    runs = []
    for trial in sorted((study / "trials").iterdir()):
        rows = read_progress(trial / "progress.csv")
        runs.append((np.array([float(r["env_steps"]) for r in rows]), np.array([float(r["running_reward"]) for r in rows])))
    return runs


def main(output: Path, studies: list[str]) -> None:
    fig, ax = plt.subplots(figsize=(9, 5.8), dpi=110)
    for name, color in zip(studies, COLORS, strict=False):
        runs = curves(HERE / name)
        for steps, reward in runs:
            ax.plot(steps / 1e6, reward, color=color, alpha=0.25, linewidth=0.8)
        # a run that stopped at 0 stays there for the median: it is done, not lost
        held = [np.interp(GRID, steps, reward, right=max(reward[-1], 0.0) if reward[-1] >= 0 else np.nan) for steps, reward in runs]
        median = np.nanmedian(np.array(held), axis=0)
        reached = sum(reward.max() >= 0 for _, reward in runs)
        label = f"{SETTINGS.get(name, name)}: {reached} of {len(runs)} reached 0 (thick: median of the {len(runs)} seeds)"
        ax.plot(GRID / 1e6, median, color=color, linewidth=2.4, label=label)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.axhline(-8, color="gray", linewidth=0.8, linestyle=":")
    ax.axvline(2, color="gray", linewidth=0.8, linestyle=":")
    ax.text(2.12, -7.6, "the early sign: below -8 at 2M env steps", color="dimgray", fontsize=8)
    ax.set_xlim(0, 7.1)
    ax.set_ylim(-21, 3)
    ax.set_xlabel("env steps (millions)")
    ax.set_ylabel("running reward")
    ax.set_title("Seeds 0-11 to running reward 0 (7M cap), exact sums, one line per seed")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1, fontsize=8.5, frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(output)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
