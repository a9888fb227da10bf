"""Rollout workers that misbehave on purpose, for the fault tests.

The file is a worker hook: the tests point PGPONG_WORKER_HOOK at it, and every rollout
worker (Ray actors and the --workers 0 one alike) calls worker_hook() as it starts and
before each episode. What it does is read from PGPONG_WORKER_HOOK_ARG:

- 'start': the worker's constructor raises;
- 'crash:N': the process kills itself in every episode of batch N and later;
- 'slow:K': episode K of every batch takes 2 s longer;
- 'slowmark:K:FILE': the same, and the first worker to play it writes its Ray node's id
  to FILE;
- 'hang': episodes never end;
- 'stop:N:FILE', 'die:N:FILE': the first worker to play an episode of batch N writes
  its pid to FILE and stops itself with SIGSTOP (a frozen process) or kills itself
  with SIGKILL;
- 'mark:N:FILE': it only writes its pid (the test's signal that batch N is being played).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

HOOK = "PGPONG_WORKER_HOOK"
ARG = "PGPONG_WORKER_HOOK_ARG"


def fault_env(spec: str) -> dict[str, str]:
    """The environment variables that make workers misbehave as `spec` says."""
    return {HOOK: str(Path(__file__).resolve()), ARG: spec}


def set_fault(monkeypatch, spec: str) -> None:
    """Make the workers started from now on in this process misbehave as `spec` says."""
    for name, value in fault_env(spec).items():
        monkeypatch.setenv(name, value)


def worker_hook(stage: str, episode) -> None:
    fault = os.environ.get(ARG, "")
    kind, _, arg = fault.partition(":")
    if kind == "start" and stage == "start":
        raise RuntimeError("test fault: this worker cannot start")
    if stage != "play" or episode is None:
        return
    if kind == "crash" and episode.batch >= int(arg or 0):
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "slow" and episode.episode == int(arg):
        time.sleep(2.0)
    if kind == "slowmark" and episode.episode == int(arg.partition(":")[0]):
        import ray

        try:
            fd = os.open(arg.partition(":")[2], os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            os.write(fd, ray.get_runtime_context().get_node_id().encode())
            os.close(fd)
        except FileExistsError:
            pass
        time.sleep(2.0)
    if kind == "hang":
        time.sleep(3600)
    if kind in ("stop", "die", "mark"):
        batch, _, marker = arg.partition(":")
        if episode.batch == int(batch):
            try:
                fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                return  # another worker froze already
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            if kind != "mark":
                os.kill(os.getpid(), signal.SIGSTOP if kind == "stop" else signal.SIGKILL)
