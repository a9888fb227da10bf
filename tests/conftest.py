import contextlib
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pgpong.pool.base import OneBatchAtATime

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "token")
if os.environ["RAY_AUTH_MODE"] == "token":
    # The tests' multi-node clusters (ray.cluster_utils) need a token on a machine
    # that has none yet: ray.init would make it, Cluster does not.
    from pgpong.cluster import ensure_local_token

    ensure_local_token()

PGPONG = [sys.executable, "-m", "pgpong"]
# Ray's health checks for tests that remove a node: a lost node shows dead in about
# 2.4 s instead of 15 s.
FAST_HEALTH_CHECKS = {
    "health_check_initial_delay_ms": 0,
    "health_check_period_ms": 200,
    "health_check_timeout_ms": 200,
    "health_check_failure_threshold": 5,
}


def joined_cluster(head_cpus: int, node_cpus: list[int], store: int):
    """A Ray cluster on this machine (ray.cluster_utils): a head of `head_cpus` CPUs and a
    node of each of `node_cpus`, each with an object store of `store` bytes, quick to see
    a node lost; this process joined to it. Returns the cluster and its added nodes."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    head = {"num_cpus": head_cpus, "include_dashboard": False, "object_store_memory": store}
    c = Cluster(initialize_head=True, head_node_args={**head, "_system_config": FAST_HEALTH_CHECKS})
    nodes = [c.add_node(num_cpus=cpus, object_store_memory=store) for cpus in node_cpus]
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level=logging.WARNING)
    return c, nodes


_shared_ray: dict[str, str] = {}  # "address": the GCS of the instance ray_instance started, while it runs
_modules_asking: set = set()  # the modules with a test to run that asks for ray_instance (collection's)


@pytest.fixture(scope="module")
def ray_instance():
    """A local Ray instance for the modules that ask for it, started once (about 3 s each
    time) and shared by those modules, which run in a row (pytest_collection_modifyitems);
    stopped at the first test of a module that does not ask for it (pytest_runtest_setup)."""
    import ray

    if not ray.is_initialized():
        # "local": an instance of our own, even when another runs on this machine (None would join it)
        ray.init(
            address="local",
            num_cpus=2,
            include_dashboard=False,
            object_store_memory=200 * 1024**2,
            logging_level=logging.WARNING,
        )
        _shared_ray["address"] = ray.get_runtime_context().gcs_address
    return ray


def stop_shared_ray() -> None:
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized() and ray.get_runtime_context().gcs_address == _shared_ray.get("address"):
        ray.shutdown()
    _shared_ray.clear()


@pytest.hookimpl(trylast=True)  # (after -m has deselected)
def pytest_collection_modifyitems(session, config, items):
    """The modules that ask for ray_instance run one after another, where the first of
    them would: one instance for all of them (a start and a stop of about 4 s each)."""
    asking = _modules_asking
    asking.update(item.module for item in items if "ray_instance" in item.fixturenames)
    first = next((k for k, item in enumerate(items) if item.module in asking), len(items))
    rest = items[first:]
    items[first:] = [i for i in rest if i.module in asking] + [i for i in rest if i.module not in asking]


def pytest_runtest_setup(item):
    """Idle, the shared instance would still take CPU from the timings and clusters of the
    modules after it, and a module may check that nothing started Ray: it stops before
    the first test of a module none of whose tests asks for it."""
    if _shared_ray and item.module not in _modules_asking:
        stop_shared_ray()


def pytest_sessionfinish(session, exitstatus):
    stop_shared_ray()


def run_here(capsys, *args: str) -> subprocess.CompletedProcess:
    """The command line in this process, without an interpreter's start-up (about a
    second each): a CompletedProcess as run_pgpong's, for input refused before any work
    (a hang would have no timeout here)."""
    from pgpong.cli import main

    capsys.readouterr()
    try:
        status = main(list(args))
    except SystemExit as stop:  # (argparse's own mistakes)
        status = stop.code if isinstance(stop.code, int) else 1
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["pgpong", *args], status, out, err)


def run_pgpong(*args: str, timeout: float = 300, env: dict | None = None, cwd: Path | None = None):
    """Run the real command line in a subprocess; returns CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([*PGPONG, *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd)


def refused_in_one_line(main, given: list[str], prog: str, capsys) -> str:
    """Call a command's main(argv) with bad input: it must exit with status 2, print
    nothing on stdout and one line on stderr that names the command and where its
    help is. That line."""
    with pytest.raises(SystemExit) as stopped:
        main(given)
    out, err = capsys.readouterr()
    assert stopped.value.code == 2 and out == "", (given, out, err)
    [line] = err.strip().splitlines()
    assert line.startswith(f"{prog}: error: ") and line.endswith(f"(see {prog} --help)"), (given, line)
    return line


def train_in_process(run_dir: Path, workers: int, iterations: int, settings: dict, pool=None):
    """Train with the library API (LocalPool for workers=0, else the pool `pgpong train` opens); returns the state."""
    from pgpong.pool import open_pool
    from pgpong.rundir import open_run
    from pgpong.session import open_trainer, worker_settings

    run = open_run(run_dir, {**settings, "iterations": iterations, "workers": workers})
    own = pool is None
    if own:
        pool = open_pool(worker_settings(run.config), workers, address=None, overlap=run.config.lagged)
    try:
        with open_trainer(run, pool, {}, tensorboard=False) as trainer:
            return trainer.train()
    finally:
        if own:
            pool.close()


def train_on(run, pool):
    """Train `run` on `pool` (a scripted one, say) until its --iterations; returns the state."""
    from pgpong.session import open_trainer

    with open_trainer(run, pool, {}, tensorboard=False) as trainer:
        return trainer.train()


class ScriptedPool(OneBatchAtATime):
    """Returns episodes with given scores and zero gradients: checks the trainer's
    bookkeeping. (Batches announced or submitted are played when collected.)"""

    replaced = 0

    @property
    def num_workers(self):
        return 0

    def nodes(self):
        return 1

    def __init__(self, scores):
        self.scores = iter(scores)
        self._waiting = {}

    def play_batch(self, weights, episodes, finished=lambda result: None):
        from pgpong.pool import BatchMeasures, BatchResult
        from pgpong.pool.sums import ExactSum, IntegerGradient

        total = ExactSum(weights.hidden)
        for result in self.results(weights, episodes):
            total.add(IntegerGradient.of(result.grad))
            finished(result.stats())
        return BatchResult(total.rounded(), BatchMeasures())

    def results(self, weights, episodes):
        """The episodes' results, in order (subclasses change them)."""
        import numpy as np

        from pgpong.policy import EpisodeGradient
        from pgpong.rollout import EpisodeResult

        for episode in episodes:
            empty = EpisodeGradient(np.zeros(0, np.int16), np.zeros((weights.hidden, 0), np.float32), weights.W2 * 0)
            yield EpisodeResult(episode, empty, next(self.scores), steps=100, seconds=0.1)

    def evaluate(self, weights, matches, greedy=False):
        raise NotImplementedError

    def close(self):
        pass


@contextlib.contextmanager
def hang_guard(seconds: int):
    """Fail, rather than hang, when the block is still running after `seconds`."""

    def hung(signum, frame):
        raise AssertionError(f"still running after {seconds} s: it hangs")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
