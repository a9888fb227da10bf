"""The layer rule: every import of pgpong's own code runs down the house, never up and
never round in a circle, and the code map in docs/ARCHITECTURE.md names every module.

The rooms below are those of docs/ARCHITECTURE.md, from the top floor down. A module
may import from the rooms after its own; inside a package, from the modules after it
in the package's order. Imports are read from the source (those inside functions
too), so an import that only runs late cannot hide.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "pgpong"

# The rooms from the top floor down; a package's modules in their own order, top down.
ROOMS: list[tuple[str, list[str]]] = [
    ("cli", ["cli", "cli.train", "cli.play", "cli.pictures", "cli.bench", "cli.study", "cli.common"]),
    ("api", []),
    ("agent", []),
    ("plot", []),
    ("scaling", ["scaling", "scaling.__main__", "scaling.learning", "scaling.model"]),
    ("study", ["study", "study.runner", "study.report", "study.plan"]),
    ("bench", ["bench", "bench.simulate", "bench.throughput", "bench.updates", "bench.contention", "bench.options"]),
    ("noise", []),
    ("session", []),
    ("evaluate", []),
    ("record", []),
    ("trainer", []),
    ("pace", []),
    ("rundir", []),
    ("checkpoint", []),
    ("runlog", []),
    ("console", []),
    ("config", []),
    ("schedule", []),
    (
        "pool",
        [
            "pool",
            "pool.cluster_pool",
            "pool.leader",
            "pool.feed",
            "pool.queue",
            "pool.ahead",
            "pool.reducer",
            "pool.columns",
            "pool.ray_pool",
            "pool.local",
            "pool.handout",
            "pool.worker",
            "pool.base",
            "pool.sums",
        ],
    ),
    ("placement", []),
    ("cluster", []),
    ("original", []),
    ("rollout", []),
    ("envs", []),
    ("rmsprop", []),
    ("policy", []),
    ("returns", []),
    ("frames", []),
    ("files", []),
    ("errors", []),
]
# Outside the floors: `python -m pgpong` (the command line's entry) and the package's face.
OUTSIDE = {
    "__main__": "runs the command line",
    "": "the package's face: its version, and the public API's names, each loaded on first use (PEP 562) from the "
    "module that defines it (api, agent, the error types' modules); nothing of pgpong imports them from the face",
}
# Imports allowed to run against the rule, each with its reason: (importer, imported).
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("cli", ""): "the command line prints pgpong.__version__ (--version)",
}
# Where the libraries pgpong stands on may be imported (DESIGN.md), and the exceptions.
GYMNASIUM_OR_ALE = {"envs": "the one module that knows Gymnasium/ALE", "bench.throughput": "raw emulation: ALE itself"}
RAY = {
    "cluster": "starting or joining Ray",
    "pool.worker": "a worker fetches the batch's weights",
    "pool.ray_pool": "Ray actors",
    "pool.cluster_pool": "a leader per node",
    "pool.leader": "a node's leader runs its node's workers",
    "pool.queue": "the queue reads the weights it is sent, to publish a copy of its own",
    "pool.feed": "a leader asks the queue for matches, and for an announced batch's weights",
    "pool.ahead": "the trainer's state goes to the reducer through the object store, and its own weights to the queue",
    "bench.simulate": "a simulated cluster on this machine",
    "bench.throughput": "bench's memory probe, an actor of its own",
    "study.runner": "trials on Ray Tune",
    "cli.study": "says Ray Tune is missing before a study starts",
}


def module_files() -> dict[str, Path]:
    """Every module of pgpong by its dotted name below pgpong ('' for the package itself)."""
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, int]]:
    """The pgpong modules and the outside libraries that `path` imports, anywhere in it,
    with their lines: ('pool.base', 12), ('ray', 30), ..."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package, up level - 1
                base = ["pgpong", *package.split(".")] if package else ["pgpong"]
                module = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:  # `from pgpong.pool import sums` imports the module pgpong.pool.sums
                whole = f"{module}.{alias.name}".removeprefix("pgpong.")
                found.append((f"pgpong.{whole}" if whole in known else module, node.lineno))
    mine = []
    for module, line in found:
        if module == "pgpong" or module.startswith("pgpong."):
            module = module.removeprefix("pgpong").removeprefix(".")
        else:
            module = "!" + module.split(".")[0]  # an outside library
        if module != name:
            mine.append((module, line))
    return mine


