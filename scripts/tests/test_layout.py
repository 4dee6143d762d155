"""The Python side's layout: every module imports as part of the `scripts` package (relative
imports resolve, optional dependencies are imported where used), and none reaches other code by
editing sys.path."""

import importlib
import os
import pkgutil
import re

import pytest

import scripts
from ..common.paths import REPO

MODULES = sorted(m.name for m in pkgutil.walk_packages(scripts.__path__, "scripts."))


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name):
    importlib.import_module(name)


def test_families_are_packages():
    for family in ("common", "cosyvoice3", "voxcpm", "staged", "piper", "tests"):
        assert "scripts." + family in MODULES, family


def test_no_sys_path_edits():
    edits = []
    for top in ("scripts", "instance", "cmd"):
        for root, _, files in os.walk(os.path.join(REPO, top)):
            if "node_modules" in root:
                continue
            for f in files:
                if f.endswith((".py", ".sh")):
                    path = os.path.join(root, f)
                    with open(path, encoding="utf-8") as src:
                        for i, line in enumerate(src, 1):
                            if re.search(r"\bsys\.path\b", line) and path != os.path.abspath(__file__):
                                edits.append("%s:%d" % (os.path.relpath(path, REPO), i))
    assert edits == []
