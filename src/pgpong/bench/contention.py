"""How long the processes of a run on this machine waited for a CPU: bench's measure of
this machine's contention, beside pgpong's own work.

Linux keeps, for every thread, the time it spent running and the time it spent ready
to run but waiting for a CPU (/proc/PID/task/TID/schedstat). Read before and after an
update, thread by thread, for this process (the driver) and the Ray processes it
started (a local instance's, or bench --simulate's cluster's), grouped by their part
(Ray titles an actor's process ray::CLASS), they say how much CPU each part used and
how long its threads waited for one: all of them, and those that run the part's code
(the threads Ray titles ray::..., and the driver's Python threads; not the ones Ray
starts for its I/O, which name themselves). The waits are summed over a part's
processes and threads, several of which may wait at once, so they are not a delay of
the update: they show where a busy machine stood in the way. On a machine with a core
for each worker, or a cluster, the waits of the driver, queue, reducer and leaders
would mostly not be there.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

# Ray's process titles (ray::CLASS or ray::CLASS.method while it runs one) by part.
PARTS = {
    "WorkQueue": "queue",
    "Reducer": "reducer",
    "NodeLeader": "leaders",
    "SimulatedWorkers": "workers",
    "RolloutWorker": "rollout workers",
    "BenchWorker": "rollout workers",  # (bench's own rollout worker)
}
ORDER = ("driver", "queue", "reducer", "leaders", "workers", "rollout workers", "ray")  # as reported


@dataclass(frozen=True)
class Process:
    pid: int
    part: str  # driver, queue, reducer, leaders, workers, rollout workers or ray


def processes() -> list[Process]:
    """This process (the driver) and the Ray processes it started on this machine (its
    descendants: a local Ray instance's or simulated cluster's, not another run's), by
    part; only the driver where /proc cannot be read."""
    found = [Process(os.getpid(), "driver")]
    for pid in _descendants(os.getpid()):
        part = _part(_command(pid))
        if part is not None:
            found.append(Process(pid, part))
    return found


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                text = stat.read()
        except OSError:  # it ended
            continue
        parent = int(text[text.rindex(")") + 2 :].split()[1])
        children.setdefault(parent, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:  # it ended, or is not ours to read
        return ""


def _part(command: str) -> str | None:
    """A process's part, by its command line: an actor's by its title, Ray's other
    processes (its daemons, its idle workers) "ray"; None for one not Ray's."""
    if command.startswith("ray::"):
        title = command[len("ray::") :].split(" ")[0].split(".")[0]
        return PARTS.get(title, "ray")
    words = command.split(" ")
    if "/ray/" in command or os.path.basename(words[0]) in ("raylet", "gcs_server"):
        return "ray"
    return None


# (pid, tid) -> (part, ns running, ns waiting for a CPU, whether the thread runs the part's code)
Reading = dict[tuple[int, int], tuple[str, int, int, bool]]


def read(running: list[Process]) -> Reading:
    """Every thread's times so far, of the processes `running` (those that ended
    meanwhile have none). (About 15 us a thread: bench reads once between two
    updates, and leaves the reading out of the driver's CPU.)"""
    reading: Reading = {}
    for process in running:
        try:
            tasks = os.listdir(f"/proc/{process.pid}/task")
            name = _read(f"/proc/{process.pid}/comm")
        except OSError:
            continue
        for task in tasks:
            try:
                ran, waited, _ = _read(f"/proc/{process.pid}/task/{task}/schedstat").split()
                thread = _read(f"/proc/{process.pid}/task/{task}/comm")
            except (OSError, ValueError):  # the thread ended, or the kernel keeps no schedstat
                continue
            # Ray titles the threads that run an actor's code ray::... (one that has
            # not run any yet, ray::IDLE), and its own threads name themselves
            # (worker.io, ...); the driver's Python threads keep its name.
            code = thread.startswith("ray::") or thread == name
            reading[(process.pid, int(task))] = (process.part, int(ran), int(waited), code)
    return reading


def _read(path: str) -> str:
    with open(path) as file:
        return file.read().strip()


def waited_ms(before: Reading, after: Reading) -> dict[str, dict]:
    """Per part, between two readings: its processes, and the milliseconds of CPU, of
    waiting for one, and of its code threads' waiting. A thread counts from its first
    reading (a new one from its start; one that ended in between is left out), as
    the part its process was given then."""
    parts: dict[str, dict] = {}
    for key, (part, ran, waited, code) in after.items():
        part, ran0, waited0, code = before.get(key, (part, 0, 0, code))
        figures = parts.setdefault(part, {"processes": set(), "cpu_ms": 0.0, "wait_ms": 0.0, "code_wait_ms": 0.0})
        figures["processes"].add(key[0])
        figures["cpu_ms"] += (ran - ran0) / 1e6
        figures["wait_ms"] += (waited - waited0) / 1e6
        figures["code_wait_ms"] += (waited - waited0) / 1e6 if code else 0.0
    return {part: {**parts[part], "processes": len(parts[part]["processes"])} for part in ORDER if part in parts}


def median_waits(readings: list[dict[str, dict]]) -> dict[str, dict] | None:
    """Per part, its processes and the median over updates of its code threads'
    milliseconds waiting for a CPU (None without readings)."""
    if not readings:
        return None
    parts = [part for part in readings[0] if all(part in reading for reading in readings)]
    return {
        part: {
            "processes": readings[-1][part]["processes"],
            "code_wait_ms": statistics.median(reading[part]["code_wait_ms"] for reading in readings),
        }
        for part in parts
    }
