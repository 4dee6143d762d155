package ort

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

// telemetryChild marks the test's own child process, which loads ONNX Runtime with HOME and
// TMPDIR pointing at empty folders (the runtime's environment is made once per process).
const telemetryChild = "VOXMUX_TEST_TELEMETRY_CHILD"

func TestTelemetryChild(t *testing.T) {
	if os.Getenv(telemetryChild) == "" {
		t.Skip("run by TestRuntimeWritesNothingOutsideItsModel")
	}
	lib, err := FindLibrary()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(tts.LoadConfig{ORTLibrary: lib, Provider: "cpu"}, 0, Options{}); err != nil {
		t.Fatal(err)
	}
}

// files lists what is under dirs.
func files(t *testing.T, dirs ...string) []string {
	var out []string
	for _, d := range dirs {
		filepath.WalkDir(d, func(p string, e fs.DirEntry, err error) error {
			if err == nil && !e.IsDir() {
				out = append(out, p)
			}
			return nil
		})
	}
	return out
}

// An instance's ONNX Runtime sends no telemetry and writes nothing under $HOME or the temp folder
// (the runtime's telemetry writes a device id and an event queue under
// $HOME/.cache/Microsoft/DeveloperTools and a mat-debug-<pid>.log in the temp folder), unless
// VOXMUX_ORT_TELEMETRY=1 allows it.
func TestRuntimeWritesNothingOutsideItsModel(t *testing.T) {
	if _, err := FindLibrary(); err != nil {
		t.Fatal(err)
	}
	run := func(allow bool) []string {
		home, tmp := t.TempDir(), t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestTelemetryChild$", "-test.count=1")
		env := []string{telemetryChild + "=1", "HOME=" + home, "TMPDIR=" + tmp}
		if allow {
			env = append(env, TelemetryEnv+"=1")
		}
		for _, kv := range os.Environ() {
			k, _, _ := strings.Cut(kv, "=")
			if k != "HOME" && k != "TMPDIR" && k != TelemetryEnv && k != "ORT_DISABLE_TELEMETRY" {
				env = append(env, kv)
			}
		}
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return files(t, home, tmp)
	}
	if written := run(false); len(written) > 0 {
		t.Fatalf("ONNX Runtime wrote %v", written)
	}
	// The check above sees the files the runtime writes when allowed to.
	if written := run(true); len(written) == 0 {
		t.Fatalf("with %s=1 the runtime wrote nothing: the test no longer sees its telemetry", TelemetryEnv)
	}
}
