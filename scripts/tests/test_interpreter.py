"""The scripts package names the modules an interpreter lacks instead of failing on a raw import."""
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_missing_module_is_named():
    code = "import sys; sys.modules['torch'] = None; import scripts.voxcpm.make_tiny"
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert r.returncode != 0
    assert "need numpy, torch and onnx" in r.stderr and "has no torch" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
