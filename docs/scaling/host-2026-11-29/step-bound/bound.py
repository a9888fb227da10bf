"""RMSProp's clipped step (policy.py, the default --max-update-norm 4) against a step
that first bounds the update's norm and, when the bound is safely under the limit,
takes the unclipped step's single pass (the same bits: a clip of 1 changes none), the
exact norm left for measure(). Measured apart, not built (docs/SCALING.md). A batch's
total of 3,000 pixels, the medians of 50 rounds: the bound alone (float64 squares of the
update summed in any order: its error is far below the 1e-5 margin it would need), the
clipped step, the unclipped one. `PYTHONPATH=REPO/src python bound.py`."""

import time

import numba
import numpy as np

from pgpong.policy import EpisodeGradient, Params

try:
    from pgpong.rmsprop import RMSProp
except ImportError:  # (the code before RMSProp had a module of its own)
    from pgpong.policy import RMSProp  # type: ignore[attr-defined,no-redef]

H, D, PIXELS = 200, 6400, 3000
rng = np.random.default_rng(0)
weights = Params.initial(H, 0)
cache = Params(np.asfortranarray(np.full((H, D), 1e-4, np.float32)), np.full(H, 1e-4, np.float32))
columns = np.sort(rng.choice(D, PIXELS, replace=False)).astype(np.int16)
W1_columns = np.asfortranarray((rng.standard_normal((H, PIXELS)) * 1e-2).astype(np.float32))
grad = EpisodeGradient(columns, W1_columns, rng.standard_normal(H).astype(np.float32))
f32 = np.float32


@numba.njit(nogil=True, error_model="numpy", fastmath={"reassoc"})
def update_squares(c, columns, g, decay, keep, lr, eps):
    """The update's squared norm on the touched columns (the others' update is 0), summed in any order."""
    total = 0.0
    for k in range(columns.size):
        j = columns[k]
        for h in range(g.shape[0]):
            gi = g[h, k]
            ci = c[h, j] * decay + gi * gi * keep
            ui = gi / (np.sqrt(ci) + eps) * lr
            total += np.float64(ui) * np.float64(ui)
    return total


def median_ms(run, rounds=50):
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return 1e3 * sorted(times)[rounds // 2]


args = (cache.W1, columns, W1_columns, f32(0.99), f32(0.01), f32(2e-3), f32(1e-5))
update_squares(*args)
print(f"the bound alone: {median_ms(lambda: update_squares(*args)):.2f} ms (W1's update norm {update_squares(*args) ** 0.5:.4f})")
for clip in (4.0, None):
    times = []
    for _ in range(30):
        state = Params(weights.W1.copy(order="F"), weights.W2.copy())
        optimizer = RMSProp(2e-3, 0.99, Params(cache.W1.copy(order="F"), cache.W2.copy()), clip)
        began = time.perf_counter()
        optimizer.apply(state, grad)
        times.append(time.perf_counter() - began)
        optimizer.measure(state)
    print(f"apply(), --max-update-norm {clip}: {1e3 * sorted(times)[15]:.2f} ms (update norm {optimizer.last_update_norm:.4f})")
