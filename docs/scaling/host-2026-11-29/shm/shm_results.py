"""A match's result through shared memory instead of the task's reply, and a match
handed out on a pipe instead of a Ray call, timed alone (docs/SCALING.md, "A node's
matches off Ray's calls"): `python shm_results.py`
with pgpong importable (PYTHONPATH=src). One process calls an actor 800 times a round,
as a node's leader calls its workers, waits for each answer and adds a real match of a
bank to an exact sum, in five ways: the match returned in the reply (pgpong today);
the W1 columns written to a shared-memory block the caller maps once, the pixel list
and W2 in the reply; everything in the block and only the pixel count in the reply;
a call with a one-number answer and no sum (Ray's own cost of a call); and no Ray call
at all: the caller writes the match's number to a named pipe the actor's thread reads,
and the actor answers the pixel count on another (everything else in the block). Then
the exact add alone. It prints the caller's and the actor's CPU per match, three
rounds."""

import dataclasses
import os
import struct
import tempfile
import threading
import time
from multiprocessing import shared_memory

import numpy as np
import ray

from pgpong.bench.simulate import play_bank
from pgpong.cluster import LOCAL_SYSTEM_CONFIG
from pgpong.policy import EpisodeGradient, Params
from pgpong.pool.base import WorkerSettings
from pgpong.pool.sums import ExactSum
from pgpong.pool.worker import publish

H, D, N = 200, 6400, 800
W2_AT, W1_AT = D, D + H  # where W2 and W1's columns start in the block, in 4-byte words
WORDS = D * (H + 1) + H

ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", _system_config=LOCAL_SYSTEM_CONFIG)
played = play_bank(WorkerSettings(), Params.initial(H, 0), 2, 0, 2).matches[0]
grad = played.grad
print(f"a match of {grad.columns.size} pixels, {grad.W1_columns.nbytes / 1e6:.2f} MB of gradient")


def views(block):
    return np.ndarray((WORDS,), np.float32, buffer=block.buf), np.ndarray((WORDS,), np.int32, buffer=block.buf)


@ray.remote(num_cpus=1)
class Worker:
    def __init__(self, match, name):
        self.match, self.block = match, shared_memory.SharedMemory(name=name)
        self.floats, self.ints = views(self.block)

    def in_reply(self, published, episode):
        return self.match

    def columns_in_block(self, published, episode):
        g = self.match.grad
        self.floats[W1_AT : W1_AT + g.W1_columns.size] = g.W1_columns.ravel()
        return g.columns, g.W2, g.W1_columns.shape

    def all_in_block(self, published, episode):
        g = self.match.grad
        n = g.columns.size
        self.ints[:n] = g.columns
        self.floats[W2_AT:W1_AT] = g.W2
        self.floats[W1_AT : W1_AT + H * n] = g.W1_columns.ravel()
        return n

    def small(self, published, episode):
        return 1

    def serve(self, asks, answers):
        """Answer on the pipe `answers` each match number read from the pipe `asks`, in a
        thread of this actor, until the number -1."""

        def loop():
            with open(asks, "rb", buffering=0) as given, open(answers, "wb", buffering=0) as said:
                while (k := struct.unpack("q", given.read(8))[0]) >= 0:
                    said.write(struct.pack("q", self.all_in_block(None, k)))

        threading.Thread(target=loop, daemon=True).start()

    def cpu(self):
        return time.process_time()


block = shared_memory.SharedMemory(create=True, size=4 * WORDS)
floats, ints = views(block)
worker, published = Worker.remote(played, block.name), publish(Params.initial(H, 0))[0]


def call(method):
    ref = method.remote(published, [0, 1, 2])
    ray.wait([ref], num_returns=1)
    return ray.get(ref)


def in_reply():
    total = ExactSum(H)
    for _ in range(N):
        total.add(call(worker.in_reply).grad)


def columns_in_block():
    total = ExactSum(H)
    for _ in range(N):
        columns, W2, shape = call(worker.columns_in_block)
        W1 = floats[W1_AT : W1_AT + shape[0] * shape[1]].reshape(shape)
        total.add(dataclasses.replace(grad, columns=columns, W1_columns=W1, W2=W2))


def all_in_block():
    total = ExactSum(H)
    for _ in range(N):
        n = call(worker.all_in_block)
        total.add(EpisodeGradient(ints[:n].copy(), floats[W1_AT : W1_AT + H * n].reshape(H, n), floats[W2_AT:W1_AT]))


def small():
    for _ in range(N):
        call(worker.small)


pipes = tempfile.mkdtemp()
asks, answers = os.path.join(pipes, "asks"), os.path.join(pipes, "answers")
os.mkfifo(asks)
os.mkfifo(answers)
ray.get(worker.serve.remote(asks, answers))
to_worker, from_worker = open(asks, "wb", buffering=0), open(answers, "rb", buffering=0)  # noqa: SIM115 (for the script's life)


def pipe_no_call():
    total = ExactSum(H)
    for k in range(N):
        to_worker.write(struct.pack("q", k))
        n = struct.unpack("q", from_worker.read(8))[0]
        total.add(EpisodeGradient(ints[:n].copy(), floats[W1_AT : W1_AT + H * n].reshape(H, n), floats[W2_AT:W1_AT]))


def add_alone():
    total = ExactSum(H)
    for _ in range(N):
        total.add(grad)


ways = {
    "the match in the reply": in_reply,
    "W1's columns in the block": columns_in_block,
    "all in the block": all_in_block,
    "a call, one-number answer": small,
    "no call: a pipe each way": pipe_no_call,
    "the exact add alone": add_alone,
}
for way in ways.values():  # warm-up
    way()
for _ in range(3):
    for name, way in ways.items():
        before = ray.get(worker.cpu.remote())
        cpu = time.process_time()
        way()
        cpu = time.process_time() - cpu
        actor = ray.get(worker.cpu.remote()) - before
        print(f"{name:26s} the caller's CPU {1e3 * cpu / N:.2f} ms, the actor's {1e3 * actor / N:.2f} ms per match")
to_worker.write(struct.pack("q", -1))
block.close()
block.unlink()
