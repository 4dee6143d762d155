package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// fakeProc is a Stopper whose exit each test decides.
type fakeProc struct {
	exited, killed atomic.Bool
	status         atomic.Value // string
}

func (p *fakeProc) Stop()        { p.exited.Store(true) }
func (p *fakeProc) Kill()        { p.killed.Store(true); p.die("signal: killed") }
func (p *fakeProc) Exited() bool { return p.exited.Load() }
func (p *fakeProc) PID() int     { return 42 }
func (p *fakeProc) ExitStatus() string {
	s, _ := p.status.Load().(string)
	return s
}
func (p *fakeProc) die(status string) { p.status.Store(status); p.exited.Store(true) }

// logRecords keeps the supervisor's log records for inspection.
type logRecords struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecords) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	return nil
}
func (l *logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecords) WithGroup(string) slog.Handler      { return l }

// attrs returns the value of key in every record with message msg.
func (l *logRecords) attrs(msg, key string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.recs {
		if r.Message != msg {
			continue
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == key {
				out = append(out, a.Value.String())
			}
			return true
		})
	}
	return out
}

// fakeLauncher launches fake processes; each launch gets the next fakeInstance from mk.
type fakeLauncher struct {
	mu    sync.Mutex
	procs []*fakeProc
	mk    func(i int) *tts.MockInstance
}

func (f *fakeLauncher) launch(context.Context, LaunchConfig) (Instance, Stopper, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := &fakeProc{}
	f.procs = append(f.procs, p)
	return f.mk(len(f.procs) - 1), p, nil
}

func (f *fakeLauncher) proc(i int) *fakeProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	if i >= len(f.procs) {
		return nil
	}
	return f.procs[i]
}

func (f *fakeLauncher) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.procs)
}

