"""Piper's own executable behind the speech API, one process per request: the reference voxmux's
Piper path is benchmarked against (docs/benchmarks/, docs/piper.md).

    usage: python3 -m scripts.piper.process_server --piper DIR/piper --voice V.onnx [--port 8082] [--threads N]

Every POST /v1/audio/speech {"input": "..."} starts `piper --output_raw` (Piper's executable from
github.com/amitybell/piper-bin-linux, its libraries and espeak-ng-data beside it), writes the text
to its stdin and streams its 16-bit mono audio back as it comes, behind a WAV header (sizes left
open, as a stream) at the voice's rate, with chunked transfer encoding. Requests run at once,
each in its own process: the way a service that shells out to Piper per request runs it. Also
GET /healthz and /readyz. Only the Python standard library is used.
"""

import argparse
import json
import os
import struct
import subprocess
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def wav_header(rate):
    # Sizes 0xFFFFFFFF: a stream whose length is not known up front.
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16) +
            b"data" + struct.pack("<I", 0xFFFFFFFF))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--piper", required=True)
    ap.add_argument("--voice", required=True)
    ap.add_argument("--port", type=int, default=8082)
    ap.add_argument("--threads", type=int, default=0, help="OMP/ORT threads per process (0: Piper's default)")
    a = ap.parse_args()
    with open(a.voice + ".json") as f:
        rate = json.load(f)["audio"]["sample_rate"]
    pdir = os.path.dirname(os.path.abspath(a.piper))
    env = dict(os.environ, LD_LIBRARY_PATH=pdir)
    if a.threads:
        env["OMP_NUM_THREADS"] = str(a.threads)
    cmd = [a.piper, "-m", a.voice, "--espeak_data", os.path.join(pdir, "espeak-ng-data"), "--output_raw", "-q"]

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def do_GET(self):
            if self.path in ("/healthz", "/readyz"):
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")
                return
            self.send_error(404)

        def chunk(self, b):
            self.wfile.write(b"%x\r\n" % len(b) + b + b"\r\n")

        def do_POST(self):
            if self.path != "/v1/audio/speech":
                self.send_error(404)
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            text = " ".join(str(body.get("input", "")).split())  # one line: one utterance
            p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
            p.stdin.write(text.encode() + b"\n")
            p.stdin.close()
            self.send_response(200)
            self.send_header("Content-Type", "audio/wav")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            try:
                self.chunk(wav_header(rate))
                while True:
                    b = p.stdout.read1(65536)
                    if not b:
                        break
                    self.chunk(b)
                self.wfile.write(b"0\r\n\r\n")
            finally:
                p.kill()
                p.wait()

    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer.request_queue_size = 1024
    ThreadingHTTPServer(("127.0.0.1", a.port), H).serve_forever()


if __name__ == "__main__":
    main()
