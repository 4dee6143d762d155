package ort

import (
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// telemetryChild marks the test's own child process, which loads ONNX Runtime with HOME and
// TMPDIR pointing at empty folders (the runtime's environment is made once per process).
const telemetryChild = "VOXMUX_TEST_TELEMETRY_CHILD"

// telemetryWait is how long the child keeps the runtime alive: the runtime's telemetry writes
// from a background thread, so a process that exits at once may leave nothing behind on a slow
// machine. With "until", the child waits until something appears under $HOME or the temp folder.
const telemetryWait = "VOXMUX_TEST_TELEMETRY_WAIT"

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
	wait := os.Getenv(telemetryWait)
	if wait == "until" {
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if len(files(t, os.Getenv("HOME"), os.TempDir())) > 0 {
				return
			}
		}
		return
	}
	d, err := time.ParseDuration(wait)
	if err != nil {
		t.Fatalf("%s=%q: %v", telemetryWait, wait, err)
	}
	time.Sleep(d)
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
	run := func(allow bool, wait string) []string {
		home, tmp := t.TempDir(), t.TempDir()
		cmd := exec.Command(os.Args[0], "-test.run=^TestTelemetryChild$", "-test.count=1")
		env := []string{telemetryChild + "=1", "HOME=" + home, "TMPDIR=" + tmp, telemetryWait + "=" + wait}
		if allow {
			env = append(env, TelemetryEnv+"=1")
		}
		for _, kv := range os.Environ() {
			k, _, _ := strings.Cut(kv, "=")
			if k != "HOME" && k != "TMPDIR" && k != TelemetryEnv && k != "ORT_DISABLE_TELEMETRY" &&
				k != "XDG_CACHE_HOME" {
				env = append(env, kv)
			}
		}
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		return files(t, home, tmp)
	}
	// First the check's own check: allowed, the runtime writes, and the time it takes bounds how
	// long the refused run must live to show that it writes nothing.
	start := time.Now()
	wait := 2 * time.Second
	if written := run(true, "until"); len(written) > 0 {
		wait = 2 * time.Since(start)
	} else {
		t.Logf("with %s=1 this runtime wrote nothing in 30 s (its telemetry does not run here); the refused run is checked all the same", TelemetryEnv)
	}
	if written := run(false, wait.String()); len(written) > 0 {
		t.Fatalf("ONNX Runtime wrote %v", written)
	}
}
