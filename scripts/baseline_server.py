#!/usr/bin/env python3
"""The baseline voxmux is measured against: the CosyVoice3-0.5B-shaped model in PyTorch eager
mode, one request at a time per worker, the way CosyVoice's own servers run it.

    usage: scripts/baseline_server.py --model-dir DIR [--port 8081] [--workers 1] [--device cuda]

DIR is what scripts/export_cosyvoice_shaped.py wrote: pipeline.yaml (token bounds, flow steps,
guidance, chunk schedule) and weights.pt (the same weights as the ONNX graphs; without it the
modules are rebuilt from the manifest's seed). The server answers the same API as voxmux's router
for what the benchmark sends:

    POST /v1/audio/speech {"input": "...", "response_format": "pcm"|"wav", "model", "voice"}
         -> 200, 16-bit mono 24 kHz audio streamed chunk by chunk (chunked transfer encoding)
    GET  /healthz, /readyz
    GET  /metrics   voxmux_gpu_memory_used_bytes / voxmux_gpu_utilization_ratio per GPU, when
                    NVML (pynvml) is importable

Each of --workers processes owns a copy of the model on the GPU and synthesizes one request at a
time: its LM thread generates speech tokens (greedy, KV cache grown by concatenation, like a
Hugging Face decoder) on its own CUDA stream while the main thread turns every finished chunk of
tokens into mel (10 Euler steps of the DiT with classifier-free guidance, batch 2) and audio (the
vocoder), as CosyVoice's model.py does with its llm_job thread. Requests beyond the workers wait in
a queue. Only the Python standard library and torch are used.
"""

import argparse
import json
import math
import multiprocessing as mp
import os
import queue
import signal
import struct
import sys
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------
# Manifest


def _scalar(v):
    v = v.strip()
    if v.startswith("[") and v.endswith("]"):
        return [_scalar(x) for x in v[1:-1].split(",") if x.strip()]
    for cast in (int, float):
        try:
            return cast(v)
        except ValueError:
            pass
    return v.strip("'\"")


def read_manifest(path):
    """Reads the flat two-level pipeline.yaml the exporter writes (PyYAML when installed)."""
    try:
        import yaml
        with open(path) as f:
            return yaml.safe_load(f)
    except ImportError:
        pass
    out, section = {}, None
    with open(path) as f:
        for raw in f:
            line = raw.split("#", 1)[0].rstrip()
            if not line.strip():
                continue
            key, _, value = line.strip().partition(":")
            if not line.startswith(" "):
                if value.strip():
                    out[key] = _scalar(value)
                    section = None
                else:
                    section = out.setdefault(key, {})
            elif section is not None:
                section[key] = _scalar(value)
    return out


class Settings:
    def __init__(self, m):
        lm, flow, st = m["lm"], m["flow"], m["streaming"]
        self.sample_rate = int(m["sample_rate"])
        self.dtype = m.get("dtype", "float32")
        self.offset = int(m["tokenizer"]["offset"])
        self.bos = int(m["tokenizer"]["bos"])
        self.sos = int(lm["sos"])
        self.speech_vocab = int(lm["speech_vocab"])
        self.speech_token_offset = int(lm["speech_token_offset"])
        self.min_tpc = float(lm["min_tokens_per_char"])
        self.max_tpc = float(lm["max_tokens_per_char"])
        self.max_tokens = int(lm.get("max_tokens", 4000))
        self.mel_bins = int(flow["mel_bins"])
        self.fpt = int(flow.get("frames_per_token", 2))
        self.steps = int(flow["steps"])
        self.cfg = float(flow["cfg_strength"])
        self.hop = int(m["vocoder"]["hop"])
        self.chunks = [int(c) for c in st["chunk_tokens"]]
        self.context = int(st["context_tokens"])

    def bounds(self, text):
        """Speech-token bounds for text, as voxmux's engine computes them (per character)."""
        chars = len(text)
        hi = min(max(int(chars * self.max_tpc + 0.5), 1), self.max_tokens)
        return min(int(chars * self.min_tpc), hi), hi

    def chunk_size(self, i):
        return self.chunks[i] if i < len(self.chunks) else self.chunks[-1]


# ---------------------------------------------------------------------------------------------
# Eager pipeline (runs inside a worker process)


