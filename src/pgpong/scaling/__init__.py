"""The scaling model: seconds per update for any batch, workers and nodes (model.py),
and minutes to a running reward projected from a run's progress file (learning.py).
`python -m pgpong.scaling` prints their tables (__main__.py)."""

from pgpong.scaling.model import EARLY, LATE, PHASES, SCENARIOS, Constants, predict, predict_lag

__all__ = ["EARLY", "LATE", "PHASES", "SCENARIOS", "Constants", "predict", "predict_lag"]
