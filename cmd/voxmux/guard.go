package main

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/voxmux/voxmux/config"
	"github.com/voxmux/voxmux/health"
	"github.com/voxmux/voxmux/router"
	"github.com/voxmux/voxmux/tts"
)

// guard connects GPU health to the groups: a group whose GPU turns unhealthy leaves rotation at
// once, is restarted (when configured) once its in-flight requests are done, and comes back only
// after enough consecutive passing probes (a GPU check and a small synthesis).
type guard struct {
	mon  *health.Monitor
	cfg  *config.Config
	log  *slog.Logger
	ctx  context.Context
	mu   sync.Mutex
	busy map[string]bool // groups being recovered
}

func watchGPUs(ctx context.Context, mon *health.Monitor, cfg *config.Config, pool *router.Pool, log *slog.Logger) {
	if mon == nil {
		return
	}
	g := &guard{mon: mon, cfg: cfg, log: log, ctx: ctx, busy: map[string]bool{}}
	mon.OnChange(func(st health.GPUStatus) {
		for _, grp := range pool.Groups() {
			if !slices.Contains(grp.GPUs, st.Index) {
				continue
			}
			if ok, why := mon.Healthy(grp.GPUs...); !ok {
				g.unhealthy(grp, why)
			}
		}
	})
}

func (g *guard) unhealthy(grp *router.Group, why string) {
	grp.SetUnhealthy(why) // out of rotation now; in-flight requests go on
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.busy[grp.Name] {
		return
	}
	g.busy[grp.Name] = true
	g.log.Error("group unhealthy: out of rotation", "group", grp.Name, "reason", why)
	go g.recover(grp)
}

func (g *guard) recover(grp *router.Group) {
	defer func() {
		g.mu.Lock()
		delete(g.busy, grp.Name)
		g.mu.Unlock()
	}()
	if g.cfg.Health.Restart() {
		// Let in-flight requests finish or fail, then replace the instance processes.
		dctx, cancel := context.WithTimeout(g.ctx, g.cfg.Shutdown.DrainTimeout.Std())
		_ = grp.WaitIdle(dctx) // stragglers past the drain timeout fail, visibly to their clients
		cancel()
		if err := grp.RestartInstances(g.ctx); err != nil {
			g.log.Warn("restart of an unhealthy group", "group", grp.Name, "error", err)
		}
	}
	rec := recoveryConfig(g.cfg.Health)
	rec.Probe = func(ctx context.Context) error {
		if err := g.mon.Check(grp.GPUs...); err != nil {
			return err
		}
		for _, b := range grp.Backends {
			pctx, cancel := context.WithTimeout(ctx, time.Minute)
			err := b.Synth.Synthesize(pctx, tts.Request{ID: "health-probe", Text: "Probe."}, func(tts.Chunk) error { return nil })
			cancel()
			if err != nil {
				return err
			}
		}
		return nil
	}
	rec.OnProbe = func(n, need int, err error) {
		g.log.Info("recovery probe", "group", grp.Name, "passes", n, "need", need, "error", err)
	}
	if err := rec.Run(g.ctx); err != nil {
		return
	}
	grp.SetUnhealthy("")
	g.log.Info("group recovered: back in rotation", "group", grp.Name)
}

// registrationStatus describes the pool for Consul.
func registrationStatus(pool *router.Pool) health.RegistrationStatus {
	m := pool.Model()
	st := health.RegistrationStatus{Model: m.Name, Voices: m.Voices}
	for _, g := range pool.Groups() {
		s := g.State()
		ready := s == tts.StateReady
		st.GroupsTotal++
		if ready {
			st.GroupsReady++
			for _, b := range g.Backends {
				if b.Ready() {
					st.Capacity += b.Capacity
				}
			}
		}
		st.Groups = append(st.Groups, health.GroupStatus{Name: g.Name, State: string(s), Ready: ready, GPUs: g.GPUs})
	}
	return st
}

// notifyChanges tells the registrar when any group's state changes.
func notifyChanges(ctx context.Context, pool *router.Pool, reg *health.Registrar) {
	if reg == nil {
		return
	}
	last := ""
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		var b strings.Builder
		for _, g := range pool.Groups() {
			b.WriteString(g.Name + "=" + string(g.State()) + ";")
		}
		if s := b.String(); s != last {
			last = s
			reg.Changed()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// gpuView is the health part of a group in GET /admin/groups.
func gpuView(mon *health.Monitor) func(g *router.Group) map[string]any {
	if mon == nil {
		return nil
	}
	return func(g *router.Group) map[string]any {
		var gpus []health.GPUStatus
		for _, st := range mon.Snapshot() {
			if slices.Contains(g.GPUs, st.Index) {
				gpus = append(gpus, st)
			}
		}
		return map[string]any{"gpus": gpus}
	}
}
