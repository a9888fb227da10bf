"""How long the processes of a run on this machine waited for a CPU: bench's measure of
this machine's contention, beside pgpong's own work.

Linux keeps, for every thread, the time it spent running and the time it spent ready
to run but waiting for a CPU (/proc/PID/task/TID/schedstat). Read before and after an
update for this process (the driver) and the Ray processes it started (a local
instance's, or bench --simulate's cluster's), grouped by their part (Ray titles an
actor's process ray::CLASS), they say how much CPU each part used and how long its
threads waited for one: all of them, and those that run the part's code (the
threads that keep their process's name: its main thread, a threaded actor's; not the
ones Ray starts for its I/O, which name themselves). The waits are summed over a
part's processes and threads, several of which may wait at once, so they are not a
delay of the update: they show where a busy machine stood in the way. On a machine
with a core for each worker, or a cluster, the waits of the driver, queue, reducer and
leaders would mostly not be there.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass

# Ray's process titles (ray::CLASS or ray::CLASS.method while it runs one) by part.
PARTS = {"WorkQueue": "queue", "Reducer": "reducer", "NodeLeader": "leaders", "SimulatedWorkers": "workers"}
RAY_PROCESSES = ("raylet", "gcs_server")  # Ray's own daemons, by their command lines
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
    if command.startswith("ray::"):
        title = command[len("ray::") :].split(" ")[0].split(".")[0]
        return PARTS.get(title, "rollout workers" if title.startswith("RolloutWorker") else "ray")
    words = command.split(" ")
    if words and any(os.path.basename(words[0]) == name for name in RAY_PROCESSES):
        return "ray"
    return None


@dataclass(frozen=True)
class Times:
    """A part's seconds so far: running, waiting for a CPU, and the latter for the
    threads that run its Python code (those that keep their process's name: the
    main thread, a threaded actor's, Python's; not Ray's own, which name themselves)."""

    cpu: float = 0.0
    wait: float = 0.0
    code_wait: float = 0.0

    def __add__(self, other: Times) -> Times:
        return Times(self.cpu + other.cpu, self.wait + other.wait, self.code_wait + other.code_wait)


def waits(running: list[Process]) -> dict[str, Times]:
    """Each part's times so far, summed over its processes' threads; a process that
    has ended counts for nothing."""
    totals: dict[str, Times] = {}
    for process in running:
        totals[process.part] = totals.get(process.part, Times()) + _thread_times(process.pid)
    return {part: totals[part] for part in ORDER if part in totals}


def _thread_times(pid: int) -> Times:
    cpu = wait = code_wait = 0  # nanoseconds
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
        name = _read(f"/proc/{pid}/comm")
    except OSError:
        return Times()
    for task in tasks:
        try:
            ran, waited, _ = _read(f"/proc/{pid}/task/{task}/schedstat").split()
            code = _read(f"/proc/{pid}/task/{task}/comm") == name
        except (OSError, ValueError):  # the thread ended, or the kernel keeps no schedstat
            continue
        cpu, wait = cpu + int(ran), wait + int(waited)
        code_wait += int(waited) if code else 0
    return Times(cpu / 1e9, wait / 1e9, code_wait / 1e9)


def _read(path: str) -> str:
    with open(path) as file:
        return file.read().strip()


def median_waits(readings: list[dict[str, dict]]) -> dict[str, float] | None:
    """Per part, the median over updates of its code threads' milliseconds waiting for
    a CPU (None without readings)."""
    if not readings:
        return None
    parts = [part for part in readings[0] if all(part in reading for reading in readings)]
    return {part: statistics.median(reading[part]["code_wait_ms"] for reading in readings) for part in parts}


def waited_ms(before: dict[str, Times], after: dict[str, Times]) -> dict[str, dict]:
    """Per part, the milliseconds of CPU, of waiting for one, and of its code threads'
    waiting, between two readings."""
    return {
        part: {
            "cpu_ms": 1e3 * (times.cpu - before.get(part, Times()).cpu),
            "wait_ms": 1e3 * (times.wait - before.get(part, Times()).wait),
            "code_wait_ms": 1e3 * (times.code_wait - before.get(part, Times()).code_wait),
        }
        for part, times in after.items()
    }