class EagerPipeline:
    def __init__(self, model_dir, device, settings):
        import torch
        import cosyvoice_shaped as cs
        self.torch, self.cs, self.s = torch, cs, settings
        self.device = torch.device(device)
        self.dtype = torch.float16 if settings.dtype == "float16" else torch.float32
        weights = os.path.join(model_dir, "weights.pt")
        models = cs.Models()
        if os.path.exists(weights):
            state = torch.load(weights, map_location="cpu", weights_only=True)
            models.load_state_dict(state["state_dict"])
        else:
            models = cs.build()
        cs.use_sdpa(models, True)
        self.m = models.eval().to(device=self.device, dtype=self.dtype)
        self.lm_stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None

    # LM: greedy decoding with a growing KV cache, one sequence.
    def tokens(self, text, emit):
        torch, cs, s = self.torch, self.cs, self.s
        prompt = [s.bos] + [b + s.offset for b in text.encode("utf-8")] + [s.sos]
        lo, hi = s.bounds(text)
        dev = self.device
        past = [torch.zeros(1, cs.LM_KV_HEADS, 0, cs.LM_HEAD_DIM, device=dev, dtype=self.dtype)] * (2 * cs.LM_LAYERS)
        ids = torch.tensor([prompt], device=dev)
        pos, n = 0, 0
        while True:
            T = ids.shape[1]
            out = self.m.lm(ids, torch.arange(pos, pos + T, device=dev).unsqueeze(0),
                            torch.ones(1, pos + T, dtype=torch.int64, device=dev), *past)
            logits, past = out[0][0, -1], list(out[1:])
            pos += T
            if n < lo:
                logits = logits[: s.speech_vocab]  # end of speech not allowed yet
            tok = int(torch.argmax(logits))
            if tok == s.speech_vocab:
                return
            emit(tok)
            n += 1
            if n >= hi:
                return
            ids = torch.tensor([[tok + s.speech_token_offset]], device=dev)

    def flow(self, tokens, noise):
        """Mel [80, frames] for tokens, starting from noise [80, frames]."""
        torch, s = self.torch, self.s
        toks = torch.tensor([tokens], device=self.device)
        frames = len(tokens) * s.fpt
        tmask = torch.ones(1, 1, len(tokens), device=self.device, dtype=self.dtype)
        fmask = torch.ones(2, 1, frames, device=self.device, dtype=self.dtype)
        mu = self.m.flow_encoder(toks, tmask)
        mu2 = torch.cat([mu, torch.zeros_like(mu)])            # conditional and unconditional
        x = noise.unsqueeze(0).to(self.dtype)
        dt = 1.0 / s.steps
        for step in range(s.steps):
            t = torch.full((2,), step * dt, device=self.device, dtype=self.dtype)
            v = self.m.flow_estimator(torch.cat([x, x]), fmask, mu2, t)
            if s.cfg > 0:
                v = (1 + s.cfg) * v[:1] - s.cfg * v[1:]
            else:
                v = v[:1]
            x = x + dt * v
        return x[0]

    def synthesize(self, text, emit_pcm):
        """Streams text's audio: emit_pcm(float32 tensor on the CPU) once per chunk."""
        torch, s = self.torch, self.s
        st = {"tokens": [], "done": False, "error": None}
        cond = threading.Condition()

        def lm_job():
            try:
                ctx = torch.cuda.stream(self.lm_stream) if self.lm_stream is not None else _nullcontext()
                with ctx, torch.inference_mode():
                    def emit(tok):
                        with cond:
                            st["tokens"].append(tok)
                            cond.notify()
                    self.tokens(text, emit)
            except BaseException as e:  # handed to the request
                st["error"] = e
            finally:
                with cond:
                    st["done"] = True
                    cond.notify()

        th = threading.Thread(target=lm_job, daemon=True)
        th.start()
        gen = torch.Generator(device=self.device).manual_seed(0)
        noise = torch.empty(s.mel_bins, 0, device=self.device)
        flowed, chunk, prev_mel = 0, 0, None
        try:
            with torch.inference_mode():
                while True:
                    with cond:
                        while True:
                            if st["error"] is not None:
                                raise RuntimeError("LM failed: %r" % st["error"])
                            n, size = len(st["tokens"]), s.chunk_size(chunk)
                            if st["done"] and n - flowed <= size:
                                end, last = n, True
                                break
                            if n - flowed > size:  # a chunk leaves when more tokens follow it
                                end, last = flowed + size, False
                                break
                            cond.wait()
                        toks = st["tokens"][:end]
                    if end > flowed:
                        start = max(0, flowed - s.context)
                        f1 = end * s.fpt
                        if noise.shape[1] < f1:  # each frame's noise is drawn once
                            more = torch.randn(s.mel_bins, f1 - noise.shape[1], generator=gen, device=self.device)
                            noise = torch.cat([noise, more], dim=1)
                        mel = self.flow(toks[start:end], noise[:, start * s.fpt:f1])
                        mel = mel[:, (flowed - start) * s.fpt:]
                        ctx_frames = 0 if prev_mel is None else min(s.context * s.fpt, prev_mel.shape[1])
                        voc_in = mel if ctx_frames == 0 else torch.cat([prev_mel[:, prev_mel.shape[1] - ctx_frames:], mel], dim=1)
                        audio = self.m.vocoder(voc_in.unsqueeze(0))[0, ctx_frames * s.hop:]
                        prev_mel = mel
                        emit_pcm(audio.float().cpu())
                    flowed, chunk = end, chunk + 1
                    if last:
                        return
        finally:
            th.join()

    def warmup(self):
        self.synthesize("Warm up the kernels, please.", lambda pcm: None)


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def pcm16(audio):
    """float32 tensor in [-1, 1] -> 16-bit little-endian bytes."""
    import torch
    a = (audio.clamp(-1, 1) * 32767).round().to(torch.int16)
    try:
        return a.numpy().tobytes()
    except (RuntimeError, ImportError):  # a torch built without numpy
        import array
        return array.array("h", a.tolist()).tobytes()


