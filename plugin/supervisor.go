package plugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// Backoff is how a Member retries.
type Backoff struct {
	Initial, Max time.Duration
	// MaxFailures consecutive failed starts mark the member failed; it then waits for Restart.
	MaxFailures int
	// StartTimeout bounds launch, load and warm-up.
	StartTimeout time.Duration
	// ResetAfter is the healthy run after which a crash is retried after Initial again (0 never
	// resets): a rare crash should not pay for old ones.
	ResetAfter time.Duration
	// Liveness probes a ready process; the zero value probes nothing.
	Liveness Liveness
}

// Liveness is how a ready process is checked for progress: a Health RPC every Interval, each
// bounded by Timeout; Failures in a row mark it hung, and it is killed and relaunched.
type Liveness struct {
	Interval, Timeout time.Duration
	Failures          int
}

// MemberSpec says what one supervised instance runs.
type MemberSpec struct {
	Name   string
	Launch LaunchConfig
	Load   tts.LoadConfig
}

// Launcher starts a process; Launch in production, a fake in tests.
type Launcher func(ctx context.Context, lc LaunchConfig) (Instance, Stopper, error)

// Stopper is the process side of a launched instance.
type Stopper interface {
	// Stop ends the process gracefully through go-plugin.
	Stop()
	// Kill ends a process that no longer answers (a graceful stop would wait on it forever).
	Kill()
	Exited() bool
	// ExitStatus says how the process ended ("signal: killed"), "" while it runs.
	ExitStatus() string
	PID() int
}

// DiedError is the failure of a request whose instance died or was killed as hung while the
// request ran on it. The request may be what killed it, so the router does not retry it
// elsewhere (InstanceDied).
type DiedError struct {
	Instance string
	Why      string
	Err      error
}

func (e *DiedError) Error() string {
	return fmt.Sprintf("instance %s died during the request: %s", e.Instance, e.Why)
}
func (e *DiedError) Unwrap() error { return e.Err }

// InstanceDied marks the error for the router, which only knows this method.
func (e *DiedError) InstanceDied() bool { return true }

// ProcessLauncher launches real instance processes.
func ProcessLauncher(ctx context.Context, lc LaunchConfig) (Instance, Stopper, error) {
	p, err := Launch(ctx, lc)
	if err != nil {
		return nil, nil, err
	}
	return p, p, nil
}

// Member supervises one instance: it launches the process, loads the model, marks itself ready
// only after a warm-up synthesis succeeds, and relaunches a crashed process with capped
// exponential backoff. Every launch makes a new go-plugin client (one cannot be restarted).
type Member struct {
	spec   MemberSpec
	opts   Backoff
	launch Launcher
	log    *slog.Logger

	mu      sync.Mutex
	inst    Instance
	proc    Stopper
	status  tts.Status
	changed chan struct{} // closed and replaced on every change
	kick    chan struct{}
	restart bool // an operator asked for a fresh process
	// life ends, with the reason as its cause, when the current process dies or is killed; the
	// requests on it are cut with that reason.
	life     context.Context
	inflight map[string]int // request IDs on the current process
	// cut holds the IDs of requests that ended because the current process exited, until its
	// death is logged: a request sees the exit before the supervisor's next look does.
	cut map[string]struct{}
}

// NewMember makes a member; Run starts it.
func NewMember(spec MemberSpec, opts Backoff, launch Launcher, log *slog.Logger) *Member {
	return &Member{
		spec: spec, opts: opts, launch: launch, log: log.With("instance", spec.Name),
		status:   tts.Status{Name: spec.Name, State: tts.StateStarting, Since: time.Now()},
		changed:  make(chan struct{}),
		kick:     make(chan struct{}, 1),
		inflight: map[string]int{},
		cut:      map[string]struct{}{},
	}
}

// Name is the member's name (group/index).
func (m *Member) Name() string { return m.spec.Name }

// Status is the member's current status.
func (m *Member) Status() tts.Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.status
	s.GPUs = append([]tts.GPU(nil), s.GPUs...)
	return s
}

// Changed is closed at the member's next status change.
func (m *Member) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

func (m *Member) set(f func(s *tts.Status)) {
	m.mu.Lock()
	old := m.status.State
	f(&m.status)
	if m.status.State != old {
		m.status.Since = time.Now()
	}
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
}

