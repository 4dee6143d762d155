package health

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"
)

func TestStreak(t *testing.T) {
	bad := errors.New("probe failed")
	s := NewStreak(3)
	steps := []struct {
		err  error
		done bool
		n    int
	}{{nil, false, 1}, {nil, false, 2}, {bad, false, 0}, {nil, false, 1}, {nil, false, 2}, {nil, true, 3}, {nil, true, 4}}
	for i, st := range steps {
		if done := s.Observe(st.err); done != st.done || s.Passes() != st.n {
			t.Fatalf("step %d: done %v passes %d, want %v %d", i, done, s.Passes(), st.done, st.n)
		}
	}
	if !NewStreak(0).Observe(nil) {
		t.Error("a streak of 0 needs one pass")
	}
}

func TestRecoveryNeedsConsecutivePasses(t *testing.T) {
	bad := errors.New("synthesis failed")
	script := []error{bad, nil, nil, bad, nil, nil, nil, nil}
	probes := 0
	var seen []int
	r := Recovery{
		Passes:   3,
		Interval: time.Millisecond,
		Probe: func(context.Context) error {
			err := script[probes]
			probes++
			return err
		},
		OnProbe: func(passes, need int, err error) {
			if need != 3 {
				t.Errorf("need = %d", need)
			}
			seen = append(seen, passes)
		},
	}
	if err := r.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if probes != 7 {
		t.Errorf("%d probes, want 7 (recovered on the third pass in a row)", probes)
	}
	if want := []int{0, 1, 2, 0, 1, 2, 3}; !reflect.DeepEqual(seen, want) {
		t.Errorf("streaks %v, want %v", seen, want)
	}
}

func TestRecoveryStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	probes := 0
	r := Recovery{Passes: 2, Interval: time.Millisecond, Probe: func(context.Context) error {
		probes++
		if probes == 5 {
			cancel()
		}
		return errors.New("still broken")
	}}
	if err := r.Run(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, want context.Canceled", err)
	}
	if probes != 5 {
		t.Errorf("%d probes after cancel, want 5", probes)
	}
}

// The GPU half of a probe: a monitor's Check fails once after a fault, so a recovery needs its
// full streak after the last fault.
func TestRecoveryWithMonitorCheck(t *testing.T) {
	h := newFakeHost(h100(0))
	m, changes := newMonitor(t, h, MonitorConfig{})
	run(t, m)
	h.xid(0, 94)
	next(t, changes)
	probes := 0
	r := Recovery{Passes: 2, Interval: time.Millisecond, Probe: func(context.Context) error {
		probes++
		if probes == 2 {
			h.xid(0, 94) // it happens again mid-recovery (still unhealthy, so no change is reported)
			for m.Snapshot()[0].XidErrors != 2 {
				time.Sleep(time.Millisecond)
			}
		}
		return m.Check(0)
	}}
	if err := r.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	// 1 fails (first Xid), 2 fails (second Xid), 3 and 4 pass.
	if probes != 4 {
		t.Errorf("%d probes, want 4", probes)
	}
}
