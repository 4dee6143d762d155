package plugin

import (
	"context"
	"fmt"
	"log/slog"
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
	Stop()
	Exited() bool
	PID() int
}

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
}

// NewMember makes a member; Run starts it.
func NewMember(spec MemberSpec, opts Backoff, launch Launcher, log *slog.Logger) *Member {
	return &Member{
		spec: spec, opts: opts, launch: launch, log: log.With("instance", spec.Name),
		status:  tts.Status{Name: spec.Name, State: tts.StateStarting, Since: time.Now()},
		changed: make(chan struct{}),
		kick:    make(chan struct{}, 1),
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

// Synthesize runs req on the current process.
func (m *Member) Synthesize(ctx context.Context, req tts.Request, emit func(tts.Chunk) error) error {
	m.mu.Lock()
	inst, state := m.inst, m.status.State
	m.mu.Unlock()
	if inst == nil || state != tts.StateReady {
		return &tts.Error{Kind: tts.ErrNotReady, Msg: fmt.Sprintf("instance %s is %s", m.spec.Name, state)}
	}
	return inst.Synthesize(ctx, req, emit)
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
			m.log.Warn("instance start failed; retrying", "error", err, "in", delay)
			m.waitKick(ctx, delay)
			delay = min(2*delay, m.opts.Max)
			continue
		}
		m.mu.Lock()
		m.inst, m.proc = inst, proc
		m.mu.Unlock()
		m.set(func(s *tts.Status) {
			s.State, s.PID, s.GPUs, s.Failures, s.LastError = tts.StateReady, proc.PID(), info.GPUs, 0, ""
		})
		m.log.Info("instance ready", "pid", proc.PID(), "cuda_visible_devices", info.CUDAVisibleDevices, "gpus", len(info.GPUs))

		crashed := m.watch(ctx, proc)
		m.mu.Lock()
		m.inst, m.proc = nil, nil
		m.mu.Unlock()
		proc.Stop()
		if ctx.Err() != nil {
			break
		}
		m.set(func(s *tts.Status) { s.Restarts++; s.PID = 0 })
		if crashed {
			m.log.Warn("instance exited; restarting", "in", delay)
			m.set(func(s *tts.Status) { s.State, s.LastError = tts.StateRestarting, "process exited" })
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

// watch waits until the process exits (true), a restart is asked for, or ctx ends (false).
func (m *Member) watch(ctx context.Context, proc Stopper) bool {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-m.kick:
			m.mu.Lock()
			r := m.restart
			m.mu.Unlock()
			if r {
				return false
			}
		case <-t.C:
			if proc.Exited() {
				return true
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