// Synthesize runs req on the current process. A request during which the process dies (or is
// killed as hung) fails with a *DiedError; one that finds the process already gone is
// ErrNotReady, which another instance may serve.
func (m *Member) Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error {
	m.mu.Lock()
	inst, proc, life, state := m.inst, m.proc, m.life, m.status.State
	if inst == nil || state != tts.StateReady || proc.Exited() {
		m.mu.Unlock()
		return &tts.Error{Kind: tts.ErrNotReady, Msg: fmt.Sprintf("instance %s is %s", m.spec.Name, state)}
	}
	m.inflight[req.ID]++
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		if m.inflight[req.ID]--; m.inflight[req.ID] <= 0 {
			delete(m.inflight, req.ID)
		}
		if proc.Exited() && life.Err() == nil { // gone, its death not yet logged
			m.cut[req.ID] = struct{}{}
		}
		m.mu.Unlock()
	}()
	rctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(life, func() { cancel(context.Cause(life)) })
	defer stop()
	// A slot the router has just freed for a cancelled request is waited for by the instance
	// itself (instance.Service), not polled here.
	err := inst.Synthesize(rctx, req, emit)
	if err == nil || ctx.Err() != nil {
		return err
	}
	var ie *tts.Error
	wait := deathWait
	if errors.As(err, &ie) {
		switch ie.Kind {
		case tts.ErrInvalid, tts.ErrBusy:
			return err // the instance answered
		case tts.ErrInternal:
			wait = 0 // most likely the instance's own failure: no delay, only a look
		}
	}
	// A broken stream (Unavailable): go-plugin sees the process exit shortly after it breaks.
	if why := waitDeath(proc, life, wait); errors.Is(context.Cause(life), errStopped) {
		// Stopped on purpose (a restart, shutdown): not this request's doing.
		return &tts.Error{Kind: tts.ErrNotReady, Msg: fmt.Sprintf("instance %s was stopped", m.spec.Name)}
	} else if why != "" {
		return &DiedError{Instance: m.spec.Name, Why: why, Err: err}
	}
	return err
}

// errStopped ends a process's life when the supervisor stops it on purpose.
var errStopped = errors.New("instance stopped")

// deathWait bounds how long a request whose stream broke waits to learn whether the process died.
var deathWait = 2 * time.Second

