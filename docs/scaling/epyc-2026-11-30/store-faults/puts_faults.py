"""`python puts_faults.py`: ray.put of 5 MB and of 2.4 MB once every 0.2 s, 24 times, keeping the last two
5 MB objects (as an update keeps the weights); the milliseconds and this process's minor page faults of each."""
import time, statistics, numpy as np, ray, os, resource
ray.init(num_cpus=2, include_dashboard=False, object_store_memory=1024 * 2**20)
def flt(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
a = np.random.rand(200*6400).astype(np.float32)
b = np.random.rand(200*3000).astype(np.float32)
# like an update: keep the last 2 weights alive, put a 2.4MB and 5MB each 'update'
kept=[]
for rep in range(24):
    f0=flt(); s=time.perf_counter(); r=ray.put(a); d=time.perf_counter()-s; f1=flt()
    s=time.perf_counter(); r2=ray.put(b); d2=time.perf_counter()-s; f2=flt()
    kept.append(r); kept=kept[-2:]; del r2
    print(rep, f"5MB {d*1e3:.2f} ms {f1-f0} faults | 2.4MB {d2*1e3:.2f} ms {f2-f1} faults", flush=True)
    time.sleep(0.2)
