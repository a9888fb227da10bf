import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "token")

PGPONG = [sys.executable, "-m", "pgpong"]


@pytest.fixture(scope="session")
def ray_instance():
    """One local Ray instance shared by the tests that need it."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=200 * 1024**2, logging_level="WARNING")
    yield ray
    ray.shutdown()


def run_pgpong(*args: str, timeout: float = 300, env: dict | None = None, cwd: Path | None = None):
    """Run the real command line in a subprocess; returns CompletedProcess."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [*PGPONG, *args], capture_output=True, text=True, timeout=timeout, env=full_env, cwd=cwd
    )
