"""Marks for the trace of an update's end (docs/SCALING.md, "The step taken in the
reducer"): `python apply.py COPY` edits a copy of the repository (COPY/src/pgpong, at
5d63929, d87b33d or later; never the repository itself) to mark, in every process, a
simulated match's start and end, a leader's receipt of each result, report and
hand-over, the reducer's adds and total, the step, the queue's publish and the
driver's receipt of the total. Run bench with PYTHONPATH=COPY/src, then
`python segments.py /tmp/trace`."""

import shutil
import sys
from pathlib import Path

root = sys.argv[1] + "/src/pgpong/"
shutil.copy(Path(__file__).with_name("mark.py"), root + "_trace.py")

def edit(p, old, new):
    p = root + p; s = open(p).read(); assert old in s, (p, old); open(p, 'w').write(s.replace(old, new, 1))
try:  # (code before 82791f7: a match's clock starts when its slot's thread runs)
    edit('bench/simulate.py', "            time.sleep(max(0.0, duration - (time.perf_counter() - began)))\n",
     "            from pgpong._trace import mark; mark('start', episode.batch, episode.episode)\n            time.sleep(max(0.0, duration - (time.perf_counter() - began)))\n            mark('end', episode.batch, episode.episode)\n")
except AssertionError:  # (since: at `began`, which may be before its thread runs)
    edit('bench/simulate.py', "            self._sleep(max(0.0, duration - (time.perf_counter() - began)))\n",
     "            from pgpong._trace import mark; mark('start', episode.batch, episode.episode, at=time.time() - (time.perf_counter() - began))\n            self._sleep(max(0.0, duration - (time.perf_counter() - began)))\n            mark('end', episode.batch, episode.episode)\n")
edit('pool/ray_pool.py', "                result = self._result(ref, worker, hand)\n",
 "                result = self._result(ref, worker, hand)\n                from pgpong._trace import mark; isinstance(key, tuple) and mark('lead_got', key[0], key[1], *(list(episode)[1:3]))\n")
try:  # (code before the report went to the reducer with the sum)
    edit('pool/leader.py', "                finished, last = self._report(queue, node, finished), time.monotonic()  # before the sum completes it\n",
     "                from pgpong._trace import mark; mark('lead_report', batch)\n                finished, last = self._report(queue, node, finished), time.monotonic()  # before the sum completes it\n                mark('lead_reported', batch)\n")
except AssertionError:  # (since: the leader does not wait for it)
    edit('pool/leader.py', "                reported, finished, last = self._report(queue, node, finished), [], time.monotonic()\n                part",
     "                from pgpong._trace import mark; mark('lead_report', batch)\n                reported, finished, last = self._report(queue, node, finished), [], time.monotonic()\n                mark('lead_reported', batch)\n                part")
edit('pool/leader.py', "                    ray.get([*([ahead.pop(batch)] if batch in ahead else []), added])\n",
 "                    ray.get([*([ahead.pop(batch)] if batch in ahead else []), added])\n                    mark('lead_handed', batch)\n")
edit('pool/reducer.py', "        summing = self.batches.get(batch)\n        if summing is None or node in summing.closed:\n",
 "        from pgpong._trace import mark; mark('red_add', batch, node, int(share is None))\n        summing = self.batches.get(batch)\n        if summing is None or node in summing.closed:\n")
edit('pool/reducer.py', "        summings = [self.batches.pop(batch) for batch in parts]\n",
 "        from pgpong._trace import mark; mark('red_complete', *parts)\n        summings = [self.batches.pop(batch) for batch in parts]\n")
edit('pool/reducer.py', "        return Total(grad, idle, workers, dict(seconds))\n",
 "        mark('red_total', *parts)\n        return Total(grad, idle, workers, dict(seconds))\n")
try:
    edit('pool/queue.py', "        total = ray.get(reducer.result.remote(parts))\n",
     "        total = ray.get(reducer.result.remote(parts))\n        from pgpong._trace import mark; mark('q_total', *parts)\n")
except AssertionError as e: print('skip', e)
edit('pool/queue.py', "        queued.job = (queued.job[0], published, queued.job[2])\n",
 "        queued.job = (queued.job[0], published, queued.job[2])\n        from pgpong._trace import mark; mark('q_pub', batch)\n")
try:
    edit('pool/ahead.py', "                made = self.step(total.grad, order)\n",
     "                made = self.step(total.grad, order)\n                from pgpong._trace import mark; mark('q_stepped', batch)\n")
except AssertionError:
    edit('pool/reducer.py', "                made = self.mirror.step(total.grad, order, start)\n",
     "                made = self.mirror.step(total.grad, order, start)\n                from pgpong._trace import mark; mark('q_stepped', batch); mark('q_total', *parts)\n")
edit('pool/cluster_pool.py', "        total = self._ahead.received(self._ray.get(result, timeout=self._limits.stall_s))\n",
 "        total = self._ahead.received(self._ray.get(result, timeout=self._limits.stall_s))\n        from pgpong._trace import mark; mark('drv_total')\n")
