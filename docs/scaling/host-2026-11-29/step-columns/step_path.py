"""The reducer's step before the weights go out, alone (docs/SCALING.md, "The step on
the sum's pixels"): `python step_path.py` times, on a batch's total of 3,000 pixels,
the way before (the total made dense, then the whole step with its norms) and the way
now (apply() on the total's pixels; measure() after the weights are out), with and
without the default clipping; medians of 45 steps."""

import time

import numpy as np

from pgpong.policy import EpisodeGradient, Params

try:
    from pgpong.rmsprop import RMSProp
except ImportError:  # (the code before RMSProp had a module of its own)
    from pgpong.policy import RMSProp  # type: ignore[attr-defined,no-redef]

rng = np.random.default_rng(0)
weights = Params.initial(200, 0)
cache = Params.of(np.abs(rng.standard_normal((200, 6400))) * 1e-3, np.abs(rng.standard_normal(200)) * 1e-3)
pixels = np.sort(rng.choice(6400, 3000, replace=False)).astype(np.int16)
total = EpisodeGradient(
    pixels,
    np.asfortranarray(rng.standard_normal((200, 3000)).astype(np.float32) * 0.01),
    rng.standard_normal(200).astype(np.float32),
)


def median_ms(times: list[float]) -> float:
    return float(np.median(times[5:])) * 1e3


for limit in (4.0, None):
    optimizer = RMSProp(1e-3, 0.99, cache, limit)
    before, now, after = [], [], []
    for _ in range(50):
        began = time.perf_counter()
        optimizer.step(weights, total.dense(6400))
        before.append(time.perf_counter() - began)
        began = time.perf_counter()
        optimizer.apply(weights, total)
        out = time.perf_counter()
        optimizer.measure(weights)
        now.append(out - began)
        after.append(time.perf_counter() - out)
    print(
        f"--max-update-norm {limit or 0:g}: before the weights go out, dense then step {median_ms(before):.2f} ms;"
        f" apply on the pixels {median_ms(now):.2f} ms; measure after {median_ms(after):.2f} ms"
    )