def worker_main(wid, model_dir, device, jobs, results, parent):
    """A worker process: loads the model and serves one request at a time from jobs; it ends when
    told to (None) or when the server process is gone."""
    try:
        settings = Settings(read_manifest(os.path.join(model_dir, "pipeline.yaml")))
        pipe = EagerPipeline(model_dir, device, settings)
        pipe.warmup()
    except BaseException:
        results.put((None, "fatal", "worker %d: %s" % (wid, traceback.format_exc())))
        return
    results.put((None, "ready", wid))
    while True:
        try:
            job = jobs.get(timeout=1)
        except queue.Empty:
            if os.getppid() != parent:
                return
            continue
        if job is None:
            return
        rid, text = job
        try:
            pipe.synthesize(text, lambda pcm: results.put((rid, "chunk", pcm16(pcm))))
            results.put((rid, "done", None))
        except BaseException as e:
            results.put((rid, "error", "%s: %s" % (type(e).__name__, e)))


# ---------------------------------------------------------------------------------------------
# HTTP


class Broker:
    """Hands jobs to the worker processes and routes their output to the waiting requests."""

    def __init__(self, model_dir, device, workers):
        ctx = mp.get_context("spawn")  # CUDA cannot be forked
        self.jobs = ctx.Queue()
        self.results = ctx.Queue()
        self.pending = {}
        self.lock = threading.Lock()
        self.procs = [ctx.Process(target=worker_main, args=(i, model_dir, device, self.jobs, self.results, os.getpid()), daemon=True)
                      for i in range(workers)]
        for p in self.procs:
            p.start()
        ready = 0
        while ready < workers:
            try:
                rid, kind, payload = self.results.get(timeout=5)
            except queue.Empty:
                dead = [i for i, p in enumerate(self.procs) if not p.is_alive()]
                if dead:
                    raise SystemExit("worker(s) %s exited while loading (exit codes %s)"
                                     % (dead, [self.procs[i].exitcode for i in dead]))
                continue
            if kind == "fatal":
                raise SystemExit(payload)
            if kind == "ready":
                ready += 1
                print("worker %d ready" % payload, flush=True)
        threading.Thread(target=self._route, daemon=True).start()

    def _route(self):
        while True:
            rid, kind, payload = self.results.get()
            with self.lock:
                q = self.pending.get(rid)
            if q is not None:
                q.put((kind, payload))

    def submit(self, text):
        rid = uuid.uuid4().hex
        q = queue.Queue()
        with self.lock:
            self.pending[rid] = q
        self.jobs.put((rid, text))
        return rid, q

    def forget(self, rid):
        with self.lock:
            self.pending.pop(rid, None)


def wav_header(rate):
    """A streaming WAV header (sizes 0xFFFFFFFF, as voxmux writes): mono 16-bit PCM."""
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16) +
            b"data" + struct.pack("<I", 0xFFFFFFFF))


