"""A cluster built as the README says, with the `ray` command (a head and a second node
on this machine, token authentication on): pgpong trains on both nodes; a missing or
wrong token is refused at once; a Ray job trains. Every Ray process started here is
stopped at the end, even when a test fails, and only those: each head gets a Ray
temporary directory and a port of its own, and the processes that name either (and
their children) are ended. `ray stop` would end every Ray instance on the machine,
a user's training run included; a test shows that one survives."""

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from pgpong.runlog import read_progress

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = [pytest.mark.slow, pytest.mark.long]


def readme_block(name: str) -> list[str]:
    """The commands of the README's block marked <!-- name --> ... <!-- /name -->."""
    text = (ROOT / "README.md").read_text()
    found = re.search(rf"<!-- {name} -->(.*?)<!-- /{name} -->", text, re.S)
    assert found, f"README has no block {name}"
    lines = [line.strip() for line in found.group(1).splitlines()]
    return [line.split("  #")[0].strip() for line in lines if line and not line.startswith(("```", "#"))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_processes(temp_dir: str, port: int) -> list[psutil.Process]:
    """The processes of the Ray cluster whose head was started with this temporary
    directory and port: those naming either on their command line, and their children."""
    found: set[psutil.Process] = set()
    marks = (temp_dir, f":{port} ", f"={port} ")  # --temp-dir=..., --address=IP:PORT, --gcs-port=PORT
    for proc in psutil.process_iter(["cmdline"]):
        try:
            line = " ".join(proc.info["cmdline"] or []) + " "
            if proc.pid != os.getpid() and any(mark in line for mark in marks):
                found.add(proc)
                found.update(proc.children(recursive=True))
        except psutil.Error:
            continue
    return list(found)


def stop_own_ray(temp_dir: str, port: int) -> None:
    """End that cluster's processes (SIGTERM, then SIGKILL after 5 s), and no others,
    and wait until they are gone."""
    procs = ray_processes(temp_dir, port)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=5)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=10)  # a killed process is gone only once the kernel says so
    shutil.rmtree(temp_dir, ignore_errors=True)


def as_run_here(command: str, port: int, temp_dir: str | None = None) -> str:
    """The README's command as written, with this machine's free port and this
    environment's executables in place of `ray` and `pgpong` (and the test's own Ray
    temporary directory for a head)."""
    command = command.replace("6379", str(port))
    if temp_dir and " start --head" in command:
        command += f" --temp-dir {temp_dir}"
    programs = {"ray": str(BIN / "ray"), "pgpong": f"{sys.executable} -m pgpong"}
    return re.sub(r"^((?:[A-Z_]+=\S+\s+)*)(ray|pgpong)\b", lambda m: m.group(1) + programs[m.group(2)], command)


def program(command: str) -> str:
    return re.sub(r"^(?:[A-Z_]+=\S+\s+)*", "", command).split()[0]


def short_temp_dir() -> str:
    return tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay short


@pytest.fixture
def ray_home(tmp_path):
    """A home directory (the token goes there), a port and a Ray temporary directory
    of its own; the cluster started with them is stopped at the end."""
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        env.pop(key, None)
    port, temp_dir = free_port(), short_temp_dir()
    try:
        yield home, env, port, temp_dir
    finally:
        stop_own_ray(temp_dir, port)


