#!/usr/bin/env bash
# What `make test` runs: installs what the tests need and makes the tiny CosyVoice3 export, then
# runs them all. The Consul agent is built from source (minutes), so it builds in the background
# while the rest runs; the tests that need it run last and fail, rather than skip, if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
scripts/install-deps.sh test
scripts/install-onnxruntime.sh third_party/onnxruntime
consul_log=$(mktemp)
scripts/install-consul.sh > "$consul_log" 2>&1 &
consul_pid=$!
trap 'kill $consul_pid 2>/dev/null || true' EXIT
consul_tests='WithRealConsulAgent|WithRealAgent'
# The CosyVoice3 tests run the exporter's output (models/tiny-cosyvoice3): made here, so they must
# not skip.
${MAKE:-make} --no-print-directory tiny-cosyvoice3
# The VoxCPM tests run its exporter's output (models/tiny-voxcpm) likewise.
${MAKE:-make} --no-print-directory tiny-voxcpm
# The Python side: its linter and its tests (shared layers, tiny checkpoint makers, the exporter's
# voice features), with the Debian interpreter the scripts run under (setup.cfg configures both).
/usr/bin/python3 -m flake8 scripts instance
/usr/bin/python3 -m pytest -q scripts/tests
# `make run` on a machine without Go: every go taken off PATH, the Makefile builds with the toolchain
# scripts/install-go.sh installs into third_party/go, and the server answers a speech request.
scripts/test-run-without-go.sh
export VOXMUX_REQUIRE_TINY_COSYVOICE3=1
export VOXMUX_REQUIRE_TINY_VOXCPM=1
$GO vet ./...
# The race detector where the concurrency lives; the end-to-end tests (real processes) and the
# load generator run without it, which halves their build on a fresh 2-core machine.
race_pkgs=$($GO list ./... | grep -v -e '/cmd/' -e '/bench$')
$GO test -race -count=1 -timeout 15m -skip "$consul_tests" $race_pkgs
$GO test -count=1 -timeout 15m ./cmd/... ./bench/
echo "test.sh: waiting for the Consul agent build ($consul_log)"
if ! wait $consul_pid; then
  cat "$consul_log"
  exit 1
fi
trap - EXIT
VOXMUX_REQUIRE_CONSUL=1 $GO test -race -count=1 -timeout 10m -run "$consul_tests" ./health/
