"""The exporter's vocoder check (scripts/cosyvoice3/export.py check_vocoder_windows) on the tiny
checkpoint made voiced, F0 200 Hz to 1 kHz (make_tiny --pitch): it accepts the network as
exported, whose windows carry the source's phase as the engine does, and refuses a changed weight,
a phase summed in float32 and a phase that is not carried.

    /usr/bin/python3 -m pytest scripts/tests/test_cosyvoice3_export.py
"""

import math
import subprocess
import sys

import pytest
import torch

from ..common.paths import REPO

pytest.importorskip("yaml")

from ..cosyvoice3 import export as ex  # noqa: E402
from ..cosyvoice3 import net  # noqa: E402

LOW, HIGH = 200.0, 1000.0


@pytest.fixture(scope="module")
def voiced(tmp_path_factory):
    """(model dir, config, vocoder context) of the tiny checkpoint with F0 from LOW to HIGH."""
    d = tmp_path_factory.mktemp("cv3-voiced")
    subprocess.run([sys.executable, "-m", "scripts.cosyvoice3.make_tiny", str(d), "--pitch", "%g:%g" % (LOW, HIGH)],
                   cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    cfg = net.load_config(str(d))
    return str(d), cfg, ex.vocoder_context(load(str(d), cfg), cfg)


def load(model_dir, cfg, cls=net.CosyVoice3HiFT):
    """The checkpoint's HiFT as `cls`, with the export's noise table."""
    hift = cls(cfg.hift)
    net.load_into(hift, net.fold_weight_norm(net.load_checkpoint(model_dir + "/hift.pt")), "hift.pt")
    g = torch.Generator().manual_seed(ex.HIFT_NOISE_SEED)
    hift.set_noise(torch.rand(ex.HIFT_NOISE_SAMPLES, cfg.hift.nb_harmonics + 1, generator=g))
    return hift.eval()


def test_pitch_spans_what_make_tiny_was_asked(voiced):
    model_dir, cfg, _ = voiced
    with torch.no_grad():
        f0 = load(model_dir, cfg).f0_predictor(ex.check_mel(cfg))
    assert abs(float(f0.min()) - LOW) < 1 and abs(float(f0.max()) - HIGH) < 1, (f0.min(), f0.max())


def test_check_accepts_high_pitches(voiced):
    model_dir, cfg, ctx = voiced
    worst = ex.check_vocoder_windows(load(model_dir, cfg), ex.load_hift(model_dir, cfg), cfg, ctx)
    # float32 rounding of the network alone, far below the limit.
    assert worst < ex.VOCODER_WINDOW_LIMIT / 100, worst


def test_check_refuses_a_changed_weight(voiced):
    model_dir, cfg, ctx = voiced
    hift = load(model_dir, cfg)
    with torch.no_grad():
        hift.conv_post.weight[0, 0, 3] += 0.01
    with pytest.raises(SystemExit, match="vocoder windows differ"):
        ex.check_vocoder_windows(hift, ex.load_hift(model_dir, cfg), cfg, ctx)


class Float32Phase(net.CosyVoice3HiFT):
    """The phase as CosyVoice sums it: F0 in cycles a sample, summed in float32 and multiplied
    by the hop."""

    def phase(self, f0, phase, phase_at):
        B = f0.shape[0]
        rad = torch.fmod(f0.unsqueeze(-1) * self.harmonics / self.c.sample_rate, 1.0)
        cs = torch.cumsum(rad, dim=1)
        idx = phase_at.reshape(B, 1, 1).expand(B, 1, rad.shape[-1])
        before = (torch.gather(cs, 1, idx) - torch.gather(rad, 1, idx)).reshape(B, 1, -1)
        return torch.remainder(phase.unsqueeze(1) + (cs - before) * self.c.hop, 1.0)


class PhaseNotCarried(net.CosyVoice3HiFT):
    """Every window starts its harmonics at phase 0."""

    def phase(self, f0, phase, phase_at):
        return super().phase(f0, torch.zeros_like(phase), phase_at)


@pytest.mark.parametrize("cls", [Float32Phase, PhaseNotCarried])
def test_check_refuses_wrong_phase(voiced, cls):
    model_dir, cfg, ctx = voiced
    with pytest.raises(SystemExit, match="vocoder windows differ"):
        ex.check_vocoder_windows(load(model_dir, cfg, cls), ex.load_hift(model_dir, cfg), cfg, ctx)


def test_phase_out_is_the_turn_within_each_frame(voiced):
    """phase_out is each frame's phase in turns, in [0, 1): hop·F0·h/sample_rate turns a frame
    for harmonic h, summed in float64 from the phase given before frame phase_at."""
    model_dir, cfg, _ = voiced
    hift = load(model_dir, cfg)
    mel = ex.check_mel(cfg, 40)
    H = cfg.hift.nb_harmonics + 1
    start = torch.rand(1, H, generator=torch.Generator().manual_seed(3))
    at = 8
    with torch.no_grad():
        _, out = hift(mel, start, torch.tensor([at]), torch.zeros(1, dtype=torch.int64))
        f0 = hift.f0_predictor(mel)[0].double()
    h = torch.arange(1, H + 1, dtype=torch.float64)
    step = f0.unsqueeze(-1) * h * cfg.hift.hop / cfg.sample_rate                    # [F, H]
    want = start[0].double() + torch.cumsum(step, 0) - torch.cumsum(step, 0)[at - 1]
    got = out[0].double()
    assert float(got.min()) >= 0 and float(got.max()) < 1
    d = torch.remainder(got - want + 0.5, 1.0) - 0.5
    assert float(d.abs().max()) < 1e-6, float(d.abs().max())
    assert not math.isnan(float(got.sum()))
