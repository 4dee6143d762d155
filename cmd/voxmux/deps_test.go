package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// depsEnv is a PATH holding only the tools scripts/install-deps.sh uses, with stand-ins for
// dpkg-query (nothing installed, or everything), apt-get (records its calls; fails as if another
// apt held the lock for its first failLock calls), sudo and sleep (no wait).
func depsEnv(t *testing.T, installed bool, failLock int) (env []string, calls string) {
	t.Helper()
	bin := t.TempDir()
	for _, tool := range []string{"bash", "sed", "grep", "dirname", "cat", "id", "mktemp", "rm"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("%s: %v", tool, err)
		}
		if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	calls = filepath.Join(t.TempDir(), "apt-calls")
	status := "deinstall ok config-files"
	if installed {
		status = "install ok installed"
	}
	stubs := map[string]string{
		"dpkg-query": "#!/bin/bash\nprintf '%s' '" + status + "'\n",
		"sudo":       "#!/bin/bash\nexec \"$@\"\n",
		"sleep":      "#!/bin/bash\n",
		"apt-get": `#!/bin/bash
echo "$*" >> "` + calls + `"
n=$(grep -c . "` + calls + `")
if [ "$n" -le ` + strconv.Itoa(failLock) + ` ]; then
  echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 4242 (apt-get)" >&2
  exit 100
fi
`,
	}
	for name, body := range stubs {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return []string{"PATH=" + bin, "HOME=" + t.TempDir()}, calls
}

func runDeps(t *testing.T, env []string, args ...string) (string, error) {
	cmd := exec.Command("../../scripts/install-deps.sh", args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func aptCalls(t *testing.T, calls string) []string {
	b, err := os.ReadFile(calls)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// TestInstallDeps: serving's packages without the tests' ones, no apt when nothing is missing,
// and a wait, bounded, while another apt holds the lock.
func TestInstallDeps(t *testing.T) {
	t.Run("nothing missing runs no apt", func(t *testing.T) {
		env, calls := depsEnv(t, true, 0)
		if out, err := runDeps(t, env, "test"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if c := aptCalls(t, calls); c != nil {
			t.Fatalf("apt-get ran: %q", c)
		}
	})
	t.Run("serving needs no browser", func(t *testing.T) {
		env, calls := depsEnv(t, false, 0)
		if out, err := runDeps(t, env); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		c := aptCalls(t, calls)
		if len(c) != 2 || !strings.Contains(c[0], "update") || !strings.Contains(c[1], "install") {
			t.Fatalf("apt-get calls %q", c)
		}
		for _, want := range []string{"libavcodec-dev", "libespeak-ng-dev", "gcc", "DPkg::Lock::Timeout="} {
			if !strings.Contains(c[1], want) {
				t.Errorf("install lacks %s: %q", want, c[1])
			}
		}
		for _, not := range []string{"chromium", "ffmpeg"} {
			if strings.Contains(c[1], not) {
				t.Errorf("serving installs %s: %q", not, c[1])
			}
		}
	})
	t.Run("the tests add theirs", func(t *testing.T) {
		env, calls := depsEnv(t, false, 0)
		if out, err := runDeps(t, env, "test"); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if c := aptCalls(t, calls); len(c) != 2 || !strings.Contains(c[1], "chromium") || !strings.Contains(c[1], "ffmpeg") {
			t.Fatalf("apt-get calls %q", c)
		}
	})
	t.Run("waits while another apt holds the lock", func(t *testing.T) {
		env, calls := depsEnv(t, false, 3)
		out, err := runDeps(t, env)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		if c := aptCalls(t, calls); len(c) != 5 || !strings.Contains(c[4], "install") {
			t.Fatalf("apt-get calls %q", c)
		}
		if !strings.Contains(out, "waiting") {
			t.Errorf("output does not say it waits:\n%s", out)
		}
	})
	t.Run("gives up after the timeout", func(t *testing.T) {
		env, calls := depsEnv(t, false, 9)
		out, err := runDeps(t, append(env, "VOXMUX_APT_LOCK_TIMEOUT=0"))
		if err == nil || !strings.Contains(out, "VOXMUX_APT_LOCK_TIMEOUT") {
			t.Fatalf("err %v\n%s", err, out)
		}
		if c := aptCalls(t, calls); len(c) != 1 {
			t.Fatalf("apt-get calls %q", c)
		}
	})
}
