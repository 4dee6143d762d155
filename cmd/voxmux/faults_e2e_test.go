package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Fault injection against the real binary: hung instances, clients that never read, signals
// during start-up, and the log format the router and its instances share.

// A hung instance (SIGSTOP) fails its health checks, is killed and replaced; the stream it held is
// cut within seconds, not after request_timeout, and the group serves again.
func TestHungInstanceIsReplaced(t *testing.T) {
	s, admin := startGroups(t, "liveness: {interval: 200ms, timeout: 200ms, failures: 3}\nrequest_timeout: 5m\n", "  - {name: g0, instances: 1}\n")
	v := waitAllReady(t, admin)
	victim := v.Groups[0].Instances[0]
	res := make(chan outcome, 1)
	go func() { res <- speak(s.url, strings.Repeat("This request is on the instance when it hangs. ", 20)) }()
	time.Sleep(300 * time.Millisecond)
	if err := syscall.Kill(victim.PID, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(victim.PID, syscall.SIGKILL)
	select {
	case o := <-res:
		if o.status == 200 && o.complete {
			t.Logf("the request finished before the instance hung (%d bytes)", o.bytes)
		} else {
			t.Logf("the request on the hung instance ended after %v: status %d, %v", o.elapsed, o.status, o.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream on the hung instance was not cut")
	}
	v = waitAllReady(t, admin)
	if back := v.Groups[0].Instances[0]; back.PID == victim.PID || back.Restarts < 1 {
		t.Fatalf("hung instance not replaced: %+v", back)
	}
	if alive(victim.PID) {
		t.Fatalf("the hung process %d still exists", victim.PID)
	}
	if o := speak(s.url, "Served again."); o.status != 200 || !o.complete {
		t.Fatalf("after the replacement: %+v", o)
	}
	if !strings.Contains(s.logs.String(), "health checks in a row failed") {
		t.Error("the kill is not logged with its reason")
	}
}

// A client that never reads its audio holds its slot only until the kernel's buffers are full and
// then write_timeout: a live client queued behind it is served.
func TestNonReadingClientsFreeTheirSlots(t *testing.T) {
	s, admin := startGroups(t, "write_timeout: 1s\nqueue: {size: 4, timeout: 1m}\n", "  - {name: g0, instances: 1, max_inflight: 1}\n")
	waitAllReady(t, admin)
	addr := strings.TrimPrefix(s.url, "http://")
	long := strings.Repeat("A client asks for a long answer and never reads a byte of it. ", 60)
	for i := 0; i < 1; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.(*net.TCPConn).SetReadBuffer(4096)
		body := fmt.Sprintf(`{"input":%q,"response_format":"pcm"}`, long)
		fmt.Fprintf(c, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
	time.Sleep(500 * time.Millisecond)
	o := speak(s.url, "A live client.")
	if o.status != 200 || !o.complete {
		t.Fatalf("live client behind one that never reads: %+v", o)
	}
	if o.elapsed > 30*time.Second {
		t.Fatalf("served only after %v", o.elapsed)
	}
	t.Logf("served after %v", o.elapsed)
}

// Clients that leave while queued give up their places: a live client behind them is queued and
// served, not refused (a full queue of ghosts used to refuse it with 429).
func TestGhostClientsLeaveTheQueue(t *testing.T) {
	s, admin := startGroups(t, "queue: {size: 2, timeout: 1m}\n", "  - {name: g0, instances: 1, max_inflight: 1}\n")
	waitAllReady(t, admin)
	addr := strings.TrimPrefix(s.url, "http://")
	busy := make(chan outcome, 1)
	// 918 characters: within the tiny model's 1024 prompt tokens, and long enough to hold the slot.
	go func() {
		busy <- speak(s.url, strings.Repeat("This request keeps the only slot busy for a while. ", 18))
	}()
	time.Sleep(300 * time.Millisecond)
	for i := 0; i < 2; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		body := fmt.Sprintf(`{"input":"A ghost number %d.","response_format":"pcm"}`, i)
		fmt.Fprintf(c, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		time.Sleep(100 * time.Millisecond)
		c.Close()
	}
	time.Sleep(300 * time.Millisecond)
	if v := groupsView(t, admin); v.QueueLength != 0 {
		t.Fatalf("%d ghosts still queued", v.QueueLength)
	}
	if o := speak(s.url, "A live client."); o.status != 200 || !o.complete {
		t.Fatalf("live client behind two ghosts: %+v", o)
	}
	if o := <-busy; o.status != 200 || !o.complete {
		t.Fatalf("the busy request: %+v", o)
	}
	if n := strings.Count(s.logs.String(), `"status":499`); n != 2 {
		t.Fatalf("%d requests logged as left by their client, want 2", n)
	}
}

// SIGTERM while the instances start shuts serve down cleanly (exit 0), and serve leaves no
// socket folder behind.
func TestSIGTERMDuringStartUp(t *testing.T) {
	listen := freePort(t)
	tmp := t.TempDir()
	cmd := exec.Command(voxmuxBinary(t), "serve", "--config", writeConfig(t, listen, "  - name: g0\n    instances: 2\n"))
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	logs := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(logs.String(), `"msg":"listening"`) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("serve did not start:\n%s", logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve after SIGTERM during start-up: %v\n%s", err, logs.String())
		}
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("serve did not exit:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), `"msg":"ready"`) {
		t.Log("an instance was ready before the signal; the clean exit is checked anyway")
	}
	left, _ := filepath.Glob(filepath.Join(tmp, "*"))
	if len(left) != 0 {
		t.Fatalf("left behind in TMPDIR: %v", left)
	}
}

// The router's lines and its instances' (relayed by go-plugin) share one format: slog's JSON with
// time, level and msg, each instance's lines naming it; durations are strings.
func TestLogsShareOneFormat(t *testing.T) {
	listen := freePort(t)
	s := startServeArgs(t, writeConfig(t, listen, "  - name: g0\n    instances: 1\n"), listen, []string{"--log-level", "debug", "--log-format", "json"})
	if o := speak(s.url, "Hello."); o.status != 200 {
		t.Fatalf("speech: %+v", o)
	}
	relayed := 0
	sc := bufio.NewScanner(strings.NewReader(s.logs.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e map[string]any
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("not a JSON line: %s", sc.Text())
		}
		if e["time"] == nil || e["msg"] == nil || e["level"] == nil || e["@message"] != nil || e["@level"] != nil {
			t.Fatalf("line in another dialect: %s", sc.Text())
		}
		if e["instance"] == "g0/0" && e["logger"] != nil {
			relayed++
		}
		for k, v := range e {
			if k == "in" || k == "uptime" {
				if _, ok := v.(string); !ok {
					t.Errorf("duration %s written as %v", k, v)
				}
			}
		}
	}
	if relayed == 0 {
		t.Fatalf("no relayed instance line at debug level:\n%s", s.logs.String())
	}
}
