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
