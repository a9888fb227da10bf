"""A leader's exact add of a match's float32 gradient (pool/sums.py ExactSum.add), timed
alone: 60 gradients of 700 random pixels each added into a fresh sum (as a leader makes
one a batch), into one made and zeroed, and into one kept and zeroed in place; the
median microseconds a match over 15 rounds. `PYTHONPATH=REPO/src python add.py`, run
in turns on the code before (fdeb304) and after (the range check fused into the add)."""
import time

import numpy as np

from pgpong.pool.sums import ExactSum
from pgpong.policy import EpisodeGradient
rng = np.random.default_rng(0)
H, D = 200, 6400
grads = []
for _ in range(60):
    cols = np.sort(rng.choice(D, 700, replace=False)).astype(np.int16)
    grads.append(EpisodeGradient(cols, np.asfortranarray((rng.standard_normal((H, 700)) * 0.01).astype(np.float32)), rng.standard_normal(H).astype(np.float32)))
ExactSum(H).add(grads[0])
def run(make):
    ts = []
    for rep in range(15):
        s = make()
        t = time.perf_counter()
        for g in grads: s.add(g)
        ts.append((time.perf_counter() - t) / len(grads))
    return round(1e6 * sorted(ts)[7], 1)
def reused():
    s = ExactSum(H); s.W1.fill(0); return s
keep = ExactSum(H)
def zeroed():
    keep.W1.fill(0); keep.W2.fill(0); keep.touched.fill(False); keep.matches = 0; return keep
for _ in range(1):
    print("fresh", run(lambda: ExactSum(H)), "fresh+fill", run(reused), "kept, zeroed", run(zeroed))
t = time.perf_counter(); 
for _ in range(20): keep.W1.fill(0)
print("fill 10 MB ms", round((time.perf_counter() - t) / 20 * 1e3, 2))