def run(command: str, env: dict, timeout: float = 180, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def test_readme_cluster_steps_train_on_both_nodes_and_a_users_run_survives(ray_home, tmp_path):
    home, env, port, temp_dir = ray_home
    # A user's training run in another terminal, on a Ray instance of its own.
    users_run = tmp_path / "users-run"
    user = subprocess.Popen(
        [sys.executable, "-m", "pgpong", "train", "--workers", "1", "--hidden", "8", "--max-episode-steps", "50"]
        + ["--batch-size", "1", "--run-dir", str(users_run)],
        env={**os.environ, "RAY_ADDRESS": ""},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        commands = readme_block("cluster-on-one-machine")
        assert [program(c) for c in commands] == ["ray", "ray", "ray", "pgpong", "ray"]
        run_dir = tmp_path / "run"
        for command in commands[:3]:
            proc = run(as_run_here(command, port, temp_dir), env)
            assert proc.returncode == 0, proc.stdout + proc.stderr
        assert (home / ".ray" / "auth_token").is_file()
        train = as_run_here(commands[3], port) + f" --run-dir {run_dir}"
        proc = run(train, env, timeout=300)
        assert proc.returncode == 0, proc.stderr
        assert "on 2 Ray worker(s) on 2 node(s)" in proc.stdout, proc.stdout
        rows = read_progress(run_dir / "progress.csv")
        assert rows and all(r["workers"] == "2" for r in rows)
        assert "gcs_client" not in proc.stderr and "InvalidAuthToken" not in proc.stderr
        assert commands[4] == "ray stop"  # the README's last step; the test ends only its own cluster
        ours = ray_processes(temp_dir, port)
        assert len(ours) >= 6  # GCS, two raylets and their helpers
        stop_own_ray(temp_dir, port)
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in ours)

        assert user.poll() is None  # the user's run goes on
        before = len(read_progress(users_run / "progress.csv"))
        deadline = time.monotonic() + 60
        while len(read_progress(users_run / "progress.csv")) <= before + 2:
            assert user.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        user.terminate()
        user.wait(timeout=60)


def test_three_nodes_of_the_ray_command_give_the_weights_of_one_process(ray_home, tmp_path):
    """Three raylets made with `ray start` (two CPUs each), six workers, a batch of 33
    matches: the leaders pull matches from one queue and their nodes' sums meet in the
    reducer; the weights are those of --workers 0, to the bit, with --lag 1 and
    --lag-share 0.5 too."""
    from conftest import train_in_process
    from pgpong.checkpoint import list_checkpoints, load_checkpoint

    home, env, port, temp_dir = ray_home
    ray = BIN / "ray"
    assert run(f"{ray} get-auth-token --generate > /dev/null", env).returncode == 0
    head = run(f"{ray} start --head --port {port} --num-cpus 2 --temp-dir {temp_dir} --include-dashboard false", env)
    assert head.returncode == 0, head.stderr
    for _ in range(2):
        node = run(f"RAY_AUTH_MODE=token {ray} start --address 127.0.0.1:{port} --num-cpus 2", env)
        assert node.returncode == 0, node.stderr
    settings = dict(seed=6, batch_size=33, hidden=16, max_episode_steps=80)
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in settings.items())
    train = f"{sys.executable} -m pgpong train --address 127.0.0.1:{port} --workers 6 --iterations 2 {flags}"
    proc = run(f"{train} --run-dir {tmp_path / 'run'}", {**env, "RAY_AUTH_MODE": "token"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "on 6 Ray worker(s) on 3 node(s)" in proc.stdout, proc.stdout
    spread = load_checkpoint(list_checkpoints(tmp_path / "run" / "checkpoints")[-1])
    alone = train_in_process(tmp_path / "alone", 0, 2, settings)
    assert spread.batch == alone.batch == 2 and spread.env_steps == alone.env_steps
    assert spread.weights.W1.tobytes() == alone.weights.W1.tobytes()
    assert spread.weights.W2.tobytes() == alone.weights.W2.tobytes()
    # --lag 1: the next batch plays while this one's last matches finish, to the same bits
    # --lag 1: the next batch plays while this one's last matches finish; --lag-share 0.5:
    # each batch's first 17 matches so; to the same bits
    lagged = train.replace("--iterations 2", "--iterations 3")
    for name, flag, setting in (("lagged", "--lag 1", {"lag": 1}), ("shared", "--lag-share 0.5", {"lag_share": 0.5})):
        proc = run(f"{lagged} {flag} --run-dir {tmp_path / name}", {**env, "RAY_AUTH_MODE": "token"}, timeout=300)
        assert proc.returncode == 0, proc.stderr
        spread = load_checkpoint(list_checkpoints(tmp_path / name / "checkpoints")[-1])
        alone = train_in_process(tmp_path / f"alone-{name}", 0, 3, {**settings, **setting})
        assert spread.batch == alone.batch == 3 and spread.weights.W1.tobytes() == alone.weights.W1.tobytes()
        assert spread.previous is not None and spread.previous.W2.tobytes() == alone.previous.W2.tobytes()


@pytest.fixture(scope="module")
def token_head(tmp_path_factory):
    """One head with token authentication and the dashboard (Ray's job server)."""
    home = tmp_path_factory.mktemp("home")
    env = {**os.environ, "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0"}
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"):
        env.pop(key, None)
    port, dashboard, temp_dir = free_port(), free_port(), short_temp_dir()
    try:
        proc = run(
            f"{BIN / 'ray'} get-auth-token --generate > /dev/null && {BIN / 'ray'} start --head --port {port} "
            f"--num-cpus 2 --dashboard-port {dashboard} --dashboard-agent-listen-port {free_port()} "
            f"--temp-dir {temp_dir}",  # ports of its own: another Ray instance may be running
            env,
        )
        assert proc.returncode == 0, proc.stderr
        yield env, port, dashboard
    finally:
        stop_own_ray(temp_dir, port)


@pytest.mark.parametrize("token", [None, "not-the-token"])
def test_missing_or_wrong_token_is_refused_at_once(token_head, tmp_path, token):
    env, port, _ = token_head
    driver_env = {**env, "HOME": str(tmp_path)}  # a machine without the head's token
    if token:
        driver_env["RAY_AUTH_TOKEN"] = token
    # The subprocess timeout is the hang guard: pgpong promises an answer within 15 s.
    proc = run(
        f"{sys.executable} -m pgpong train --address 127.0.0.1:{port} --run-dir {tmp_path / 'r'}",
        driver_env,
        timeout=30,
    )
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    expected = (
        "requires an authentication token" if token is None else "refused the authentication token from RAY_AUTH_TOKEN"
    )
    assert expected in lines[0] and "auth_token" in lines[0]
    assert not (tmp_path / "r").exists()


def test_ray_job_trains_and_its_logs_show_the_batches(token_head, tmp_path):
    env, _, dashboard = token_head
    command = readme_block("ray-job")[0]
    assert command.startswith(
        "RAY_AUTH_MODE=token ray job submit --address http://HEAD_IP:8265 --working-dir . -- pgpong train"
    )
    run_dir = tmp_path / "job-run"
    command = (
        command.replace("HEAD_IP:8265", f"127.0.0.1:{dashboard}").replace("/abs/path/runs/pong-job", str(run_dir))
        + " --iterations 2 --batch-size 2 --max-episode-steps 100"
    )
    command = command.replace(" ray job", f" {BIN / 'ray'} job").replace(
        "-- pgpong train", f"-- {sys.executable} -m pgpong train"
    )
    proc = run(command, env, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "succeeded" in out
    assert len(re.findall(r"^batch +\d+ \| 2 episodes", out, re.M)) == 2, out
    assert [r["batch"] for r in read_progress(run_dir / "progress.csv")] == ["1", "2"]  # on the head, where it said


def test_a_cluster_without_authentication_takes_a_driver_that_has_a_token(ray_home, tmp_path):
    home, env, port, temp_dir = ray_home
    proc = run(
        f"RAY_AUTH_MODE=disabled {BIN / 'ray'} start --head --port {port} --num-cpus 1 --include-dashboard false "
        f"--temp-dir {temp_dir}",
        env,
    )
    assert proc.returncode == 0, proc.stderr
    (home / ".ray").mkdir(exist_ok=True)
    (home / ".ray" / "auth_token").write_text("a-token-this-cluster-does-not-ask-for")
    proc = run(
        f"{sys.executable} -m pgpong train --address 127.0.0.1:{port} --iterations 1 --batch-size 1 "
        f"--max-episode-steps 50 --run-dir {tmp_path / 'r'}",
        env,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(read_progress(tmp_path / "r" / "progress.csv")) == 1
