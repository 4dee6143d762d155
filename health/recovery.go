package health

import (
	"context"
	"time"
)

// Defaults of Recovery.
const (
	DefaultRecoveryPasses = 3
	DefaultProbeInterval  = 10 * time.Second
)

// Streak counts consecutive passing probes; it is the whole rule by which an unhealthy group
// earns its way back.
type Streak struct {
	need, n int
}

// NewStreak needs `need` passes in a row (at least 1).
func NewStreak(need int) *Streak {
	if need < 1 {
		need = 1
	}
	return &Streak{need: need}
}

// Observe records one probe result and reports whether the streak is now long enough.
// A failure starts the count again.
func (s *Streak) Observe(err error) bool {
	if err != nil {
		s.n = 0
		return false
	}
	s.n++
	return s.n >= s.need
}

// Passes is the current number of passes in a row.
func (s *Streak) Passes() int { return s.n }

// Recovery brings an unhealthy group back: it probes the group (for voxmux, a GPU Check and a
// small synthesis) until Passes probes in a row pass. There is no limit on attempts, so there is
// always a way back once the group really works again.
type Recovery struct {
	// Probe returns nil when the group works.
	Probe func(ctx context.Context) error
	// Passes is how many probes in a row must pass; 0 means DefaultRecoveryPasses.
	Passes int
	// Interval is the pause between probes; 0 means DefaultProbeInterval.
	Interval time.Duration
	// OnProbe, when set, hears every result with the streak it makes (for logs and status).
	OnProbe func(passes, need int, err error)
}

// Run probes until the streak is reached (nil) or ctx ends (ctx's error). The first probe runs
// at once.
func (r Recovery) Run(ctx context.Context) error {
	need := r.Passes
	if need <= 0 {
		need = DefaultRecoveryPasses
	}
	interval := r.Interval
	if interval <= 0 {
		interval = DefaultProbeInterval
	}
	s := NewStreak(need)
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
		err := r.Probe(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		done := s.Observe(err)
		if r.OnProbe != nil {
			r.OnProbe(s.Passes(), need, err)
		}
		if done {
			return nil
		}
		t.Reset(interval)
	}
}
