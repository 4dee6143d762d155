package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// procStatus reads a field of /proc/PID/status given in kB (VmRSS, VmHWM), in bytes.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte(field+":")); ok {
			var kb int64
			if _, err := fmt.Sscan(string(v), &kb); err != nil {
				t.Fatalf("/proc/%d/status %s: %v", pid, field, err)
			}
			return kb << 10
		}
	}
	t.Skipf("/proc/%d/status has no %s", pid, field)
	return 0
}

// peakRSS follows a process's resident memory: its kernel high-water mark (VmHWM), reset when
// /proc/PID/clear_refs takes "5", else the largest of samples every few milliseconds.
type peakRSS struct {
	t       *testing.T
	pid     int
	reset   bool
	sampled atomic.Int64
	stop    chan struct{}
	done    chan struct{}
}

func watchRSS(t *testing.T, pid int) *peakRSS {
	p := &peakRSS{t: t, pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	p.reset = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0) == nil
	p.sampled.Store(procStatus(t, pid, "VmRSS"))
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			if err != nil {
				continue
			}
			if i := bytes.Index(b, []byte("VmRSS:")); i >= 0 {
				var kb int64
				fmt.Sscan(string(b[i+len("VmRSS:"):]), &kb)
				if kb<<10 > p.sampled.Load() {
					p.sampled.Store(kb << 10)
				}
			}
		}
	}()
	return p
}

// peak stops the sampling and returns the peak since watchRSS.
func (p *peakRSS) peak() int64 {
	close(p.stop)
	<-p.done
	if p.reset {
		return max(p.sampled.Load(), procStatus(p.t, p.pid, "VmHWM"))
	}
	return p.sampled.Load()
}

// postBody sends a POST of size bytes to path at addr, writing the body while it reads the answer,
// and returns the answer's status.
func postBody(addr, path, key string, size int) (int, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	auth := ""
	if key != "" {
		auth = "Authorization: Bearer " + key + "\r\n"
	}
	if _, err := fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, auth, size); err != nil {
		return 0, err
	}
	go func() {
		chunk := bytes.Repeat([]byte("a"), 256<<10)
		for left := size; left > 0; left -= len(chunk) {
			if _, err := c.Write(chunk[:min(left, len(chunk))]); err != nil {
				return // the server closed the connection
			}
		}
	}()
	c.SetReadDeadline(time.Now().Add(30 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// A client cannot take the router's memory with bodies it may not send: sixteen concurrent
// unauthenticated 50 MB requests, sixteen unauthenticated ones within the largest route's limit
// (where only the missing key stops the read) and sixteen authenticated ones over their route's
// limit leave the router's resident memory, at its peak while they run and after, within 50 MB of
// what it was idle. Its bodies are refused unread, so there is nothing to hold on to.
func TestLargeBodiesLeaveRouterMemoryAlone(t *testing.T) {
	const key, clients, slack = "k-body-memory", 16, 50_000_000
	s := serveWithKey(t, "VOXMUX_TEST_BODY_KEY", key)
	addr := s.url[len("http://"):]
	pid := s.cmd.Process.Pid
	// One request served first, so that idle is the memory of a router that has answered.
	if resp, body := speechReq(t, s.url, key, `{"input":"hello","response_format":"pcm"}`); resp.StatusCode != 200 {
		t.Fatalf("speech: %d %s", resp.StatusCode, body)
	}
	time.Sleep(time.Second)
	idle := procStatus(t, pid, "VmRSS")

	// The clip route's limit: a clip of voices.max_upload_bytes (20 MiB by default) in base64, plus 1 MiB.
	withinUpload := 20<<20/3*4 + 1<<20 - 1<<16
	for _, batch := range []struct {
		name, key string
		size      int
		paths     []string
		want      int
	}{
		{"unauthenticated 50 MB", "", 50_000_000, []string{"/v1/audio/speech", "/v1/audio/voices"}, http.StatusUnauthorized},
		{"unauthenticated within the clip route's limit", "", withinUpload, []string{"/v1/audio/voices"}, http.StatusUnauthorized},
		{"authenticated 50 MB", key, 50_000_000, []string{"/v1/audio/speech", "/v1/audio/voices"}, http.StatusRequestEntityTooLarge},
		{"authenticated over the speech route's limit", key, withinUpload, []string{"/v1/audio/speech"}, http.StatusRequestEntityTooLarge},
	} {
		watch := watchRSS(t, pid)
		var wg sync.WaitGroup
		status := make([]int, clients)
		errs := make([]error, clients)
		for i := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				status[i], errs[i] = postBody(addr, batch.paths[i%len(batch.paths)], batch.key, batch.size)
			}()
		}
		wg.Wait()
		peak := watch.peak()
		time.Sleep(500 * time.Millisecond)
		after := procStatus(t, pid, "VmRSS")
		t.Logf("%d × %s (%d bytes): router RSS idle %.1f MB, peak %.1f MB, after %.1f MB (peak from %s)",
			clients, batch.name, batch.size, float64(idle)/1e6, float64(peak)/1e6, float64(after)/1e6,
			map[bool]string{true: "VmHWM", false: "samples every 5 ms"}[watch.reset])
		for i := range clients {
			if errs[i] != nil || status[i] != batch.want {
				t.Errorf("%s, client %d: status %d, %v; want %d", batch.name, i, status[i], errs[i], batch.want)
			}
		}
		if peak-idle > slack || after-idle > slack {
			t.Fatalf("%d × %s: the router's RSS went from %s idle to %s at its peak and %s after; the bound is idle + 50 MB",
				clients, batch.name, mb(idle), mb(peak), mb(after))
		}
	}
	if resp, body := speechReq(t, s.url, key, `{"input":"hello","response_format":"pcm"}`); resp.StatusCode != 200 {
		t.Fatalf("speech after the large bodies: %d %s", resp.StatusCode, body)
	}
}

func mb(n int64) string { return strconv.FormatFloat(float64(n)/1e6, 'f', 1, 64) + " MB" }
