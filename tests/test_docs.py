"""The defaults people read (`pgpong train --help`, the README's settings table) are
TrainConfig's, so changing a default without its documentation fails here."""

import dataclasses
import re
from pathlib import Path

import pytest

from conftest import run_pgpong
from pgpong.cli import SHOWN_DEFAULTS
from pgpong.config import TrainConfig

ROOT = Path(__file__).resolve().parents[1]
WORDS = {"no limit": None, "full matches": None, "CPUs of the Ray cluster": None, "the CPUs of the Ray cluster": None}


def readme_defaults() -> dict[str, str]:
    table = ROOT.joinpath("README.md").read_text().split("## Settings", 1)[1].split("\n\n")[2]
    found = {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        flag = re.match(r"`--([a-z-]+)`", cells[0])
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
        assert same(shown[field.name], field.default), (field.name, shown[field.name], field.default)


@pytest.fixture(scope="module")
def help_text():
    proc = run_pgpong("train", "--help", timeout=60)
    assert proc.returncode == 0
    return " ".join(proc.stdout.split())


def test_help_shows_every_default(help_text):
    for field in dataclasses.fields(TrainConfig):
        flag = "--" + field.name.replace("_", "-")
        assert flag in help_text
        shown = SHOWN_DEFAULTS.get(field.name, field.default)
        assert f"(default: {shown})" in help_text, (field.name, shown)
    assert "1e-4 is the 2016 setting" in help_text
