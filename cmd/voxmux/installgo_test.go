package main

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// fakeToolchainProxy lays out, under a folder served as file://, the Go module proxy's answers
// for golang.org/toolchain at version goVersion: a module zip whose bin/go prints that version,
// and the checksum database's line for it (wrongHash: a hash that does not match).
func fakeToolchainProxy(t *testing.T, goVersion string, wrongHash bool) string {
	t.Helper()
	arch := map[string]string{"amd64": "amd64", "arm64": "arm64"}[runtime.GOARCH]
	if arch == "" {
		t.Skipf("no toolchain for %s", runtime.GOARCH)
	}
	ver := "v0.0.1-go" + goVersion + ".linux-" + arch
	prefix := "golang.org/toolchain@" + ver + "/"
	files := map[string]string{
		"bin/go":                   "#!/bin/sh\necho go version go" + goVersion + " linux/" + arch + "\n",
		"bin/gofmt":                "#!/bin/sh\n",
		"pkg/tool/linux_x/compile": "#!/bin/sh\n",
		"VERSION":                  "go" + goVersion + "\n",
		"src/_go.mod":              "module std\n",
		"src/cmd/_go.mod":          "module cmd\n",
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var lines []string
	// The module hash (dirhash's h1) lists the files in the order of their names.
	for _, name := range slices.Sorted(maps.Keys(files)) {
		w, err := zw.Create(prefix + name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(files[name]))
		lines = append(lines, fmt.Sprintf("%x  %s\n", sha256.Sum256([]byte(files[name])), prefix+name))
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	h := sha256.Sum256([]byte(strings.Join(lines, "")))
	if wrongHash {
		h[0] ^= 1
	}
	sum := "h1:" + base64.StdEncoding.EncodeToString(h[:])
	root := t.TempDir()
	for p, body := range map[string][]byte{
		"golang.org/toolchain/@v/" + ver + ".zip":                 buf.Bytes(),
		"sumdb/sum.golang.org/lookup/golang.org/toolchain@" + ver: []byte("123\ngolang.org/toolchain " + ver + " " + sum + "\ngolang.org/toolchain " + ver + "/go.mod h1:x=\n"),
	} {
		p = filepath.Join(root, p)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return "file://" + root
}

// goEnv is a PATH with the tools scripts/install-go.sh uses and, when goVersion is not "", a go
// command of that version.
func goEnv(t *testing.T, goVersion, proxy string) []string {
	t.Helper()
	bin := t.TempDir()
	for _, tool := range []string{"bash", "sed", "grep", "dirname", "mktemp", "rm", "curl", "awk", "unzip", "find", "sort", "tr",
		"xargs", "sha256sum", "cut", "base64", "chmod", "mkdir", "mv", "uname", "cat", "env", "cp", "sh"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("%s: %v", tool, err)
		}
		if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	if goVersion != "" {
		os.WriteFile(filepath.Join(bin, "go"), []byte("#!/bin/sh\necho go version go"+goVersion+" linux/amd64\n"), 0o755)
	}
	return []string{"PATH=" + bin, "HOME=" + t.TempDir(), "VOXMUX_GOPROXY=" + proxy}
}

// `make run` finds a Go to build with on a machine without one, or with Debian 12's 1.19: the
// toolchain go.mod names, installed from the Go module proxy and checked against the checksum
// database; a go of 1.21 or later (which fetches that toolchain itself) is used as it is.
func TestInstallGo(t *testing.T) {
	mod, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go ([0-9.]+)$`).FindSubmatch(mod)
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	want := string(m[1])
	run := func(env []string, dir string) (string, string, error) {
		cmd := exec.Command("../../scripts/install-go.sh", dir)
		cmd.Env = env
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		return strings.TrimSpace(out.String()), errb.String(), err
	}
	proxy := fakeToolchainProxy(t, want, false)
	for _, have := range []string{"", "1.19.8"} {
		dir := filepath.Join(t.TempDir(), "go")
		out, stderr, err := run(goEnv(t, have, proxy), dir)
		if err != nil || out != dir+"/bin/go" {
			t.Fatalf("go %q on PATH: printed %q, %v\n%s", have, out, err, stderr)
		}
		v, err := exec.Command(out, "version").Output()
		if err != nil || !strings.Contains(string(v), "go"+want+" ") {
			t.Fatalf("the installed go says %q, %v", v, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "VERSION")); err != nil {
			t.Fatalf("the toolchain's files: %v", err)
		}
		// Go's tree keeps its go.mod files, which the module zip holds as _go.mod, so that
		// voxmux's module (and `go vet ./...`) stops at third_party/go/src.
		for _, m := range []string{"src/go.mod", "src/cmd/go.mod"} {
			if b, err := os.ReadFile(filepath.Join(dir, m)); err != nil || !strings.HasPrefix(string(b), "module ") {
				t.Fatalf("%s: %q, %v", m, b, err)
			}
		}
		// Installed once: the next call finds it, and gives back go.mod files an older install lacks.
		os.Remove(filepath.Join(dir, "src/go.mod"))
		os.Remove(filepath.Join(dir, "src/cmd/go.mod"))
		if out2, stderr, err := run(goEnv(t, have, "file:///nonexistent"), dir); err != nil || out2 != out {
			t.Fatalf("second call: %q, %v\n%s", out2, err, stderr)
		}
		for _, m := range []string{"src/go.mod", "src/cmd/go.mod"} {
			if _, err := os.Stat(filepath.Join(dir, m)); err != nil {
				t.Fatalf("second call: %v", err)
			}
		}
	}
	if out, stderr, err := run(goEnv(t, "1.22.0", "file:///nonexistent"), t.TempDir()); err != nil || out != "go" {
		t.Fatalf("go 1.22 on PATH: printed %q, %v\n%s", out, err, stderr)
	}
	dir := filepath.Join(t.TempDir(), "go")
	_, stderr, err := run(goEnv(t, "", fakeToolchainProxy(t, want, true)), dir)
	if err == nil || !strings.Contains(stderr, "checksum database says") {
		t.Fatalf("a toolchain whose hash does not match: %v\n%s", err, stderr)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatal("a toolchain whose hash does not match was installed")
	}
}