// waitDeath waits up to d for the process to exit or be killed and says why; "" if it lives.
func waitDeath(proc Stopper, life context.Context, d time.Duration) string {
	deadline := time.Now().Add(d)
	for {
		if life.Err() != nil {
			return context.Cause(life).Error()
		}
		if proc.Exited() {
			return exitWhy(proc)
		}
		if time.Now().After(deadline) {
			return ""
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func exitWhy(proc Stopper) string {
	if st := proc.ExitStatus(); st != "" {
		return "process exited (" + st + ")"
	}
	return "process exited"
}

// inflightIDs lists the requests on the current process, and those its exit has already cut, for
// the log of its death.
func (m *Member) inflightIDs() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := make([]string, 0, len(m.inflight)+len(m.cut))
	for id := range m.inflight {
		ids = append(ids, id)
	}
	for id := range m.cut {
		if _, ok := m.inflight[id]; !ok {
			ids = append(ids, id)
		}
	}
	clear(m.cut)
	sort.Strings(ids)
	return ids
}

// Health asks the current process for its own view of itself (stage batch counters included).
func (m *Member) Health(ctx context.Context) (tts.Health, error) {
	m.mu.Lock()
	inst := m.inst
	m.mu.Unlock()
	if inst == nil {
		return tts.Health{}, &tts.Error{Kind: tts.ErrNotReady, Msg: fmt.Sprintf("instance %s has no process", m.spec.Name)}
	}
	return inst.Health(ctx)
}

// Restart replaces the process with a fresh one and waits until it is ready or has failed. A
// failed member is started again too.
func (m *Member) Restart(ctx context.Context) error {
	m.mu.Lock()
	m.restart = true
	m.mu.Unlock()
	select {
	case m.kick <- struct{}{}:
	default:
	}
	// Wait for the old process to go, then for the new one to settle.
	left := false
	for {
		ch := m.Changed()
		s := m.Status()
		m.mu.Lock()
		pending := m.restart
		m.mu.Unlock()
		if !pending {
			left = true
		}
		if left && s.State == tts.StateReady {
			return nil
		}
		if left && s.State == tts.StateFailed {
			return fmt.Errorf("instance %s failed to restart: %s", m.spec.Name, s.LastError)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Run supervises until ctx ends, then stops the process.
func (m *Member) Run(ctx context.Context) {
	delay := m.opts.Initial
	for ctx.Err() == nil {
		m.mu.Lock()
		m.restart = false
		restarts := m.status.Restarts
		m.mu.Unlock()
		state := tts.StateStarting
		if restarts > 0 {
			state = tts.StateRestarting
		}
		m.set(func(s *tts.Status) { s.State = state })

		inst, proc, info, err := m.start(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			var failed bool
			m.set(func(s *tts.Status) {
				s.Failures++
				s.LastError = err.Error()
				failed = m.opts.MaxFailures > 0 && s.Failures >= m.opts.MaxFailures
				if failed {
					s.State = tts.StateFailed
				}
			})
			if failed {
				m.log.Error("instance failed; not restarting until an operator restarts it", "error", err, "failures", m.opts.MaxFailures)
				if !m.waitKick(ctx, 0) {
					break
				}
				m.set(func(s *tts.Status) { s.Failures = 0 })
				delay = m.opts.Initial
				continue
			}
			m.log.Warn("instance start failed; retrying", "error", err, "in", delay.String())
			m.waitKick(ctx, delay)
			delay = min(2*delay, m.opts.Max)
			continue
		}
		life, end := context.WithCancelCause(context.Background())
		m.mu.Lock()
		m.inst, m.proc, m.life = inst, proc, life
		clear(m.cut)
		m.mu.Unlock()
		m.set(func(s *tts.Status) {
			s.State, s.PID, s.GPUs, s.Failures, s.LastError = tts.StateReady, proc.PID(), info.GPUs, 0, ""
		})
		readyAt := time.Now()
		m.log.Info("instance ready", "pid", proc.PID(), "cuda_visible_devices", info.CUDAVisibleDevices, "gpus", len(info.GPUs))

		why, hung := m.watch(ctx, inst, proc)
		m.mu.Lock()
		m.inst, m.proc = nil, nil
		m.mu.Unlock()
		if ctx.Err() == nil {
			// Out of rotation before the (possibly slow) stop.
			m.set(func(s *tts.Status) {
				s.State = tts.StateRestarting
				if why != "" {
					s.LastError = why
				}
			})
		}
		if why != "" {
			// Logged before the requests are cut, so that the log names every request it took.
			m.log.Error("instance died", "why", why, "pid", proc.PID(), "uptime", time.Since(readyAt).Round(time.Millisecond).String(),
				"request_ids", m.inflightIDs())
			end(errors.New(why))
		} else {
			end(errStopped)
		}
		if hung {
			proc.Kill()
		} else {
			proc.Stop()
		}
		if ctx.Err() != nil {
			break
		}
		m.set(func(s *tts.Status) { s.Restarts++; s.PID = 0 })
		if why != "" {
			if m.opts.ResetAfter > 0 && time.Since(readyAt) >= m.opts.ResetAfter {
				delay = m.opts.Initial // a healthy run: this crash is not one of a series
			}
			m.log.Warn("instance restarting", "in", delay.String())
			if !m.waitKick(ctx, delay) {
				break
			}
			delay = min(2*delay, m.opts.Max)
		} else {
			delay = m.opts.Initial
		}
	}
	m.set(func(s *tts.Status) { s.State, s.PID = tts.StateStopped, 0 })
}

// watch waits until the process exits or stops answering its liveness probe (why says which;
// hung when it must be killed), a restart is asked for, or ctx ends (why "").
func (m *Member) watch(ctx context.Context, inst Instance, proc Stopper) (why string, hung bool) {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	var probe <-chan time.Time
	lv := m.opts.Liveness
	if lv.Failures > 0 && lv.Interval > 0 {
		pt := time.NewTicker(lv.Interval)
		defer pt.Stop()
		probe = pt.C
	}
	failures := 0
	for {
		select {
		case <-ctx.Done():
			return "", false
		case <-m.kick:
			m.mu.Lock()
			r := m.restart
			m.mu.Unlock()
			if r {
				return "", false
			}
		case <-t.C:
			if proc.Exited() {
				return exitWhy(proc), false
			}
		case <-probe:
			hctx, cancel := context.WithTimeout(ctx, lv.Timeout)
			_, err := inst.Health(hctx)
			cancel()
			switch {
			case ctx.Err() != nil:
				return "", false
			case proc.Exited():
				return exitWhy(proc), false
			case err == nil:
				failures = 0
				continue
			}
			failures++
			m.log.Warn("instance health check failed", "error", err, "failures", failures, "limit", lv.Failures)
			if failures >= lv.Failures {
				return fmt.Sprintf("hung: %d health checks in a row failed (last: %v); killed", failures, err), true
			}
		}
	}
}

// waitKick sleeps d (forever when 0) unless kicked; false when ctx ended.
func (m *Member) waitKick(ctx context.Context, d time.Duration) bool {
	var timer <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
		return false
	case <-m.kick:
	case <-timer:
	}
	return true
}

// start launches, loads and warms up one process.
func (m *Member) start(ctx context.Context) (Instance, Stopper, tts.Info, error) {
	sctx, cancel := context.WithTimeout(ctx, m.opts.StartTimeout)
	defer cancel()
	inst, proc, err := m.launch(sctx, m.spec.Launch)
	if err != nil {
		return nil, nil, tts.Info{}, err
	}
	info, err := inst.Load(sctx, m.spec.Load)
	if err != nil {
		proc.Stop()
		return nil, nil, tts.Info{}, fmt.Errorf("load: %w", err)
	}
	// Ready only after a real synthesis succeeds.
	err = inst.Synthesize(sctx, tts.Request{ID: "warmup", Text: "Warm up."}, func(tts.Chunk) error { return nil })
	if err != nil {
		proc.Stop()
		return nil, nil, tts.Info{}, fmt.Errorf("warm-up synthesis: %w", err)
	}
	return inst, proc, info, nil
}
