# voxmux: `make run` serves a published Piper voice on CPU; `make test` runs every test.
SHELL := /bin/bash
# A go of 1.21 or later on PATH fetches the toolchain go.mod names itself; without one (or with an
# older one, Debian 12's 1.19) scripts/install-go.sh installs that toolchain into third_party/go
# from the Go module proxy. Evaluated where used, after `deps` has installed curl and unzip.
GO ?= $(or $(shell scripts/install-go.sh),go)
BIN := bin/voxmux
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)
ORT_DIR := third_party/onnxruntime
PROTOC_GEN_GO := google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
PROTOC_GEN_GO_GRPC := google.golang.org/grpc/cmd/protoc-gen-go-grpc@v1.6.0
# More flags for run's serve (scripts/test-run-without-go.sh serves on a free port).
SERVE_FLAGS ?=

# Published Piper voices as Go modules at pinned versions (docs/piper.md); `make voices` unpacks them
# into models/voices/ through the go command's module cache.
VOICE_MODULES ?= github.com/amitybell/piper-voice-jenny@v0.0.0-20231118093224-dcf0d49e46b7

.PHONY: run test build deps ort ort-gpu consul proto tiny-model tiny-piper tiny-piper-vits tiny-cosyvoice3 tiny-voxcpm voices vet clean

run: deps ort build voices
	@echo
	@echo "Serving the voice Jenny (Dioco) on http://127.0.0.1:8080 (Ctrl-C stops). Try, in another shell:"
	@echo "  curl -s 127.0.0.1:8080/v1/audio/speech -d '{\"model\":\"en_GB-jenny_dioco-medium\",\"input\":\"Hello world. This is Jenny, served by voxmux.\",\"response_format\":\"wav\",\"stream\":false}' -o out.wav"
	@echo
	$(BIN) serve --config configs/cpu.yaml $(SERVE_FLAGS)

# Installs what is missing (Debian packages, ONNX Runtime, a Consul agent), makes
# models/tiny-cosyvoice3 and models/tiny-voxcpm and runs every test, the Python tests and linter included.
test:
	GO=$(GO) scripts/test.sh

build:
	CGO_ENABLED=1 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/voxmux

# Debian packages the build and serving need (scripts/debian-packages.txt); scripts/test.sh adds
# the tests' own (scripts/debian-packages-test.txt). Waits for another apt's lock; no apt when none is missing.
deps:
	scripts/install-deps.sh

ort:
	scripts/install-onnxruntime.sh $(ORT_DIR)

ort-gpu:
	scripts/install-onnxruntime.sh --gpu $(ORT_DIR)

# A Consul agent for the registration tests, built from the Go module proxy (~7 minutes, once).
consul:
	GO=$(GO) scripts/install-consul.sh third_party/consul

# Regenerates plugin/proto from voxmux.proto (needs protoc: apt-get install protobuf-compiler).
proto:
	GOBIN=$(CURDIR)/bin $(GO) install $(PROTOC_GEN_GO)
	GOBIN=$(CURDIR)/bin $(GO) install $(PROTOC_GEN_GO_GRPC)
	PATH=$(CURDIR)/bin:$$PATH protoc --go_out=. --go_opt=paths=source_relative \
	  --go-grpc_out=. --go-grpc_opt=paths=source_relative plugin/proto/voxmux.proto

# Rebuilds models/tiny (needs Debian's python3-onnx and python3-numpy).
tiny-model:
	/usr/bin/python3 -m scripts.staged.make_tiny models/tiny

# Rebuilds models/tiny-piper, the tiny Piper-format voices the tests use (same Debian packages).
tiny-piper:
	/usr/bin/python3 -m scripts.piper.make_tiny models/tiny-piper

# Rebuilds models/tiny-piper-vits, tiny voices shaped like Piper's VITS export (chunked decoding).
tiny-piper-vits:
	/usr/bin/python3 -m scripts.piper.make_tiny_vits models/tiny-piper-vits

# models/tiny-cosyvoice3: a tiny CosyVoice3 with random weights in the published format
# (models/tiny-cosyvoice3-published), exported as the real one is, with a random 5 s voice bench
# (Debian's python3-torch, python3-onnx, python3-numpy, python3-yaml and zstd). Made again only
# when a script that makes it changes; `make test` runs it before the tests.
CV3_TINY_SCRIPTS := $(wildcard scripts/cosyvoice3/*.py scripts/common/*.py)
tiny-cosyvoice3: models/tiny-cosyvoice3/pipeline.yaml

# pipeline.yaml is written last, so a failed export leaves none and runs again.
models/tiny-cosyvoice3/pipeline.yaml: $(CV3_TINY_SCRIPTS)
	rm -rf models/tiny-cosyvoice3-published models/tiny-cosyvoice3
	/usr/bin/python3 -m scripts.cosyvoice3.make_tiny models/tiny-cosyvoice3-published
	/usr/bin/python3 -m scripts.cosyvoice3.export models/tiny-cosyvoice3-published models/tiny-cosyvoice3 --random-voice bench:5 --chunk-flow

# models/tiny-voxcpm: a tiny VoxCPM 1.5 with random weights in the published format
# (models/tiny-voxcpm-published), exported as the real one is (float32, for the CPU), with a
# random 3 s voice bench (Debian's python3-torch, python3-onnx, python3-numpy). Made again only
# when a script that makes it changes; `make test` runs it before the tests.
VOXCPM_TINY_SCRIPTS := $(wildcard scripts/voxcpm/*.py scripts/common/*.py)
tiny-voxcpm: models/tiny-voxcpm/pipeline.yaml

# pipeline.yaml is written last, so a failed export leaves none and runs again.
models/tiny-voxcpm/pipeline.yaml: $(VOXCPM_TINY_SCRIPTS)
	rm -rf models/tiny-voxcpm-published models/tiny-voxcpm
	/usr/bin/python3 -m scripts.voxcpm.make_tiny models/tiny-voxcpm-published
	/usr/bin/python3 -m scripts.voxcpm.export models/tiny-voxcpm-published models/tiny-voxcpm --dtype float32 --random-voice bench:3

voices: build
	GO=$(GO) $(BIN) voices fetch --dir models/voices $(VOICE_MODULES)

vet:
	$(GO) vet ./...

clean:
	rm -rf bin
