package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"
)

// DefaultIgnoredXids are the Xids an application causes (a bad kernel, a page fault, a context
// switch timeout): the GPU itself stays healthy, so they do not take a group out.
var DefaultIgnoredXids = []uint64{13, 31, 43, 45, 68, 109}

// Defaults of MonitorConfig.
const (
	DefaultPollInterval   = time.Second
	DefaultMaxTemperature = 90 // °C, when the GPU does not report its slowdown threshold
)

// MonitorConfig tunes a Monitor; zero values take the defaults.
type MonitorConfig struct {
	// IgnoredXids are not faults; nil means DefaultIgnoredXids, an empty list ignores none.
	IgnoredXids []uint64
	// MaxTemperature (°C) above which a GPU is unhealthy; 0 means the GPU's own slowdown
	// threshold, or DefaultMaxTemperature when it reports none.
	MaxTemperature int
	// PollInterval is how often figures (temperature, ECC counts, memory) are read.
	PollInterval time.Duration
}

// GPUStatus is what the monitor knows of one GPU.
type GPUStatus struct {
	Index              int       `json:"index"`
	UUID               string    `json:"uuid"`
	Name               string    `json:"name"`
	MemoryUsedBytes    uint64    `json:"memory_used_bytes"`
	MemoryTotalBytes   uint64    `json:"memory_total_bytes"`
	UtilizationPercent uint32    `json:"utilization_percent"`
	TemperatureC       uint32    `json:"temperature_c"`
	TemperatureLimitC  uint32    `json:"temperature_limit_c"`
	PowerWatts         *float64  `json:"power_watts,omitempty"`
	ThrottleReasons    []string  `json:"throttle_reasons,omitempty"`
	ECCCorrected       *uint64   `json:"ecc_corrected,omitempty"`
	ECCUncorrected     *uint64   `json:"ecc_uncorrected,omitempty"`
	XidErrors          uint64    `json:"xid_errors"` // critical Xids seen since start
	LastXid            uint64    `json:"last_xid,omitempty"`
	Healthy            bool      `json:"healthy"`
	Reason             string    `json:"reason,omitempty"` // why not healthy
	Updated            time.Time `json:"updated"`
}

// Monitor watches the GPUs of the host: it polls their figures and waits on NVML events, and
// calls the OnChange callbacks when a GPU turns unhealthy or healthy.
//
// A GPU is unhealthy while NVML cannot read it or it is over the temperature limit (live faults,
// re-read on every poll), and from a critical Xid, a double-bit ECC error or an NVML event it
// cannot place (latched faults, since an event says what happened, not what is) until a Check
// passes. All methods are safe on a nil *Monitor, which stands for a host without NVML.
type Monitor struct {
	lib     NVML
	cfg     MonitorConfig
	log     *slog.Logger
	ignored map[uint64]bool
	events  EventSet // nil when no GPU supports events

	// change serialises every state change with its callbacks, so callbacks see changes in order.
	change    sync.Mutex
	mu        sync.RWMutex
	gpus      []*gpu
	listeners []func(GPUStatus)

	closeOnce sync.Once
	closeErr  error
}

type gpu struct {
	index int
	dev   Device // nil while NVML cannot give a handle
	limit uint32

	st GPUStatus
	// live is the fault of the last reading; latched is the fault from events.
	live, latched string
	// faultSeq counts latched faults; ackSeq is the last one a Check has seen.
	faultSeq, ackSeq uint64
	// eccBase is the uncorrected ECC count a new error is measured against.
	eccBase  uint64
	eccKnown bool
}

// NewMonitor initialises NVML, finds the GPUs, subscribes to their events and reads them once.
// It returns an error wrapping ErrNoNVML on a host without NVIDIA's driver.
func NewMonitor(lib NVML, cfg MonitorConfig, log *slog.Logger) (*Monitor, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.IgnoredXids == nil {
		cfg.IgnoredXids = DefaultIgnoredXids
	}
	if err := lib.Init(); err != nil {
		if errors.Is(err, ErrNoNVML) {
			return nil, err
		}
		return nil, fmt.Errorf("%w: %w", ErrNoNVML, err)
	}
	m := &Monitor{lib: lib, cfg: cfg, log: log, ignored: map[uint64]bool{}}
	for _, x := range cfg.IgnoredXids {
		m.ignored[x] = true
	}
	n, err := lib.DeviceCount()
	if err != nil {
		_ = lib.Shutdown()
		return nil, fmt.Errorf("count GPUs: %w", err)
	}
	for i := range n {
		g := &gpu{index: i, st: GPUStatus{Index: i, Healthy: true}}
		m.open(g)
		m.gpus = append(m.gpus, g)
	}
	m.subscribe()
	m.poll()
	return m, nil
}

