"""The HTTP front and worker processes of the eager baselines (scripts/staged/shaped_baseline.py,
scripts/cosyvoice3/baseline.py): the part of voxmux's API that `voxmux bench` uses, served by worker
processes that each hold one copy of a model and synthesize one request at a time.

    POST /v1/audio/speech {"input": "...", "response_format": "pcm"|"wav", "model", "voice"}
         -> 200, 16-bit mono audio streamed chunk by chunk (chunked transfer encoding)
    GET  /healthz, /readyz
    GET  /v1/audio/voices   the voices a request may name, the default first (voxmux's list shape),
                            when the server has a voice list
    GET  /metrics   voxmux_gpu_memory_used_bytes / voxmux_gpu_utilization_ratio per GPU, when
                    NVML (pynvml) is importable

A model is anything `load(*load_args)` returns (in the worker process) with warmup() and
synthesize(text, voice, emit_pcm), emit_pcm taking a float32 CPU tensor in [-1, 1] per chunk.
`load` must be a module-level function: workers are spawned, not forked (CUDA cannot be forked).
Only the Python standard library and torch are used.
"""

import contextlib
import json
import multiprocessing as mp
import os
import queue
import signal
import struct
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def pcm16(audio):
    """float32 tensor in [-1, 1] -> 16-bit little-endian bytes."""
    import torch
    a = (audio.clamp(-1, 1) * 32767).round().to(torch.int16)
    try:
        return a.numpy().tobytes()
    except (RuntimeError, ImportError):  # a torch built without numpy
        import array
        return array.array("h", a.tolist()).tobytes()


def wav_header(rate):
    """A streaming WAV header (sizes 0xFFFFFFFF, as voxmux writes): mono 16-bit PCM."""
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16) +
            b"data" + struct.pack("<I", 0xFFFFFFFF))


def greedy_decode(torch, lm, prompt, past, lo, hi, end, input_id, emit, device):
    """Greedy decoding of one sequence with a key/value cache grown by concatenation, as a Hugging
    Face decoder does: lm(ids, positions, attention_mask, *past) -> (logits, *presents). End of
    speech (logit index end) is banned before lo tokens; at most hi tokens; emit gets each token
    and input_id(token) is the LM's input id for it."""
    ids = torch.tensor([prompt], device=device)
    pos = 0
    for n in range(hi):
        T = ids.shape[1]
        out = lm(ids, torch.arange(pos, pos + T, device=device).unsqueeze(0),
                 torch.ones(1, pos + T, dtype=torch.int64, device=device), *past)
        logits, past = out[0][0, -1], list(out[1:])
        pos += T
        if n < lo:
            logits = logits[:end]  # end of speech not allowed yet
        tok = int(torch.argmax(logits))
        if tok == end:
            return
        emit(tok)
        ids = torch.tensor([[input_id(tok)]], device=device)


def lm_thread(torch, stream, produce):
    """Starts produce(emit) on a thread of its own, on CUDA stream `stream` when there is one, as
    CosyVoice's llm_job runs its LM beside the flow: each emitted token is appended to
    st["tokens"] and wakes cond's waiters, an error is kept in st["error"], and st["done"] is set
    at the end. Returns (st, cond, thread)."""
    st = {"tokens": [], "done": False, "error": None}
    cond = threading.Condition()

    def emit(tok):
        with cond:
            st["tokens"].append(tok)
            cond.notify()

    def job():
        try:
            ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
            with ctx, torch.inference_mode():
                produce(emit)
        except BaseException as e:  # handed to the request
            st["error"] = e
        finally:
            with cond:
                st["done"] = True
                cond.notify()

    th = threading.Thread(target=job, daemon=True)
    th.start()
    return st, cond, th


def worker_main(wid, load, load_args, jobs, results, parent):
    """A worker process: loads the model and serves one request at a time from jobs; it ends when
    told to (None) or when the server process is gone."""
    try:
        pipe = load(*load_args)
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
        rid, text, voice = job
        try:
            pipe.synthesize(text, voice, lambda pcm: results.put((rid, "chunk", pcm16(pcm))))
            results.put((rid, "done", None))
        except BaseException as e:
            results.put((rid, "error", "%s: %s" % (type(e).__name__, e)))


class Broker:
    """Hands jobs to the worker processes and routes their output to the waiting requests."""

    def __init__(self, load, load_args, workers):
        ctx = mp.get_context("spawn")  # CUDA cannot be forked
        self.jobs = ctx.Queue()
        self.results = ctx.Queue()
        self.pending = {}
        self.lock = threading.Lock()
        self.procs = [ctx.Process(target=worker_main, daemon=True,
                                  args=(i, load, load_args, self.jobs, self.results, os.getpid()))
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

    def submit(self, text, voice):
        rid = uuid.uuid4().hex
        q = queue.Queue()
        with self.lock:
            self.pending[rid] = q
        self.jobs.put((rid, text, voice))
        return rid, q

    def forget(self, rid):
        with self.lock:
            self.pending.pop(rid, None)

    def stop(self):
        for _ in self.procs:
            self.jobs.put(None)
        for p in self.procs:
            p.join(timeout=10)


def make_handler(broker, sample_rate, gpu, voices=None, default_voice=None):
    """voices: the names a request may ask for (None: any, the model ignores it); a request
    without one gets default_voice."""
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
            elif self.path == "/v1/audio/voices" and voices is not None:
                names = sorted(voices, key=lambda n: (n != default_voice, n))
                self._send(200, json.dumps({
                    "object": "list",
                    "data": [{"id": n, "object": "voice", "name": n, "type": "builtin"} for n in names],
                    "voices": [{"id": n, "name": n} for n in names]}))
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
            voice = str(req.get("voice") or "") or default_voice
            if not text:
                self._error(400, "input is required")
                return
            if fmt not in ("pcm", "wav"):
                self._error(400, "response_format %r is not supported; use pcm or wav" % fmt)
                return
            if voices is not None and voice not in voices:
                self._error(400, "voice %r is not known; known voices: %s" % (voice, ", ".join(sorted(voices))))
                return
            start = time.monotonic()
            rid, q = broker.submit(text, voice)
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
                                self._chunk(wav_header(sample_rate))
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
            secs = sent / 2 / sample_rate
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


def serve(broker, host, port, sample_rate, voices=None, default_voice=None):
    """Serves until SIGINT or SIGTERM, then stops the workers."""
    gpu = NVMLGauges.open()
    srv = ThreadingHTTPServer((host, port), make_handler(broker, sample_rate, gpu, voices, default_voice))
    srv.daemon_threads = True
    # SIGINT or SIGTERM stops the server and the workers (a shell's background job ignores SIGINT,
    # so SIGTERM is the one that reaches it there).

    def stop(*_):
        threading.Thread(target=srv.shutdown, daemon=True).start()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print("baseline serving on http://%s:%d (%d worker(s), GPU gauges %s)"
          % (host, port, len(broker.procs), "on" if gpu else "off: pynvml not importable"), flush=True)
    try:
        srv.serve_forever()
    finally:
        srv.server_close()
        broker.stop()
    print("baseline stopped", flush=True)
    return 0
