"""The queue's share of a step taken ahead of the trainer (src/pgpong/pool/ahead.py),
alone in one process: a batch's total of 3,000 pixels made dense, the RMSProp step with
its norms, and the new weights put in the object store. Prints the medians of 40 steps
(wall time of the step, of the put, and the process's CPU time for both, Ray's threads
included).

    PYTHONPATH=src python docs/scaling/host-2026-11-27/step-ahead/step_micro.py
"""

import statistics
import time

import numpy as np
import ray

from pgpong.policy import EpisodeGradient, Params
from pgpong.pool.ahead import Mirror, StepOrder
from pgpong.pool.worker import StoredWeights, publish

HIDDEN, PIXELS, TOUCHED, STEPS = 200, 6400, 3000, 40


def main() -> None:
    ray.init(num_cpus=1, include_dashboard=False, logging_level="ERROR")
    rng = np.random.default_rng(0)
    weights, noise = Params.initial(HIDDEN, 1), Params.initial(HIDDEN, 2)
    cache = Params.of(noise.W1**2, noise.W2**2)
    columns = np.sort(rng.choice(PIXELS, TOUCHED, replace=False)).astype(np.int16)
    grad = rng.standard_normal((HIDDEN, TOUCHED)).astype(np.float32) * 1e-3
    total = EpisodeGradient(columns, grad, rng.standard_normal(HIDDEN).astype(np.float32))
    mirror = Mirror()
    seed = StepOrder(("alone", 0), PIXELS, 1e-3, 0.99, None, StoredWeights.of(weights), StoredWeights.of(cache))
    mirror.step(total, seed)  # (the copy arrives, and numba's kernels load)
    steps, puts, cpus = [], [], []
    for k in range(1, STEPS + 1):
        began, cpu = time.perf_counter(), time.process_time()
        made = mirror.step(total, StepOrder(("alone", k), PIXELS, 1e-3, 0.99, None, None, None))
        stepped = time.perf_counter()
        assert made is not None
        publish(made[0])
        steps.append(stepped - began)
        puts.append(time.perf_counter() - stepped)
        cpus.append(time.process_time() - cpu)
    ms = {name: 1e3 * statistics.median(values) for name, values in (("step", steps), ("put", puts), ("cpu", cpus))}
    print(f"step (dense, RMSProp, norms) {ms['step']:.1f} ms; put {ms['put']:.1f} ms; CPU of both {ms['cpu']:.1f} ms")
    ray.shutdown()


if __name__ == "__main__":
    main()