func okInstance() *tts.MockInstance {
	return &tts.MockInstance{
		LoadF:       func(context.Context, tts.LoadConfig) (tts.Info, error) { return tts.Info{}, nil },
		SynthesizeF: func(context.Context, tts.Request, func(tts.Chunk) error) error { return nil },
		HealthF:     func(context.Context) (tts.Health, error) { return tts.Health{Ready: true}, nil },
	}
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func runMember(t *testing.T, opts Backoff, fl *fakeLauncher) (*Member, *logRecords) {
	t.Helper()
	logs := &logRecords{}
	m := NewMember(MemberSpec{Name: "g/0"}, opts, fl.launch, slog.New(logs))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { m.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return m, logs
}

// After a healthy run of ResetAfter, a crash is retried after the initial delay again, not after
// the doubled delay of earlier crashes.
func TestBackoffResetsAfterHealthyRun(t *testing.T) {
	fl := &fakeLauncher{mk: func(int) *tts.MockInstance { return okInstance() }}
	m, logs := runMember(t, Backoff{Initial: 10 * time.Millisecond, Max: time.Second, StartTimeout: time.Second, ResetAfter: time.Second}, fl)
	ready := func(n int) func() bool {
		return func() bool { return fl.count() == n && m.Status().State == tts.StateReady }
	}
	// Three quick crashes: 10, 20, 40 ms.
	for i := 0; i < 3; i++ {
		waitFor(t, "ready", 5*time.Second, ready(i+1))
		fl.proc(i).die("exit status 1")
	}
	waitFor(t, "ready", 5*time.Second, ready(4))
	time.Sleep(1200 * time.Millisecond) // a healthy run
	fl.proc(3).die("signal: killed")
	waitFor(t, "ready", 5*time.Second, ready(5))
	got := logs.attrs("instance restarting", "in")
	want := []string{"10ms", "20ms", "40ms", "10ms"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("restart delays %v, want %v", got, want)
	}
	if s := m.Status(); s.Restarts != 4 {
		t.Fatalf("restarts %d", s.Restarts)
	}
}

// A process that stops answering its health checks is killed and relaunched; the request in
// flight on it fails at once with a DiedError that says why, and the death is logged with the
// request's ID.
func TestHungInstanceIsKilledAndReplaced(t *testing.T) {
	var hang atomic.Bool
	started := make(chan struct{}, 1)
	fl := &fakeLauncher{mk: func(i int) *tts.MockInstance {
		f := okInstance()
		if i == 0 {
			f.HealthF = func(ctx context.Context) (tts.Health, error) {
				if hang.Load() {
					<-ctx.Done()
					return tts.Health{}, ctx.Err()
				}
				return tts.Health{Ready: true}, nil
			}
			f.SynthesizeF = func(ctx context.Context, req tts.Request, _ func(tts.Chunk) error) error {
				if req.ID == "warmup" {
					return nil
				}
				started <- struct{}{}
				<-ctx.Done() // the stream stalls like a stopped process's
				return ctx.Err()
			}
		}
		return f
	}}
	m, logs := runMember(t, Backoff{Initial: 10 * time.Millisecond, Max: time.Second, StartTimeout: time.Second,
		Liveness: Liveness{Interval: 30 * time.Millisecond, Timeout: 30 * time.Millisecond, Failures: 3}}, fl)
	waitFor(t, "ready", 5*time.Second, func() bool { return m.Status().State == tts.StateReady })
	res := make(chan error, 1)
	go func() {
		res <- m.Synthesize(context.Background(), tts.Request{ID: "req-1"}, func(tts.Chunk) error { return nil })
	}()
	<-started
	hang.Store(true)
	var err error
	select {
	case err = <-res:
	case <-time.After(5 * time.Second):
		t.Fatal("the request on the hung instance was not cut")
	}
	var died *DiedError
	if !errors.As(err, &died) || !strings.Contains(err.Error(), "health checks") {
		t.Fatalf("request error %v (%T), want a DiedError naming the health checks", err, err)
	}
	// The supervisor cuts the hung instance's streams and kills it; the request may return first.
	waitFor(t, "the hung process killed", 5*time.Second, func() bool { return fl.proc(0).killed.Load() })
	waitFor(t, "a new process", 5*time.Second, func() bool { return fl.count() == 2 && m.Status().State == tts.StateReady })
	if ids := logs.attrs("instance died", "request_ids"); len(ids) != 1 || !strings.Contains(ids[0], "req-1") {
		t.Fatalf("death log request_ids %v", ids)
	}
}

// A request during which the process exits fails with a DiedError naming the exit status; a
// request that finds the process already gone is ErrNotReady (another instance may serve it).
func TestDeathDuringRequestIsNotRetryable(t *testing.T) {
	var fl *fakeLauncher
	fl = &fakeLauncher{mk: func(i int) *tts.MockInstance {
		f := okInstance()
		f.SynthesizeF = func(ctx context.Context, req tts.Request, _ func(tts.Chunk) error) error {
			if req.ID == "poison" {
				fl.proc(i).die("signal: segmentation fault")
				return &tts.Error{Kind: tts.ErrNotReady, Msg: "error reading from server: EOF"}
			}
			return nil
		}
		return f
	}}
	m, logs := runMember(t, Backoff{Initial: time.Hour, Max: time.Hour, StartTimeout: time.Second}, fl)
	waitFor(t, "ready", 5*time.Second, func() bool { return m.Status().State == tts.StateReady })
	err := m.Synthesize(context.Background(), tts.Request{ID: "poison"}, func(tts.Chunk) error { return nil })
	var died interface{ InstanceDied() bool }
	if !errors.As(err, &died) || !strings.Contains(err.Error(), "segmentation fault") {
		t.Fatalf("poison request: %v (%T)", err, err)
	}
	err = m.Synthesize(context.Background(), tts.Request{ID: "next"}, func(tts.Chunk) error { return nil })
	var ie *tts.Error
	if !errors.As(err, &ie) || ie.Kind != tts.ErrNotReady || errors.As(err, &died) {
		t.Fatalf("request to the dead process: %v (%T), want ErrNotReady", err, err)
	}
	waitFor(t, "death log", 5*time.Second, func() bool { return len(logs.attrs("instance died", "why")) == 1 })
	if why := logs.attrs("instance died", "why")[0]; !strings.Contains(why, "segmentation fault") {
		t.Fatalf("death logged as %q", why)
	}
}

// The instance's environment is built whole: a socket folder or log level set in the router's
// environment does not leak into it (Launch sets both explicitly).
func TestInstanceEnvDropsPluginAndLogVariables(t *testing.T) {
	env := InstanceEnv([]string{"PLUGIN_UNIX_SOCKET_DIR=/tmp/elsewhere", LogLevelEnv + "=debug", "PATH=/bin"}, nil)
	for _, kv := range env {
		if strings.HasPrefix(kv, "PLUGIN_UNIX_SOCKET_DIR=") || strings.HasPrefix(kv, LogLevelEnv+"=") {
			t.Fatalf("%s inherited: %v", kv, env)
		}
	}
}

// A process killed with requests in flight (kill -9: the streams break at once, and the requests
// learn of the exit before the supervisor's next look) logs the id of every one of them.
func TestDeathLogNamesEveryRequestInFlight(t *testing.T) {
	var fl *fakeLauncher
	broken := make(chan struct{})
	var started sync.WaitGroup
	fl = &fakeLauncher{mk: func(i int) *tts.MockInstance {
		f := okInstance()
		f.SynthesizeF = func(ctx context.Context, req tts.Request, _ func(tts.Chunk) error) error {
			if req.ID == "warmup" {
				return nil
			}
			started.Done()
			<-broken
			return &tts.Error{Kind: tts.ErrNotReady, Msg: "error reading from server: EOF"}
		}
		return f
	}}
	m, logs := runMember(t, Backoff{Initial: time.Hour, Max: time.Hour, StartTimeout: time.Second}, fl)
	waitFor(t, "ready", 5*time.Second, func() bool { return m.Status().State == tts.StateReady })
	var want []string
	errs := make(chan error, 8)
	for i := range 8 {
		id := fmt.Sprintf("req-%d", i)
		want = append(want, id)
		started.Add(1)
		go func() {
			errs <- m.Synthesize(context.Background(), tts.Request{ID: id}, func(tts.Chunk) error { return nil })
		}()
	}
	started.Wait()
	fl.proc(0).die("signal: killed")
	close(broken)
	for range 8 {
		var died *DiedError
		if err := <-errs; !errors.As(err, &died) {
			t.Fatalf("a request on the killed process: %v", err)
		}
	}
	waitFor(t, "death log", 5*time.Second, func() bool { return len(logs.attrs("instance died", "request_ids")) == 1 })
	if got := logs.attrs("instance died", "request_ids")[0]; got != fmt.Sprint(want) {
		t.Fatalf("death log request_ids %s, want %v", got, want)
	}
}
