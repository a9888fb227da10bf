"""Three ways for the driver to hand 5 MB of weights to a threaded actor that must
publish them (docs/SCALING.md, "The weights to the queue by reference"): as the
call's argument (Ray serializes them into the call; the actor puts a copy in the
store), put by the driver and sent by reference (the actor puts a copy of its own),
and by reference alone (the driver owns the object). Prints each call's median wall
time and the driver's CPU.

    python docs/scaling/host-2026-11-27/by-reference/publish_ways.py
"""

import statistics
import time

import numpy as np
import ray

ray.init(
    num_cpus=2,
    include_dashboard=False,
    _system_config={"max_direct_call_object_size": 8 * 2**20, "task_events_report_interval_ms": 0},
)


@ray.remote(num_cpus=0, max_concurrency=8)
class Queue:
    def __init__(self) -> None:
        self.held = None

    def as_argument(self, weights: dict) -> None:
        self.held = ray.put(weights)

    def by_reference_copied(self, box: list) -> None:
        self.held = ray.put(ray.get(box[0]))

    def by_reference_kept(self, box: list) -> None:
        self.held = box[0]


queue = Queue.remote()
ray.get(queue.by_reference_kept.remote([None]))
weights = {"W1": np.random.rand(200, 6400).astype(np.float32), "W2": np.random.rand(200).astype(np.float32)}
ways = ("as_argument", "by_reference_copied", "by_reference_kept")
wall: dict[str, list[float]] = {way: [] for way in ways}
cpu: dict[str, list[float]] = {way: [] for way in ways}
for call in range(40):
    for way in ways:
        weights["W1"][0, 0] = call  # new weights each time
        began, began_cpu = time.perf_counter(), time.process_time()
        sent = weights if way == "as_argument" else [ray.put(weights)]
        ray.get(getattr(queue, way).remote(sent))
        wall[way].append(1e3 * (time.perf_counter() - began))
        cpu[way].append(1e3 * (time.process_time() - began_cpu))
for way in ways:
    print(f"{way:20s} {statistics.median(wall[way][5:]):6.2f} ms a call, the driver's CPU {statistics.median(cpu[way][5:]):5.2f} ms")
