"""`python ahead_stat.py TRACE_DIR...`: per update of a trace (apply.py in docs/scaling/host-2026-11-27/reducer-step/trace/),
whether a node's sum went to the reducer ahead of its last match, and the ms from the batch's last match's end to the
next batch's weights in the queue (updates after the first two)."""
import glob, collections, statistics, sys
for d in sys.argv[1:]:
    ev = []
    for f in glob.glob(d + '/*.txt'):
        for line in open(f):
            p = line.split(); ev.append((float(p[0]), p[1], tuple(int(x) for x in p[2:])))
    ends = collections.defaultdict(list); radd = collections.defaultdict(list); rtot = {}; pub = {}
    for t, n, ids in ev:
        if n == 'end': ends[ids[0] + 1].append(t)
        if n == 'red_add': radd[ids[0]].append((t, ids[2]))
        if n == 'red_total': rtot[ids[0]] = t
        if n == 'q_pub': pub[ids[0]] = t
    w, wo = [], []
    for b in sorted(ends)[2:]:
        if b not in rtot or b + 1 not in pub: continue
        T = max(ends[b]); x = 1e3 * (pub[b + 1] - T)
        (w if any(a for _, a in radd[b]) else wo).append(x)
    print(d, "with a sum ahead:", len(w), [round(x) for x in w], "| without:", len(wo), "median", round(statistics.median(wo), 1) if wo else None)
