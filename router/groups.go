package router

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/voxmux/voxmux/tts"
)

// Group is a GPU group: the instances that share its GPUs, drained and restarted together.
type Group struct {
	Name     string
	GPUs     []int
	Backends []*Backend

	pool       *Pool
	mu         sync.Mutex
	draining   bool
	restarting bool
	unhealthy  string // why the group is out of rotation for health, "" when healthy
	ops        sync.Mutex
}

// open reports whether the group takes new requests.
func (g *Group) open() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return !g.draining && g.unhealthy == ""
}

// State is the group's state: an operation or health verdict first, else what its instances say.
func (g *Group) State() tts.State {
	g.mu.Lock()
	restarting, draining, unhealthy := g.restarting, g.draining, g.unhealthy
	g.mu.Unlock()
	switch {
	case restarting:
		return tts.StateRestarting
	case draining:
		return tts.StateDraining
	case unhealthy != "":
		return tts.StateUnhealthy
	}
	var ready, failed, restartingN int
	for _, b := range g.Backends {
		switch b.state() {
		case tts.StateReady:
			ready++
		case tts.StateFailed:
			failed++
		case tts.StateRestarting:
			restartingN++
		}
	}
	switch {
	case ready > 0:
		return tts.StateReady
	case len(g.Backends) > 0 && failed == len(g.Backends):
		return tts.StateFailed
	case restartingN > 0:
		return tts.StateRestarting
	}
	return tts.StateStarting
}

// UnhealthyReason is why the group is unhealthy, "" when it is not.
func (g *Group) UnhealthyReason() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.unhealthy
}

func (b *Backend) state() tts.State {
	if b.Member != nil {
		return b.Member.Status().State
	}
	if b.ready.Load() {
		return tts.StateReady
	}
	return tts.StateStarting
}

// Inflight is the group's in-flight request count.
func (g *Group) Inflight() int {
	n := 0
	for _, b := range g.Backends {
		n += b.Inflight()
	}
	return n
}

// SetUnhealthy takes the group out of rotation at once (in-flight requests go on); "" puts it back.
func (g *Group) SetUnhealthy(reason string) {
	g.mu.Lock()
	g.unhealthy = reason
	g.mu.Unlock()
	if reason == "" && g.pool != nil {
		g.pool.Dispatch()
	}
}

// Drain stops new requests to the group and waits until its in-flight ones finish or ctx ends.
// The group stays drained until Resume.
func (g *Group) Drain(ctx context.Context) error {
	g.mu.Lock()
	g.draining = true
	g.mu.Unlock()
	return g.WaitIdle(ctx)
}

// WaitIdle waits until the group has no request in flight, or ctx ends.
func (g *Group) WaitIdle(ctx context.Context) error {
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for g.Inflight() > 0 {
		select {
		case <-ctx.Done():
			return fmt.Errorf("group %s: %d requests still in flight: %w", g.Name, g.Inflight(), ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

// Resume ends a drain.
func (g *Group) Resume() {
	g.mu.Lock()
	g.draining = false
	g.mu.Unlock()
	if g.pool != nil {
		g.pool.Dispatch()
	}
}

// ErrLastReadyGroup refuses an operation that would leave no group serving.
var ErrLastReadyGroup = errors.New("it is the last ready group; traffic would fail")

// refuseLast is ErrLastReadyGroup when the group is the last ready one and force is not set; op
// names the operation refused.
func (g *Group) refuseLast(force bool, op string) error {
	if !force && g.pool != nil && g.State() == tts.StateReady && !g.pool.otherReady(g) {
		return fmt.Errorf("group %s: %w (use force to %s it anyway)", g.Name, ErrLastReadyGroup, op)
	}
	return nil
}

// DrainUnlessLast drains the group (Drain) unless it is the last ready group and force is not
// set: an operator's drain must not stop all traffic by accident.
func (g *Group) DrainUnlessLast(ctx context.Context, force bool) error {
	if err := g.refuseLast(force, "drain"); err != nil {
		return err
	}
	return g.Drain(ctx)
}

// Restart drains the group, replaces every instance process, waits until they are warmed up and
// ready, and opens the group again. Unless force is set it refuses to take down the last ready
// group.
func (g *Group) Restart(ctx context.Context, drainTimeout time.Duration, force bool) error {
	g.ops.Lock()
	defer g.ops.Unlock()
	if err := g.refuseLast(force, "restart"); err != nil {
		return err
	}
	g.mu.Lock()
	g.restarting = true
	drained := g.draining // by an operator: the group stays drained after its restart
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.restarting = false
		g.mu.Unlock()
		if !drained {
			g.Resume()
		}
	}()
	dctx, cancel := context.WithTimeout(ctx, drainTimeout)
	err := g.Drain(dctx)
	cancel()
	if err != nil && ctx.Err() != nil {
		return err
	}
	// A drain that timed out still restarts: the stragglers fail, which the client can detect.
	return g.RestartInstances(ctx)
}

// RestartInstances replaces every instance process of the group, all at once, and waits until
// each is ready again or has failed.
func (g *Group) RestartInstances(ctx context.Context) error {
	var wg sync.WaitGroup
	errs := make([]error, len(g.Backends))
	for i, b := range g.Backends {
		if b.Member == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = b.Member.Restart(ctx)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// otherReady reports whether a group other than g is ready.
func (p *Pool) otherReady(g *Group) bool {
	for _, o := range p.Groups() {
		if o != g && o.State() == tts.StateReady {
			return true
		}
	}
	return false
}

// otherComing reports whether a group other than g is on its way to ready by itself. A drained
// group is not: it waits for an operator's resume, which may never come.
func (p *Pool) otherComing(g *Group) bool {
	for _, o := range p.Groups() {
		switch s := o.State(); {
		case o == g:
		case s == tts.StateStarting, s == tts.StateRestarting:
			return true
		}
	}
	return false
}

// RollingRestart restarts the groups one at a time, never taking down the last ready group: a
// group waits (up to ctx) until another one is ready first. progress is told of each step.
func (p *Pool) RollingRestart(ctx context.Context, drainTimeout time.Duration, progress func(group, step string)) error {
	for _, g := range p.Groups() {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("rolling restart stopped before group %s: %w", g.Name, err)
		}
		for g.State() == tts.StateReady && !p.otherReady(g) {
			if !p.otherComing(g) {
				return fmt.Errorf("group %s: %w (a drained group does not count until it is resumed)", g.Name, ErrLastReadyGroup)
			}
			progress(g.Name, "waiting for another group to be ready")
			select {
			case <-ctx.Done():
				return fmt.Errorf("group %s: %w (%w)", g.Name, ErrLastReadyGroup, ctx.Err())
			case <-time.After(200 * time.Millisecond):
			}
		}
		progress(g.Name, "restarting")
		if err := g.Restart(ctx, drainTimeout, false); err != nil {
			return err
		}
		progress(g.Name, "ready")
	}
	return nil
}
