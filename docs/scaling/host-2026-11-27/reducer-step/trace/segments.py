"""Per-update times from a trace (apply.py): `python segments.py TRACE_DIR` prints,
for the updates after the first two, the medians of each stretch from the batch's last
match ending to the next batch's last match starting."""

import collections
import glob
import statistics
import sys

ev = collections.defaultdict(list)
for f in glob.glob(sys.argv[1] + '/*.txt'):
    for line in open(f):
        p = line.split()
        ev[p[1]].append((float(p[0]), tuple(int(x) for x in p[2:])))
starts = collections.defaultdict(list); ends = {}
for t, (b, e) in ev['start']: starts[b + 1].append(t)
for t, (b, e) in ev['end']: ends[(b + 1, e)] = t
got = {}
for t, ids in ev['lead_got']: got[(ids[0], ids[3])] = t
def by(name, idx=0):
    d = collections.defaultdict(list)
    for t, ids in ev[name]:
        if ids: d[ids[idx]].append(t)
    return d
rep, repd, hand = by('lead_report'), by('lead_reported'), by('lead_handed')
radd, rtot, qtot, qst, qpub = by('red_add'), by('red_total'), by('q_total'), by('q_stepped'), by('q_pub')
drv = sorted(t for t, _ in ev['drv_total'])
rows = collections.defaultdict(list)
batches = sorted(b for b in starts if b + 1 in starts and b in qtot)
for b in batches[2:]:
    bend = {e: t for (bb, e), t in ends.items() if bb == b}
    if not bend: continue
    last_e = max(bend, key=bend.get); T0 = bend[last_e]
    r = rows
    r['last match ends -> its leader has it'].append(got.get((b, last_e), float('nan')) - T0)
    r['-> all results with leaders'].append(max(t for (bb, e), t in got.items() if bb == b) - T0)
    r['-> leader starts report (last)'].append(max(rep[b]) - T0)
    r['-> leader reported (last)'].append(max(repd[b]) - T0)
    r['-> reducer gets last add'].append(max(radd[b]) - T0)
    r['-> reducer total'].append(max(rtot[b]) - T0)
    r['-> queue has total'].append(max(qtot[b]) - T0)
    r['-> queue stepped'].append(max(qst[b + 1]) - T0)
    r['-> queue published'].append(max(qpub[b + 1]) - T0)
    r['-> first match of next starts'].append(min(starts[b + 1]) - T0)
    r['-> last match of next starts'].append(max(starts[b + 1]) - T0)
    r['-> leader hand-over acknowledged'].append(max(hand[b]) - T0)
    d = [t for t in drv if t > T0]
    r['-> driver has total'].append((d[0] - T0) if d else float('nan'))
    r['(this batch: first start -> last start)'].append(max(starts[b]) - min(starts[b]))
keys = list(rows)
def seg(a, b):
    return statistics.median(y - x for x, y in zip(rows[a], rows[b]))
pairs = [
 ("last match ends", None, '-> all results with leaders'),
 ("results -> reducer total", '-> all results with leaders', '-> reducer total'),
 ("reducer total -> queue has total", '-> reducer total', '-> queue has total'),
 ("queue has total -> stepped", '-> queue has total', '-> queue stepped'),
 ("reducer total -> stepped", '-> reducer total', '-> queue stepped'),
 ("stepped -> published", '-> queue stepped', '-> queue published'),
 ("reducer total -> published", '-> reducer total', '-> queue published'),
 ("published -> first start", '-> queue published', '-> first match of next starts'),
 ("published -> last start", '-> queue published', '-> last match of next starts'),
 ("last end -> next's last start", None, '-> last match of next starts'),
]
out = []
for name, a, b in pairs:
    v = statistics.median(rows[b]) if a is None else seg(a, b)
    out.append(f"{name}: {1e3*v:.1f}")
out.append(f"wave spread: {1e3*statistics.median(rows['(this batch: first start -> last start)']):.1f}")
print(" | ".join(out))