// open gets the handle and fixed facts of a GPU; on failure the GPU stays without a handle and
// the next poll tries again.
func (m *Monitor) open(g *gpu) {
	d, err := m.lib.Device(g.index)
	if err != nil {
		g.live = "nvml: " + err.Error()
		return
	}
	m.setDevice(g, m.describe(d))
}

// facts are what does not change while a GPU is in the host.
type facts struct {
	dev        Device
	uuid, name string
	limit      uint32
}

func (m *Monitor) describe(d Device) facts {
	f := facts{dev: d, limit: uint32(m.cfg.MaxTemperature)}
	f.uuid, _ = d.UUID()
	f.name, _ = d.Name()
	if f.limit == 0 {
		f.limit = DefaultMaxTemperature
		if t, err := d.SlowdownTemperature(); err == nil && t > 0 {
			f.limit = t
		}
	}
	return f
}

func (m *Monitor) setDevice(g *gpu, f facts) {
	g.dev, g.limit = f.dev, f.limit
	g.st.UUID, g.st.Name, g.st.TemperatureLimitC = f.uuid, f.name, f.limit
}

// subscribe registers every GPU on one event set; GPUs (or drivers) without event support are
// still polled.
func (m *Monitor) subscribe() {
	set, err := m.lib.NewEventSet()
	if err != nil {
		m.log.Warn("NVML events unavailable; GPU health from polling only", "error", err)
		return
	}
	registered := 0
	for _, g := range m.gpus {
		if g.dev == nil {
			continue
		}
		if err := g.dev.RegisterEvents(set); err != nil {
			lvl := slog.LevelWarn
			if errors.Is(err, ErrNotSupported) {
				lvl = slog.LevelInfo
			}
			m.log.Log(context.Background(), lvl, "GPU events unavailable; polling only", "gpu", g.index, "error", err)
			continue
		}
		registered++
	}
	if registered == 0 {
		_ = set.Free()
		return
	}
	m.events = set
}

// OnChange adds a callback run when a GPU turns unhealthy or healthy or its reason changes.
// Callbacks run on the monitor's goroutines, one at a time, and must not call Check.
func (m *Monitor) OnChange(f func(GPUStatus)) {
	if m == nil {
		return
	}
	m.mu.Lock()
	m.listeners = append(m.listeners, f)
	m.mu.Unlock()
}

// Snapshot returns the status of every GPU, by index.
func (m *Monitor) Snapshot() []GPUStatus {
	if m == nil {
		return nil
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]GPUStatus, len(m.gpus))
	for i, g := range m.gpus {
		out[i] = g.st
	}
	return out
}

// Run polls the GPUs and waits on their events until ctx ends, then releases NVML.
func (m *Monitor) Run(ctx context.Context) error {
	if m == nil {
		<-ctx.Done()
		return nil
	}
	var wg sync.WaitGroup
	if m.events != nil {
		wg.Go(func() { m.watchEvents(ctx) })
	}
	t := time.NewTicker(m.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return m.Close()
		case <-t.C:
			m.poll()
		}
	}
}

// Close releases the event set and NVML. Run calls it on its way out.
func (m *Monitor) Close() error {
	if m == nil {
		return nil
	}
	m.closeOnce.Do(func() {
		var errs []error
		if m.events != nil {
			errs = append(errs, m.events.Free())
		}
		errs = append(errs, m.lib.Shutdown())
		m.closeErr = errors.Join(errs...)
	})
	return m.closeErr
}

// eventWait bounds one NVML wait, so that Run notices its context ending.
const eventWait = 500 * time.Millisecond

func (m *Monitor) watchEvents(ctx context.Context) {
	for ctx.Err() == nil {
		ev, err := m.events.Wait(eventWait)
		if errors.Is(err, ErrTimeout) {
			continue
		}
		if err != nil {
			// An event may have been lost: better a group probed back than garbage served.
			m.latchAll("suspect: NVML event wait failed: " + err.Error())
			select {
			case <-ctx.Done():
			case <-time.After(m.cfg.PollInterval):
			}
			continue
		}
		m.handle(ev)
	}
}