def rank() -> dict[str, tuple[int, int]]:
    """Each module's place: (room, place inside its package), top down."""
    places = {}
    for room, (name, inside) in enumerate(ROOMS):
        for place, module in enumerate(inside or [name]):
            places[module] = (room, place)
    return places


def violations(files: dict[str, Path]) -> list[str]:
    """Every import of pgpong's own code that runs up or sideways, unless excepted."""
    places, problems = rank(), []
    for name, path in sorted(files.items()):
        if name in OUTSIDE:
            continue
        for module, line in imports_of(name, path, set(files)):
            if module.startswith("!") or (name, module) in EXCEPTIONS:
                continue
            mine, theirs = places[name], places.get(module, (-1, -1))  # outside the floors: above all
            same_package = mine[0] == theirs[0]
            if (mine[0] >= theirs[0] and not same_package) or (same_package and mine[1] >= theirs[1]):
                problems.append(f"{path.name}:{line}: {name} imports {module or 'pgpong'}")
    return problems


def test_every_module_has_a_room():
    files, places = module_files(), rank()
    assert set(files) - set(OUTSIDE) == set(places), "place new modules in ROOMS (and docs/ARCHITECTURE.md)"


def test_every_import_runs_down_the_house():
    assert violations(module_files()) == []


def test_an_upward_import_is_caught(tmp_path):
    """The rule can fail: policy.py importing trainer (up) and frames.py importing
    policy (closing a circle, frames <- policy) are both found."""
    files = module_files()
    planted = {}
    for name, text in {
        "policy": "from pgpong.trainer import Trainer\n",
        "frames": "def late():\n    from pgpong import policy\n",
    }.items():
        copy = tmp_path / f"{name}.py"
        copy.write_text(files[name].read_text() + "\n" + text)
        planted[name] = copy
    found = violations({**files, **planted})
    assert [p.split(": ", 1)[1] for p in found] == ["frames imports policy", "policy imports trainer"]


def test_outside_libraries_are_imported_only_where_the_design_says():
    files = module_files()
    for name, path in files.items():
        libraries = {module[1:] for module, _ in imports_of(name, path, set(files)) if module.startswith("!")}
        if libraries & {"gymnasium", "ale_py"}:
            assert name in GYMNASIUM_OR_ALE, f"{name} imports Gymnasium or ALE"
        if "ray" in libraries:
            assert name in RAY, f"{name} imports Ray"
    assert set(GYMNASIUM_OR_ALE) | set(RAY) <= set(files)


@pytest.mark.parametrize(
    "module", ["scaling", "scaling.learning", "scaling.__main__", "placement", "schedule", "config"]
)
def test_pure_modules_load_no_ray_gymnasium_or_ale(module):
    """Imported for real in a fresh interpreter: what they pull in, at any depth."""
    heavy = ["ray", "gymnasium", "ale_py", "numba"]
    code = f"import sys, pgpong.{module}; print([m for m in {heavy!r} if m in sys.modules])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_the_code_map_names_every_module():
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    for path in module_files().values():
        shown = str(path.relative_to(SRC))
        assert shown in text, f"docs/ARCHITECTURE.md does not name {shown}"


def test_no_module_reaches_450_lines():
    long = {str(p.relative_to(SRC)): n for p in SRC.rglob("*.py") if (n := len(p.read_text().splitlines())) >= 450}
    assert long == {}
