"""The default since 2026-11-25 (--entropy-bonus 0.01 with --max-update-norm 4) against
2016's maths and the bonus alone on seeds 0-11 (docs/study/clipbonus, default12 and
ent001): each seed's running reward by env steps, and each setting's median.

    .venv/bin/python docs/study/clipbonus/plot_compare.py   # writes docs/study/clipbonus/compare.png
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from pgpong.runlog import read_progress  # noqa: E402

HERE = Path(__file__).resolve().parent
STUDIES = [
    (HERE.parent / "default12", "2016's maths (the default before; batch 10, lr 2e-3): 6 of 12 reached 0", "tab:red"),
    (HERE.parent / "ent001", "--entropy-bonus 0.01 alone: 10 of 12 reached 0", "tab:blue"),
    (HERE, "the default since: the bonus with --max-update-norm 4: 12 of 12 reached 0", "tab:green"),
]
GRID = np.linspace(0, 7e6, 141)  # env steps where the medians are taken


def curves(study: Path) -> list[tuple[np.ndarray, np.ndarray]]:
    runs = []
    for trial in sorted((study / "trials").iterdir()):
        rows = read_progress(trial / "progress.csv")
        runs.append((np.array([float(r["env_steps"]) for r in rows]), np.array([float(r["running_reward"]) for r in rows])))
    return runs


def main() -> None:
    fig, ax = plt.subplots(figsize=(9, 5.8), dpi=110)
    for study, label, color in STUDIES:
        runs = curves(study)
        for steps, reward in runs:
            ax.plot(steps / 1e6, reward, color=color, alpha=0.25, linewidth=0.8)
        # a run that stopped at 0 stays there for the median: it is done, not lost
        held = [np.interp(GRID, steps, reward, right=max(reward[-1], 0.0) if reward[-1] >= 0 else np.nan) for steps, reward in runs]
        median = np.nanmedian(np.array(held), axis=0)
        ax.plot(GRID / 1e6, median, color=color, linewidth=2.4, label=label + " (thick: median of the 12 seeds)")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.axhline(-8, color="gray", linewidth=0.8, linestyle=":")
    ax.axvline(2, color="gray", linewidth=0.8, linestyle=":")
    ax.text(2.05, -7.6, "the early sign: below -8 at 2M env steps", color="dimgray", fontsize=8)
    ax.set_xlim(0, 7.1)
    ax.set_ylim(-21, 3)
    ax.set_xlabel("env steps (millions)")
    ax.set_ylabel("running reward")
    ax.set_title("Seeds 0-11 to running reward 0 (7M cap), exact sums, one line per seed")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=1, fontsize=8.5, frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(HERE / "compare.png")


if __name__ == "__main__":
    main()