// handle applies one event.
func (m *Monitor) handle(ev Event) {
	var reason string
	switch ev.Kind {
	case EventXid:
		if m.ignored[ev.Xid] {
			m.log.Info("GPU Xid ignored (application error)", "xid", ev.Xid, "uuid", ev.DeviceUUID)
			return
		}
		reason = fmt.Sprintf("critical Xid %d", ev.Xid)
	case EventDoubleBitECC:
		reason = "double-bit ECC error"
	default:
		return
	}
	m.change.Lock()
	defer m.change.Unlock()
	m.mu.Lock()
	var target *gpu
	for _, g := range m.gpus {
		if ev.DeviceUUID != "" && g.st.UUID == ev.DeviceUUID {
			target = g
		}
	}
	var changed []GPUStatus
	if target == nil {
		// NVML could not say which GPU: all are suspect until probed.
		m.log.Error("GPU event for an unknown device; marking all GPUs suspect", "event", reason, "uuid", ev.DeviceUUID)
		for _, g := range m.gpus {
			changed = m.latch(g, "suspect: "+reason+" on an unknown device", changed)
		}
	} else {
		m.log.Error("GPU fault", "gpu", target.index, "uuid", target.st.UUID, "event", reason)
		if ev.Kind == EventXid {
			target.st.XidErrors++
			target.st.LastXid = ev.Xid
		}
		changed = m.latch(target, reason, changed)
	}
	m.mu.Unlock()
	m.notify(changed)
}

func (m *Monitor) latchAll(reason string) {
	m.change.Lock()
	defer m.change.Unlock()
	m.mu.Lock()
	var changed []GPUStatus
	for _, g := range m.gpus {
		changed = m.latch(g, reason, changed)
	}
	m.mu.Unlock()
	if len(changed) > 0 {
		m.log.Error("marking all GPUs suspect", "reason", reason)
	}
	m.notify(changed)
}

// latch records an event fault on g (m.mu held) and appends g's status to changed if it changed.
func (m *Monitor) latch(g *gpu, reason string, changed []GPUStatus) []GPUStatus {
	g.latched = reason
	g.faultSeq++
	return m.settle(g, changed)
}

// settle recomputes g's health from its faults (m.mu held).
func (m *Monitor) settle(g *gpu, changed []GPUStatus) []GPUStatus {
	var reasons []string
	for _, r := range []string{g.live, g.latched} {
		if r != "" && !slices.Contains(reasons, r) {
			reasons = append(reasons, r)
		}
	}
	healthy, reason := len(reasons) == 0, strings.Join(reasons, "; ")
	if healthy == g.st.Healthy && reason == g.st.Reason {
		return changed
	}
	g.st.Healthy, g.st.Reason = healthy, reason
	if healthy {
		m.log.Info("GPU healthy", "gpu", g.index, "uuid", g.st.UUID)
	} else {
		m.log.Warn("GPU unhealthy", "gpu", g.index, "uuid", g.st.UUID, "reason", reason)
	}
	return append(changed, g.st)
}

func (m *Monitor) notify(changed []GPUStatus) {
	if len(changed) == 0 {
		return
	}
	m.mu.RLock()
	ls := slices.Clone(m.listeners)
	m.mu.RUnlock()
	for _, st := range changed {
		for _, f := range ls {
			f(st)
		}
	}
}

// reading is one poll of a GPU, taken without locks.
type reading struct {
	used, total  uint64
	util, temp   uint32
	power        *float64
	throttle     []string
	corr, uncorr *uint64
	fault        string
	opened       *facts // set when this reading got the GPU's handle
}

func (m *Monitor) read(g *gpu) reading {
	var r reading
	dev := g.dev
	if dev == nil {
		d, err := m.lib.Device(g.index)
		if err != nil {
			r.fault = "nvml: " + err.Error()
			return r
		}
		f := m.describe(d)
		dev, r.opened = d, &f
	}
	// A figure the GPU does not support is left out; any other error means NVML lost the GPU.
	lost := func(err error) bool {
		if err == nil || errors.Is(err, ErrNotSupported) {
			return false
		}
		if r.fault == "" {
			r.fault = "nvml: " + err.Error()
		}
		return true
	}
	var err error
	if r.used, r.total, err = dev.Memory(); lost(err) {
		return r
	}
	if r.util, err = dev.Utilization(); lost(err) {
		return r
	}
	if r.temp, err = dev.Temperature(); lost(err) {
		return r
	}
	if mw, err := dev.PowerUsage(); err == nil {
		w := float64(mw) / 1000
		r.power = &w
	} else if lost(err) {
		return r
	}
	if mask, err := dev.ClockEventReasons(); err == nil {
		r.throttle = ClockEventReasonNames(mask)
	} else if lost(err) {
		return r
	}
	if c, u, err := dev.ECCErrors(); err == nil {
		r.corr, r.uncorr = &c, &u
	} else if lost(err) {
		return r
	}
	return r
}

