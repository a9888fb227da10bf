"""The versions pgpong claims, tried: for each Python found on the machine and each
dependency set (newest: what pip picks today; lowest: every dependency at the lower
bound pyproject.toml gives it), a fresh virtual environment, the install a user
would do, and the fast tests. Prints a Markdown table (and writes it to --output).

    python tests/matrix.py                       # what `make test-matrix` runs
    python tests/matrix.py --pythons 3.12 --sets newest
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHONS = ("3.11", "3.12", "3.13")
SETS = ("newest", "lowest")


def applies(spec: str, python: str) -> bool:
    """Whether a requirement's marker holds on that Python: pyproject.toml uses
    python_version comparisons only (a bound that differs by Python, where an older
    release has no wheel for a newer Python)."""
    _, _, marker = spec.split("#")[0].partition(";")
    if not marker.strip():
        return True
    found = re.fullmatch(r"\s*python_version\s*(<|<=|>|>=|==)\s*['\"]([0-9.]+)['\"]\s*", marker)
    if not found:
        raise ValueError(f"tests/matrix.py reads python_version markers only, not {marker.strip()!r}")
    mine, theirs = (tuple(int(x) for x in v.split(".")) for v in (python, found.group(2)))
    return {
        "<": mine < theirs,
        "<=": mine <= theirs,
        ">": mine > theirs,
        ">=": mine >= theirs,
        "==": mine == theirs,
    }[found.group(1)]


def lowest_pins(python: str, extras: tuple[str, ...] = ("study", "test")) -> list[str]:
    """name==lower-bound for every dependency of pgpong and the extras that have one,
    as they apply to that Python (X.Y)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in extras:
        specs += project["optional-dependencies"].get(extra, [])
    pins = {}
    for spec in specs:
        found = re.match(r"^([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*([^;#]*)", spec.split("#")[0].strip())
        if not found or not applies(spec, python):
            continue
        low = re.search(r">=\s*([0-9][^,\s]*)", found.group(3))
        if low:
            pins[found.group(1).lower()] = f"{found.group(1).lower()}=={low.group(1)}"
    return sorted(pins.values())


def find_python(version: str) -> str | None:
    """An interpreter of that version: pythonX.Y on PATH if it runs (a pyenv shim may
    not), else one that pyenv installed."""
    candidates = [shutil.which(f"python{version}")]
    pyenv = Path.home() / ".pyenv" / "versions"
    candidates += sorted(str(p) for p in pyenv.glob(f"{version}.*/bin/python{version}"))
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    return None


def run(command: list[str], log, timeout: float) -> int:
    log.write(f"\n$ {' '.join(command)}\n")
    log.flush()
    try:
        return subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, cwd=ROOT).returncode
    except subprocess.TimeoutExpired:
        log.write(f"timed out after {timeout:.0f} s\n")
        return 124


def closing_line(log_path: Path) -> str:
    """pytest's last summary line (e.g. '120 passed, 2 failed in 200.1s')."""
    lines = [line.strip("= \n") for line in log_path.read_text(errors="replace").splitlines()]
    found = [line for line in lines if re.search(r"\d+ (passed|failed|error)", line)]
    return found[-1] if found else ""


def try_one(python: str, deps: str, work: Path, pytest_args: list[str]) -> dict:
    name = f"py{python}-{deps}"
    venv, log_path = work / name, work / f"{name}.log"
    shutil.rmtree(venv, ignore_errors=True)
    began = time.monotonic()
    with open(log_path, "w") as log:
        interpreter = find_python(python)
        if interpreter is None:
            return {"python": python, "deps": deps, "result": "no such Python here", "log": str(log_path)}
        status = run([interpreter, "-m", "venv", str(venv)], log, 300)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
        if status == 0:
            status = run([*pip, "--upgrade", "pip"], log, 600)
        if status == 0 and deps == "lowest":
            pins = lowest_pins(python)
            constraints = work / f"lowest-{python}.txt"
            constraints.write_text("\n".join(pins) + "\n")
            # Wheels only: a lower bound older than the Python has no wheel for it, and
            # building numpy or scipy from source is not what a user's install does.
            wheels = ",".join(pin.split("==")[0] for pin in pins)
            status = run([*pip, "--only-binary", wheels, "-c", str(constraints), "-e", ".[study,test]"], log, 1800)
        elif status == 0:
            status = run([*pip, "-e", ".[study,test]"], log, 1800)
        if status != 0:
            return {"python": python, "deps": deps, "result": "install failed", "log": str(log_path)}
        versions = subprocess.run(
            [
                str(venv / "bin" / "python"),
                "-c",
                "import sys, numpy, ray, gymnasium as g, ale_py as a; "
                "print(sys.version.split()[0], numpy.__version__, ray.__version__, g.__version__, a.__version__)",
            ],
            capture_output=True,
            text=True,
        ).stdout.split()
        status = run([str(venv / "bin" / "python"), "-m", "pytest", "-p", "no:cacheprovider", *pytest_args], log, 3600)
    return {
        "python": versions[0] if versions else python,
        "deps": deps,
        "numpy": versions[1] if len(versions) > 1 else "",
        "ray": versions[2] if len(versions) > 2 else "",
        "gymnasium": versions[3] if len(versions) > 3 else "",
        "ale_py": versions[4] if len(versions) > 4 else "",
        "result": ("passed: " if status == 0 else "FAILED: ") + closing_line(log_path),
        "minutes": round((time.monotonic() - began) / 60, 1),
        "log": str(log_path),
    }


def table(rows: list[dict]) -> str:
    head = "| Python | dependencies | numpy | ray | gymnasium | ale-py | fast tests | minutes |"
    lines = [head, "| --- | --- | --- | --- | --- | --- | --- | ---: |"]
    for r in rows:
        lines.append(
            f"| {r['python']} | {r['deps']} | {r.get('numpy', '')} | {r.get('ray', '')} | {r.get('gymnasium', '')} "
            f"| {r.get('ale_py', '')} | {r['result']} | {r.get('minutes', '')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pythons", default=",".join(PYTHONS), help="Python versions (default: 3.11,3.12,3.13)")
    parser.add_argument("--sets", default=",".join(SETS), help="dependency sets: newest, lowest (default: both)")
    parser.add_argument("--work", type=Path, default=ROOT / ".matrix", help="where the environments go")
    parser.add_argument("--output", type=Path, default=None, help="also write the table to this file")
    parser.add_argument("pytest_args", nargs="*", default=["-m", "not slow", "-q"], help="(default: -m 'not slow' -q)")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for python in args.pythons.split(","):
        for deps in args.sets.split(","):
            print(f"matrix: Python {python}, {deps} dependencies ...", flush=True)
            rows.append(try_one(python, deps, args.work, args.pytest_args))
            print(f"matrix: {rows[-1]['result']} ({rows[-1]['log']})", flush=True)
    text = table(rows)
    print(text)
    if args.output:
        args.output.write_text(text)
    return 0 if all(r["result"].startswith("passed") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
