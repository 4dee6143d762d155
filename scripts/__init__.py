"""voxmux's Python side, one package per model family as the Go side has them (instance/<family>):

    common/      layers and helpers written once (RMSNorm, ONNX Runtime's contrib operators, the
                 eager baselines' HTTP front, the profile summary)
    cosyvoice3/  CosyVoice3 (served by the staged family): network, exporter, voice prompts, tiny
                 checkpoint, parity check, eager baseline
    voxcpm/      VoxCPM 1.5: network, exporter, tokenizer, tiny checkpoint, reference import,
                 parity checks, eager baseline
    staged/      the tiny staged model (models/tiny) and the CosyVoice3-0.5B-shaped benchmark model
    piper/       the tiny Piper voices (models/tiny-piper) and Piper's own executable as a server
    tests/       the pytest suite (`make test` runs it with the linter)

Each script runs as a module from the repository root, e.g.
`/usr/bin/python3 -m scripts.voxcpm.export MODEL_DIR OUT_DIR`. The package is `scripts`, not the
family's name alone, because the parity checks import the upstream `voxcpm` and `cosyvoice`
packages under their own names.
"""

import importlib.util as _util
import sys as _sys

# Another interpreter on PATH (a virtual environment, a distribution's own Python) may lack the
# modules the scripts need; say which and where they come from rather than fail on an import deep
# inside a network definition.
_missing = [m for m in ("numpy", "torch", "onnx") if _util.find_spec(m) is None]
if _missing:
    raise SystemExit(
        "voxmux's scripts need numpy, torch and onnx; %s has no %s. On Debian run them with "
        "/usr/bin/python3 after `make deps` (python3-numpy python3-torch python3-onnx), or with an "
        "interpreter that has them (a CUDA build of torch for --device cuda)."
        % (_sys.executable, ", ".join(_missing)))