// apply stores a reading in g (m.mu held) and judges its live health.
func (m *Monitor) apply(g *gpu, r reading, now time.Time, changed []GPUStatus) []GPUStatus {
	if r.opened != nil {
		m.setDevice(g, *r.opened)
	}
	g.st.Updated = now
	if r.fault != "" {
		g.live = r.fault
		return m.settle(g, changed)
	}
	g.st.MemoryUsedBytes, g.st.MemoryTotalBytes = r.used, r.total
	g.st.UtilizationPercent, g.st.TemperatureC = r.util, r.temp
	g.st.PowerWatts, g.st.ThrottleReasons = r.power, r.throttle
	g.st.ECCCorrected, g.st.ECCUncorrected = r.corr, r.uncorr
	g.live = ""
	if r.temp > g.limit {
		g.live = fmt.Sprintf("temperature %d°C over the limit %d°C", r.temp, g.limit)
	}
	if r.uncorr != nil {
		if g.eccKnown && *r.uncorr > g.eccBase {
			// Counted like an event: a new uncorrectable error, whether or not NVML sent one.
			g.latched = fmt.Sprintf("%d new double-bit (uncorrectable) ECC errors", *r.uncorr-g.eccBase)
			g.faultSeq++
		}
		g.eccBase, g.eccKnown = *r.uncorr, true
	}
	return m.settle(g, changed)
}

// readAll reads gs through NVML, outside m.mu: a slow driver call must not block Snapshot.
func (m *Monitor) readAll(gs []*gpu) ([]reading, time.Time) {
	rs := make([]reading, len(gs))
	for i, g := range gs {
		rs[i] = m.read(g)
	}
	return rs, time.Now()
}

// poll reads every GPU once.
func (m *Monitor) poll() {
	m.change.Lock()
	defer m.change.Unlock()
	m.mu.RLock()
	gs := slices.Clone(m.gpus)
	m.mu.RUnlock()
	rs, now := m.readAll(gs)
	var changed []GPUStatus
	m.mu.Lock()
	for i, g := range gs {
		changed = m.apply(g, rs[i], now, changed)
	}
	m.mu.Unlock()
	m.notify(changed)
}

// Check reads the given GPUs now and returns nil when they can serve: NVML reads them, they are
// under the temperature limit, and no fault was latched since the previous Check. A passing
// Check clears latched faults; a fault latched since the previous Check makes this one fail
// (and counts as seen), so a recovery that needs several passing checks in a row sees a stream
// of Xids as a stream of failures. Meant as the GPU half of a group's recovery probe.
func (m *Monitor) Check(indices ...int) error {
	if m == nil {
		return nil
	}
	m.change.Lock()
	defer m.change.Unlock()
	m.mu.RLock()
	gs := make([]*gpu, 0, len(indices))
	for _, i := range indices {
		if i < 0 || i >= len(m.gpus) {
			m.mu.RUnlock()
			return fmt.Errorf("GPU %d: not on this host (NVML sees %d GPUs)", i, len(m.gpus))
		}
		gs = append(gs, m.gpus[i])
	}
	m.mu.RUnlock()
	rs, now := m.readAll(gs)
	var changed []GPUStatus
	var errs []error
	m.mu.Lock()
	for i, g := range gs {
		changed = m.apply(g, rs[i], now, changed)
		switch {
		case g.live != "":
			errs = append(errs, fmt.Errorf("GPU %d: %s", g.index, g.live))
		case g.faultSeq != g.ackSeq:
			g.ackSeq = g.faultSeq
			errs = append(errs, fmt.Errorf("GPU %d: %s since the last check", g.index, g.latched))
		}
	}
	if len(errs) == 0 {
		for _, g := range gs {
			g.latched = ""
			changed = m.settle(g, changed)
		}
	}
	m.mu.Unlock()
	m.notify(changed)
	return errors.Join(errs...)
}

// Healthy reports whether all the given GPUs are healthy now, and if not, why (for a group's
// state: "GPU 3: critical Xid 79"). A GPU the host lacks is not healthy.
func (m *Monitor) Healthy(indices ...int) (bool, string) {
	if m == nil {
		return true, ""
	}
	m.mu.RLock()
	defer m.mu.RUnlock()
	var reasons []string
	for _, i := range indices {
		switch {
		case i < 0 || i >= len(m.gpus):
			reasons = append(reasons, fmt.Sprintf("GPU %d: not on this host (NVML sees %d GPUs)", i, len(m.gpus)))
		case !m.gpus[i].st.Healthy:
			reasons = append(reasons, fmt.Sprintf("GPU %d: %s", i, m.gpus[i].st.Reason))
		}
	}
	return len(reasons) == 0, strings.Join(reasons, "; ")
}
