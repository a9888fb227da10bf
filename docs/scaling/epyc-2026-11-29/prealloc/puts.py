"""`python puts.py`: ray.put of 5 MB, 2.4 MB, 0.1 MB and 1 KB of float32 on a new local Ray instance (512 MB
store), 20 each, medians in ms, twice: the first round writes into store memory not touched before, the
second into memory the first used; beside them a plain copy of 5 MB."""
import time, statistics, numpy as np, ray
ray.init(num_cpus=2, include_dashboard=False, object_store_memory=512 * 2**20)
a5 = np.random.rand(200, 6400).astype(np.float32); a2 = a5[:, :3000].copy()
def t(x, n=20):
    v = []
    for _ in range(n):
        s = time.perf_counter(); r = ray.put(x); v.append(time.perf_counter() - s); del r
    return 1e3 * statistics.median(v)
def tc(x, n=20):
    v = []
    for _ in range(n):
        s = time.perf_counter(); y = x.copy(); v.append(time.perf_counter() - s)
    return 1e3 * statistics.median(v)
import pickle
for rep in range(2):
    print(f"put 5MB {t(a5):.2f} | put 2.4MB {t(a2):.2f} | put 0.1MB {t(a5[:, :100].copy()):.2f} | put 1KB {t(np.zeros(256, np.float32)):.2f} | copy 5MB {tc(a5):.2f} | pickle5 5MB {1e3*statistics.median([(lambda s: (pickle.dumps(a5, protocol=5, buffer_callback=lambda b: None), time.perf_counter()-s)[1])(time.perf_counter()) for _ in range(10)]):.3f}")