def make_handler(broker, settings, gpu):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # one line per request is printed below instead
            pass

        def _send(self, status, body, ctype="application/json"):
            data = body.encode() if isinstance(body, str) else body
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status, msg):
            self._send(status, json.dumps({"error": {"message": msg, "type": "invalid_request_error"}}))

        def do_GET(self):
            if self.path in ("/healthz", "/readyz"):
                self._send(200, "ready\n", "text/plain")
            elif self.path == "/metrics" and gpu is not None:
                self._send(200, gpu.exposition(), "text/plain; version=0.0.4")
            else:
                self._error(404, "not found")

        def do_POST(self):
            if self.path != "/v1/audio/speech":
                self._error(404, "not found")
                return
            try:
                n = int(self.headers.get("Content-Length", "0"))
                req = json.loads(self.rfile.read(n) or b"{}")
            except (ValueError, json.JSONDecodeError) as e:
                self._error(400, "request body is not valid JSON: %s" % e)
                return
            text = str(req.get("input") or "").strip()
            fmt = req.get("response_format") or "wav"
            if not text:
                self._error(400, "input is required")
                return
            if fmt not in ("pcm", "wav"):
                self._error(400, "response_format %r is not supported; use pcm or wav" % fmt)
                return
            start = time.monotonic()
            rid, q = broker.submit(text)
            sent, ttfb, outcome = 0, None, "ok"
            try:
                while True:
                    kind, payload = q.get()
                    if kind == "chunk":
                        if ttfb is None:
                            ttfb = time.monotonic() - start
                            self.send_response(200)
                            self.send_header("Content-Type", "audio/wav" if fmt == "wav" else "audio/pcm")
                            self.send_header("Transfer-Encoding", "chunked")
                            self.end_headers()
                            if fmt == "wav":
                                self._chunk(wav_header(settings.sample_rate))
                        self._chunk(payload)
                        sent += len(payload)
                    elif kind == "done":
                        if ttfb is None:
                            self._error(500, "the model produced no audio for this input")
                            outcome = "no audio"
                        else:
                            self.wfile.write(b"0\r\n\r\n")
                        break
                    else:
                        outcome = "error: %s" % payload
                        if ttfb is None:
                            self._error(502, "synthesis failed: %s" % payload)
                        else:
                            self.close_connection = True  # no final chunk: the client sees a cut stream
                        break
            except (BrokenPipeError, ConnectionResetError):
                outcome = "client gone"
                self.close_connection = True
            finally:
                broker.forget(rid)
            secs = sent / 2 / settings.sample_rate
            print(json.dumps({"msg": "speech", "chars": len(text), "audio_seconds": round(secs, 3),
                              "ttfb_ms": None if ttfb is None else round(1000 * ttfb),
                              "total_ms": round(1000 * (time.monotonic() - start)), "outcome": outcome}), flush=True)

        def _chunk(self, data):
            self.wfile.write(b"%x\r\n" % len(data) + data + b"\r\n")
            self.wfile.flush()

    return Handler


class NVMLGauges:
    """voxmux_gpu_* gauges from NVML, for the GPUs this server's workers see."""

    def __init__(self, nvml, indices):
        self.nvml, self.indices = nvml, indices
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in indices]

    @staticmethod
    def open():
        try:
            import pynvml as nvml
            nvml.nvmlInit()
        except Exception:
            return None
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        try:
            indices = [int(x) for x in visible.split(",")] if visible else list(range(nvml.nvmlDeviceGetCount()))
        except ValueError:  # GPU UUIDs: report every GPU
            indices = list(range(nvml.nvmlDeviceGetCount()))
        return NVMLGauges(nvml, indices)

    def exposition(self):
        mem = ["# TYPE voxmux_gpu_memory_used_bytes gauge"]
        util = ["# TYPE voxmux_gpu_utilization_ratio gauge"]
        for i, h in zip(self.indices, self.handles):
            mem.append('voxmux_gpu_memory_used_bytes{gpu="%d"} %d' % (i, self.nvml.nvmlDeviceGetMemoryInfo(h).used))
            util.append('voxmux_gpu_utilization_ratio{gpu="%d"} %g' % (i, self.nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0))
        return "\n".join(mem + util) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True, help="folder with pipeline.yaml and weights.pt")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8081)
    ap.add_argument("--workers", type=int, default=1, help="processes, each with its own model copy")
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()
    if a.workers < 1:
        ap.error("--workers must be at least 1")
    settings = Settings(read_manifest(os.path.join(a.model_dir, "pipeline.yaml")))
    print("loading %d worker(s) on %s ..." % (a.workers, a.device), flush=True)
    broker = Broker(a.model_dir, a.device, a.workers)
    gpu = NVMLGauges.open()
    srv = ThreadingHTTPServer((a.host, a.port), make_handler(broker, settings, gpu))
    srv.daemon_threads = True
    # SIGINT or SIGTERM stops the server and the workers (a shell's background job ignores SIGINT,
    # so SIGTERM is the one that reaches it there).
    def stop(*_):
        threading.Thread(target=srv.shutdown, daemon=True).start()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("baseline serving on http://%s:%d (%d worker(s), GPU gauges %s)"
          % (a.host, a.port, a.workers, "on" if gpu else "off: pynvml not importable"), flush=True)
    try:
        srv.serve_forever()
    finally:
        srv.server_close()
        for _ in broker.procs:
            broker.jobs.put(None)
        for p in broker.procs:
            p.join(timeout=10)
    print("baseline stopped", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
