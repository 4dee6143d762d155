package router

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countingListener counts the bytes the server reads from its connections.
type countingListener struct {
	net.Listener
	n atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, n: &l.n}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// serveCounting runs a Server that takes the API key "k" and clips up to 20 MiB, on a listener
// that counts what it reads.
func serveCounting(t *testing.T) (string, *countingListener) {
	t.Helper()
	pool := NewPool(Model{Name: "tiny", SampleRate: 24000, Voices: []string{"default"}}, QueueOptions{})
	pool.Add(ready("a", &fakeSynth{chunks: 1}, 4))
	srv := New(Options{Pool: pool, MaxInputChars: 50, RequestTimeout: time.Minute, WriteTimeout: 10 * time.Second,
		APIKeys: map[string]struct{}{"k": {}}, MaxUploadBytes: 20 << 20})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	go srv.Serve(cl)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return ln.Addr().String(), cl
}

// sendBody sends a POST of size bytes to path on c, the body written while the answer is read, and
// returns the answer's status.
func sendBody(t *testing.T, c net.Conn, br *bufio.Reader, path, key string, size int) int {
	t.Helper()
	auth := ""
	if key != "" {
		auth = "Authorization: Bearer " + key + "\r\n"
	}
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", path, auth, size)
	go func() {
		chunk := make([]byte, 64<<10)
		for left := size; left > 0; left -= len(chunk) {
			if _, err := c.Write(chunk[:min(left, len(chunk))]); err != nil {
				return // the server closed the connection
			}
		}
	}()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("%s %d bytes: %v", path, size, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// A body is read only after its request passed the API key and the route's limit: sixteen
// concurrent unauthenticated 40 MB requests, each within the largest limit of any route, are
// answered 401 with a few KiB of each read, and an authenticated body over its route's limit is
// 413 unread. A small refused body is read and dropped so the connection carries on.
func TestBodyIsReadOnlyAfterAuthAndLimit(t *testing.T) {
	addr, cl := serveCounting(t)
	const clients, size = 16, 40 << 20
	var wg sync.WaitGroup
	status := make([]int, clients)
	for i := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			path := "/v1/audio/speech"
			if i%2 == 1 {
				path = "/v1/audio/voices"
			}
			status[i] = sendBody(t, c, bufio.NewReader(c), path, "", size)
		}()
	}
	wg.Wait()
	for i, s := range status {
		if s != http.StatusUnauthorized {
			t.Fatalf("client %d: status %d, want 401", i, s)
		}
	}
	if n := cl.n.Load(); n > clients*(1<<20) {
		t.Fatalf("the server read %d MiB of unauthenticated bodies", n>>20)
	}

	// Over the speech route's limit (1 MiB on a model that does not clone), with a valid key.
	before := cl.n.Load()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if s := sendBody(t, c, bufio.NewReader(c), "/v1/audio/speech", "k", 30<<20); s != http.StatusRequestEntityTooLarge {
		t.Fatalf("30 MiB speech body: status %d, want 413", s)
	}
	if n := cl.n.Load() - before; n > 1<<20 {
		t.Fatalf("the server read %d KiB of a body over the route's limit", n>>10)
	}

	// A small refused body leaves the connection usable.
	c2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	br := bufio.NewReader(c2)
	if s := sendBody(t, c2, br, "/v1/audio/speech", "", 100<<10); s != http.StatusUnauthorized {
		t.Fatalf("small unauthenticated body: status %d", s)
	}
	body := `{"input":"hi","response_format":"pcm"}`
	fmt.Fprintf(c2, "POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("the request after a refused body: status %d: %s", resp.StatusCode, strings.TrimSpace(string(b)))
	}
}
