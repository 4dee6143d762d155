"""Where the repository is, and how one script runs another as a module of the `scripts` package
(`python3 -m scripts.<family>.<role>`, from the repository root or with it on PYTHONPATH)."""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_module(module, args, **kwargs):
    """subprocess.run of `python3 -m module args` with this interpreter, the repository on the
    child's PYTHONPATH so that the module is found from any working directory (relative paths in
    args keep their meaning)."""
    env = dict(kwargs.pop("env", None) or os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", module] + list(args), env=env, **kwargs)
