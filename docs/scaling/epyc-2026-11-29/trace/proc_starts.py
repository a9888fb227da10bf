"""`python proc_starts.py TRACE_DIR...`: per update of a trace, for each simulating process, its first and last
match start after the next batch's weights were published in the queue (ms)."""
import glob, collections, statistics, sys
for d in sys.argv[1:]:
    ev = []
    for f in glob.glob(d + '/*.txt'):
        pid = f.split('/')[-1][:-4]
        for line in open(f):
            p = line.split(); ev.append((float(p[0]), p[1], tuple(int(x) for x in p[2:]), pid))
    pub = {}; starts = collections.defaultdict(lambda: collections.defaultdict(list))
    for t, n, ids, pid in ev:
        if n == 'q_pub': pub[ids[0]] = t
        if n == 'start': starts[ids[0] + 1][pid].append(t)
    rows = []
    for b in sorted(pub)[2:]:
        if b not in starts: continue
        rows.append(" ".join(f"{1e3*(min(v)-pub[b]):5.1f}/{1e3*(max(v)-pub[b]):5.1f}" for pid, v in sorted(starts[b].items())))
    print(d); print("  per process: first/last start after the publish (ms):"); [print("   ", r) for r in rows]
