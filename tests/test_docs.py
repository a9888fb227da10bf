"""The defaults people read (`pgpong train --help`, `pgpong bench --help`, the README's
settings table) are TrainConfig's and BenchOptions', so changing a default without its
documentation fails here."""

import dataclasses
import re
from pathlib import Path

import pytest

from conftest import run_pgpong
from pgpong.bench.options import BenchOptions
from pgpong.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
WORDS = {"no limit": None, "full matches": None, "CPUs of the Ray cluster": None, "the CPUs of the Ray cluster": None}


def readme_defaults() -> dict[str, str]:
    table = ROOT.joinpath("README.md").read_text().split("## Settings", 1)[1].split("\n\n")[2]
    found = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        flag = re.match(r"`--([a-z0-9-]+)`", cells[0])
        if flag:
            found[flag.group(1).replace("-", "_")] = cells[1].strip("`")
    return found


def same(shown: str, default) -> bool:
    if shown in WORDS:
        return default is None
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return float(shown) == float(default)
    return shown == str(default)


def test_readme_table_shows_every_default():
    shown = readme_defaults()
    for field in dataclasses.fields(TrainConfig):
        assert field.name in shown, f"README settings table has no --{field.name}"
        if field.default is None and field.metadata["shown"]:  # a default said in words, as --help says it
            assert shown[field.name] == field.metadata["shown"] or same(shown[field.name], None), field.name
        else:
            assert same(shown[field.name], field.default), (field.name, shown[field.name], field.default)


def expected_default(field: dataclasses.Field) -> str:
    # A None default is said in words; any other must be the value itself.
    if field.default is None:
        assert field.metadata["shown"], field.name
        return field.metadata["shown"]
    if isinstance(field.default, tuple):
        return ",".join(map(str, field.default))
    if isinstance(field.default, float) and field.metadata.get("shown"):  # a whole number said as one
        assert float(field.metadata["shown"]) == field.default, field.name
        return field.metadata["shown"]
    return str(field.default)


@pytest.mark.parametrize("command", [TrainConfig, BenchOptions])
def test_help_shows_every_default(command):
    name = "train" if command is TrainConfig else "bench"
    proc = run_pgpong(name, "--help", timeout=60)
    assert proc.returncode == 0
    help_text = " ".join(proc.stdout.split())
    for field in dataclasses.fields(command):
        flag = "--" + field.name.replace("_", "-")
        assert flag in help_text
        assert f"(default: {expected_default(field)})" in help_text, (field.name, expected_default(field))
    if command is TrainConfig:
        assert "1e-4 is the 2016 setting" in help_text and "--lr" in help_text


def test_the_code_cites_only_files_in_the_repository_and_sections_that_exist():
    algorithm = ROOT.joinpath("docs", "ALGORITHM.md").read_text()
    sections = {int(n) for n in re.findall(r"^## (\d+)\. ", algorithm, flags=re.M)}
    assert sections == set(range(1, len(sections) + 1)) and len(sections) >= 7
    cited = []
    for path in ROOT.joinpath("src", "pgpong").rglob("*"):
        if path.suffix not in (".py", ".json"):
            continue
        text = path.read_text()
        outside = re.findall(r"\bSPEC\b|DESIGN\.md|RAY_NOTES|\.\./shared", text)
        assert not outside, f"{path.relative_to(ROOT)} cites {outside}, a file readers of the repository do not have"
        cited += [int(n) for n in re.findall(r"docs/ALGORITHM\.md,? sections? (\d+)", text)]
    assert cited and set(cited) <= sections
