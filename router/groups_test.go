package router

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// stateMember is a supervised instance whose state the test sets.
type stateMember struct {
	mu       sync.Mutex
	state    tts.State
	ch       chan struct{}
	restarts int
}

func newStateMember(s tts.State) *stateMember {
	return &stateMember{state: s, ch: make(chan struct{})}
}

func (f *stateMember) Synthesize(context.Context, tts.Request, func(tts.Chunk) error) error {
	return nil
}
func (f *stateMember) Status() tts.Status {
	f.mu.Lock()
	defer f.mu.Unlock()
	return tts.Status{State: f.state}
}
func (f *stateMember) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ch
}
func (f *stateMember) Restart(context.Context) error {
	f.mu.Lock()
	f.restarts++
	f.mu.Unlock()
	return nil
}
func (f *stateMember) set(s tts.State) {
	f.mu.Lock()
	f.state = s
	close(f.ch)
	f.ch = make(chan struct{})
	f.mu.Unlock()
}
func (f *stateMember) restarted() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.restarts
}

func twoGroups(t *testing.T, a, b *stateMember) *Pool {
	pool := NewPool(Model{Name: "tiny", SampleRate: 24000, Voices: []string{"default"}}, QueueOptions{Size: 1})
	for i, m := range []*stateMember{a, b} {
		g := &Group{Name: fmt.Sprintf("g%d", i)}
		g.Backends = []*Backend{{Name: g.Name + "/0", Synth: m, Member: m, Capacity: 1}}
		pool.AddGroup(g)
	}
	return pool
}

// A rolling restart while the other group is drained answers at once (the drained group will not
// come back by itself) and restarts nothing.
func TestRollingRestartWithADrainedGroup(t *testing.T) {
	a, b := newStateMember(tts.StateReady), newStateMember(tts.StateReady)
	pool := twoGroups(t, a, b)
	if err := pool.Group("g1").Drain(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	err := pool.RollingRestart(ctx, time.Second, func(string, string) {})
	if !errors.Is(err, ErrLastReadyGroup) || time.Since(start) > time.Second {
		t.Fatalf("after %v: %v", time.Since(start), err)
	}
	if a.restarted()+b.restarted() != 0 {
		t.Fatalf("restarted %d and %d", a.restarted(), b.restarted())
	}
	// A drained group restarted stays drained.
	if err := pool.Group("g1").Restart(ctx, time.Second, false); err != nil {
		t.Fatal(err)
	}
	if s := pool.Group("g1").State(); s != tts.StateDraining {
		t.Fatalf("drained group after its restart: %s", s)
	}
}

// A rolling restart whose caller leaves stops: it does not restart the groups later, when the
// group it waited for comes back.
func TestAbandonedRollingRestartStops(t *testing.T) {
	a, b := newStateMember(tts.StateReady), newStateMember(tts.StateRestarting)
	pool := twoGroups(t, a, b)
	admin := NewAdmin(AdminOptions{Pool: pool, Token: "tok", DrainTimeout: time.Second})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go admin.Serve(ln)
	t.Cleanup(func() { admin.Shutdown(context.Background()) })
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "POST /admin/restart HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok\r\nContent-Length: 0\r\n\r\n")
	time.Sleep(500 * time.Millisecond) // g0 waits for g1
	c.Close()
	time.Sleep(500 * time.Millisecond)
	b.set(tts.StateReady)
	time.Sleep(time.Second)
	if a.restarted()+b.restarted() != 0 {
		t.Fatalf("an abandoned rolling restart restarted g0 %d and g1 %d times", a.restarted(), b.restarted())
	}
}

// An operator's drain of the last ready group is refused (409) unless forced: it would stop all
// traffic.
func TestDrainOfTheLastReadyGroupIsRefused(t *testing.T) {
	a, b := newStateMember(tts.StateReady), newStateMember(tts.StateReady)
	pool := twoGroups(t, a, b)
	admin := NewAdmin(AdminOptions{Pool: pool, Token: "tok", DrainTimeout: time.Second})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go admin.Serve(ln)
	t.Cleanup(func() { admin.Shutdown(context.Background()) })
	drain := func(path string) int {
		req, _ := http.NewRequest("POST", "http://"+ln.Addr().String()+path, nil)
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if s := drain("/admin/groups/g1/drain"); s != 200 {
		t.Fatalf("drain of g1 with g0 ready: %d", s)
	}
	if s := drain("/admin/groups/g0/drain"); s != http.StatusConflict {
		t.Fatalf("drain of the last ready group: %d, want 409", s)
	}
	if s := pool.Group("g0").State(); s != tts.StateReady {
		t.Fatalf("the refused group is %s", s)
	}
	if s := drain("/admin/groups/g0/drain?force=true"); s != 200 {
		t.Fatalf("forced drain: %d", s)
	}
}
