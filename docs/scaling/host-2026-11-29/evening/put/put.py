"""What ray.put costs on this host, by size, against a plain copy of the same bytes
(docs/SCALING.md, "The fixed part at 1x64 traced once more"): a local Ray instance of
one CPU, nothing else running, the median of 30 puts of a float32 array each (the
object freed as the next is put), then of a batch's whole sum (WholeBatch, 60 matches
of 700 pixels drawn at random) and of the weights (Params) as pgpong puts them.
`PYTHONPATH=REPO/src python put.py`."""

import time

import numpy as np
import ray

from pgpong.policy import EpisodeGradient, Params
from pgpong.pool.reducer import WholeBatch
from pgpong.pool.sums import ExactSum


def median_ms(run, rounds=30):
    run()
    times = []
    for _ in range(rounds):
        began = time.perf_counter()
        run()
        times.append(time.perf_counter() - began)
    return 1e3 * sorted(times)[rounds // 2]


ray.init(num_cpus=1, include_dashboard=False)
for mb in (0.2, 1, 2.5, 5, 10):
    array = np.ones(int(mb * 2**20 / 4), np.float32)
    print(f"{mb:>4} MB: ray.put {median_ms(lambda: ray.put(array)):.2f} ms, a copy {median_ms(array.copy):.2f} ms")
rng = np.random.default_rng(0)
total = ExactSum(200)
for _ in range(60):
    columns = np.sort(rng.choice(6400, 700, replace=False)).astype(np.int16)
    W1 = np.asfortranarray((rng.standard_normal((200, 700)) * 0.01).astype(np.float32))
    total.add(EpisodeGradient(columns, W1, (rng.standard_normal(200) * 0.01).astype(np.float32)))
whole = WholeBatch(total.rounded(), 60)
print(f"a whole batch's sum rounded: {median_ms(total.rounded):.2f} ms ({whole.grad.nbytes / 2**20:.1f} MB)")
print(f"ray.put of it: {median_ms(lambda: ray.put(whole)):.2f} ms")
weights = Params.initial(200, 0)
print(f"ray.put of the weights (5 MB): {median_ms(lambda: ray.put(weights)):.2f} ms")
