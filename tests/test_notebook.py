"""The tutorial and the README's Python example, run for real: docs/tutorial.ipynb from
top to bottom in a Jupyter kernel on a small budget (a failing cell fails the test),
its text form docs/tutorial.py saying the same cells, the committed notebook carrying
its outputs; a kernel's interrupt stopping train() with nothing lost; the README's
block run as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import jupytext
import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "docs" / "tutorial.ipynb"
SCRIPT = ROOT / "docs" / "tutorial.py"
MAX_NOTEBOOK_BYTES = 3 * 2**20


@pytest.fixture
def kernel_env(tmp_path, monkeypatch):
    """A Jupyter kernel of this Python, whatever kernels the machine has installed,
    started on the tutorial's small budget."""
    spec = tmp_path / "jupyter" / "kernels" / "python3"
    spec.mkdir(parents=True)
    argv = [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec.joinpath("kernel.json").write_text(json.dumps({"argv": argv, "display_name": "pgpong", "language": "python"}))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("PGPONG_TUTORIAL", "quick")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    return tmp_path


def execute(notebook: nbformat.NotebookNode, cwd: Path, timeout: int = 300) -> nbformat.NotebookNode:
    """Run every cell in a fresh kernel, in order; CellExecutionError names a failing cell."""
    client = NotebookClient(
        notebook, kernel_name="python3", timeout=timeout, resources={"metadata": {"path": str(cwd)}}
    )
    return client.execute()


def without_outputs(path: Path) -> nbformat.NotebookNode:
    """The notebook's cells as written, without the committed outputs."""
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    return notebook


def cells(notebook: nbformat.NotebookNode) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source.strip()) for cell in notebook.cells]


def test_the_notebook_and_its_script_say_the_same():
    committed = nbformat.read(NOTEBOOK, as_version=4)
    assert cells(committed) == cells(jupytext.read(SCRIPT)), "run: jupytext --sync docs/tutorial.ipynb"


def test_the_committed_notebook_was_run_top_to_bottom_and_shows_its_pictures():
    assert NOTEBOOK.stat().st_size < MAX_NOTEBOOK_BYTES
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert [cell.execution_count for cell in code] == list(range(1, len(code) + 1))
    outputs = [output for cell in code for output in cell.outputs]
    kinds = [kind for output in outputs for kind in output.get("data", {})]
    assert kinds.count("image/png") == 4 and kinds.count("image/gif") == 1
    assert not [output for output in outputs if output.output_type == "error"]
    text = "".join(output.get("text", "") for output in outputs)
    assert "PGPONG_TUTORIAL" not in text and "Traceback" not in text
    assert "mean score +" in text  # the shipped agent's evaluation: it wins
    assert "stopped" not in text  # the training run ended by its stop condition, not by hand


@pytest.mark.slow
def test_the_notebook_runs_top_to_bottom(kernel_env):
    notebook = without_outputs(NOTEBOOK)
    began = time.monotonic()
    execute(notebook, NOTEBOOK.parent)
    seconds = time.monotonic() - began
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    kinds = [kind for output in outputs for kind in output.get("data", {})]
    assert kinds.count("image/png") == 4 and kinds.count("image/gif") == 1
    text = "".join(output.get("text", "") for output in outputs)
    assert "pgpong: done after" in text and "mean score" in text
    assert "\x1b[" not in text  # no terminal escape codes in a notebook
    assert seconds < 240, f"the notebook took {seconds:.0f} s on the tests' budget"


def test_a_failing_cell_fails_the_run(kernel_env):
    notebook = without_outputs(NOTEBOOK)
    broken = nbformat.v4.new_code_cell('raise RuntimeError("a deliberately broken cell")')
    notebook.cells.insert(2, broken)  # after the parameters
    with pytest.raises(CellExecutionError, match="a deliberately broken cell"):
        execute(notebook, NOTEBOOK.parent)
    later = [cell for cell in notebook.cells[3:] if cell.cell_type == "code"]
    assert all(not cell.outputs and cell.execution_count is None for cell in later)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.long)])
def test_a_kernel_interrupt_stops_train_and_loses_nothing(kernel_env, workers):
    """The notebook's stop button (SIGINT to the kernel's process group) in the middle
    of a run, in this process or on Ray: train() returns the run as its last finished
    batch left it, checkpoint and row on disk, and the Ray it started is stopped."""
    from jupyter_client.manager import start_new_kernel

    run_dir = kernel_env / "run"
    manager, client = start_new_kernel(kernel_name="python3")
    try:
        code = (
            "import pgpong\n"
            f"run = pgpong.train({str(run_dir)!r}, workers={workers}, batch_size=2, max_episode_steps=200, hidden=8)\n"
            "import sys\n"
            "print('returned', run.interrupted, run.batches, run.checkpoint.name, 'ray' in sys.modules "
            "and sys.modules['ray'].is_initialized())"
        )
        message = client.execute(code)
        progress = run_dir / "progress.csv"
        deadline = time.monotonic() + 120
        while not (progress.exists() and len(progress.read_text().splitlines()) >= 4):  # header + 3 rows
            assert time.monotonic() < deadline, "the run did not get going"
            time.sleep(0.2)
        manager.interrupt_kernel()
        reply = client.get_shell_msg(timeout=60)
        while reply["parent_header"].get("msg_id") != message:
            reply = client.get_shell_msg(timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        printed = _stream_text(client, message)
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    found = re.search(r"returned True (\d+) ckpt-(\d+)\.npz False", printed)
    assert found, printed
    batches, checkpoint = int(found.group(1)), int(found.group(2))
    rows = progress.read_text().splitlines()[1:]
    assert batches == checkpoint == len(rows) >= 3  # the last finished batch: its row and its checkpoint
    assert "pgpong: stopped. The newest checkpoint is" in printed and "pgpong.train(run_dir=" in printed


def _stream_text(client, message: str) -> str:
    """What the cell printed (stdout and stderr), up to its end."""
    text = []
    while True:
        output = client.get_iopub_msg(timeout=30)
        if output["parent_header"].get("msg_id") != message:
            continue
        if output["msg_type"] == "stream":
            text.append(output["content"]["text"])
        if output["msg_type"] == "status" and output["content"]["execution_state"] == "idle":
            return "".join(text)


def readme_python_example() -> str:
    text = (ROOT / "README.md").read_text()
    found = re.search(r"<!-- python-example -->\n```python\n(.*?)```\n<!-- /python-example -->", text, re.S)
    assert found, "README has no python-example block"
    return found.group(1)


@pytest.mark.long  # the API it calls runs in the notebook's test
def test_the_readme_python_example_runs_as_written(tmp_path):
    block = readme_python_example()
    assert len(block.strip().splitlines()) <= 12
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.run(
        [sys.executable, "-c", block], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"Run\('runs/ALE-Pong-v5__0__[\d-]+': 2 batches, running reward -\d+\.\d\d\)", proc.stdout)
    score = re.search(r"the shipped agent scored ([+-]\d+)", proc.stdout)
    assert score and int(score.group(1)) > 0, proc.stdout  # it wins its match
    assert len(list((tmp_path / "runs").iterdir())) == 1
