"""The README's commands as written: the venv's interpreter, configs that compose, modules and scripts that exist."""

from __future__ import annotations

import importlib.util
import re
import shlex

import pytest
from hydra import compose, initialize_config_dir

from tests.conftest import ROOT


def commands() -> list[str]:
    """Every command line of the README's bash blocks (continuations joined, comments dropped)."""
    text = (ROOT / "README.md").read_text()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        block = block.replace("\\\n", " ")
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def test_no_bare_python():
    bare = [c for c in commands() if re.search(r"(^|[\s&;])python3?\s", c)]
    assert not bare, f"use .venv/bin/python: {bare}"


TRAIN = [c for c in commands() if ".venv/bin/python train.py" in c]


@pytest.mark.parametrize("command", TRAIN)
def test_train_commands_compose(command):
    args = shlex.split(command.split("train.py", 1)[1])
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        compose("train", overrides=args)


@pytest.mark.parametrize("command", [c for c in commands() if ".venv/bin/python" in c and "train.py" not in c])
def test_modules_and_scripts_exist(command):
    target = shlex.split(command.split(".venv/bin/python", 1)[1])
    if target[0] == "-m":
        assert importlib.util.find_spec(target[1]) is not None, target[1]
    else:
        assert (ROOT / target[0]).is_file(), target[0]
