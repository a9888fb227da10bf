"""`python agg.py FAULTS`: from sampler.py's lines, each process with over 5,000 minor faults and its faults in
each 2 s (four samples), in the order the processes started."""
import sys
from collections import defaultdict
rows=[l.split() for l in open(sys.argv[1])]
by=defaultdict(list); names={}
for t,pid,cmd,flt,cpu in rows:
    by[pid].append((float(t),int(flt))); names.setdefault(pid,cmd)
t0=min(float(r[0]) for r in rows)
for pid,v in sorted(by.items(), key=lambda kv: kv[1][0][0]):
    if v[-1][1]-v[0][1] < 5000: continue
    s=[v[i+4][1]-v[i][1] for i in range(0,len(v)-4,4)]
    print(names[pid][:26].ljust(26), pid, f"{v[0][0]-t0:4.0f}s", s)
