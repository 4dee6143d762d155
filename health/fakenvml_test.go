package health

import (
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// fakeGPU is a scriptable GPU behind go-nvml's mock.Device: tests change its figures and faults
// while the monitor reads it through the real adapter.
type fakeGPU struct {
	mu        sync.Mutex
	uuid      string
	name      string
	used      uint64
	total     uint64
	util      uint32
	temp      uint32
	slowdown  uint32 // 0: not supported
	powerMW   uint32 // 0: not supported
	throttle  uint64
	corr      uint64
	uncorr    uint64
	noECC     bool
	noEvents  bool
	lost      bool // every call fails as when the GPU fell off the bus
	dev       *mock.Device
	registers int
}

func (g *fakeGPU) set(f func(g *fakeGPU)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	f(g)
}

// get runs f under the GPU's lock and answers GPU_IS_LOST when the GPU is lost.
func (g *fakeGPU) get(f func() nvml.Return) nvml.Return {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.lost {
		return nvml.ERROR_GPU_IS_LOST
	}
	return f()
}

func (g *fakeGPU) device() *mock.Device {
	if g.dev != nil {
		return g.dev
	}
	g.dev = &mock.Device{
		GetUUIDFunc: func() (s string, r nvml.Return) {
			r = g.get(func() nvml.Return { s = g.uuid; return nvml.SUCCESS })
			return
		},
		GetNameFunc: func() (s string, r nvml.Return) {
			r = g.get(func() nvml.Return { s = g.name; return nvml.SUCCESS })
			return
		},
		GetMemoryInfoFunc: func() (m nvml.Memory, r nvml.Return) {
			r = g.get(func() nvml.Return {
				m = nvml.Memory{Used: g.used, Total: g.total, Free: g.total - g.used}
				return nvml.SUCCESS
			})
			return
		},
		GetUtilizationRatesFunc: func() (u nvml.Utilization, r nvml.Return) {
			r = g.get(func() nvml.Return { u = nvml.Utilization{Gpu: g.util}; return nvml.SUCCESS })
			return
		},
		GetTemperatureFunc: func(nvml.TemperatureSensors) (t uint32, r nvml.Return) {
			r = g.get(func() nvml.Return { t = g.temp; return nvml.SUCCESS })
			return
		},
		GetTemperatureThresholdFunc: func(th nvml.TemperatureThresholds) (t uint32, r nvml.Return) {
			r = g.get(func() nvml.Return {
				if th != nvml.TEMPERATURE_THRESHOLD_SLOWDOWN || g.slowdown == 0 {
					return nvml.ERROR_NOT_SUPPORTED
				}
				t = g.slowdown
				return nvml.SUCCESS
			})
			return
		},
		GetPowerUsageFunc: func() (p uint32, r nvml.Return) {
			r = g.get(func() nvml.Return {
				if g.powerMW == 0 {
					return nvml.ERROR_NOT_SUPPORTED
				}
				p = g.powerMW
				return nvml.SUCCESS
			})
			return
		},
		GetCurrentClocksEventReasonsFunc: func() (m uint64, r nvml.Return) {
			r = g.get(func() nvml.Return { m = g.throttle; return nvml.SUCCESS })
			return
		},
		GetTotalEccErrorsFunc: func(t nvml.MemoryErrorType, c nvml.EccCounterType) (n uint64, r nvml.Return) {
			r = g.get(func() nvml.Return {
				if g.noECC {
					return nvml.ERROR_NOT_SUPPORTED
				}
				if c != nvml.VOLATILE_ECC {
					return nvml.ERROR_INVALID_ARGUMENT
				}
				n = g.corr
				if t == nvml.MEMORY_ERROR_TYPE_UNCORRECTED {
					n = g.uncorr
				}
				return nvml.SUCCESS
			})
			return
		},
		GetSupportedEventTypesFunc: func() (m uint64, r nvml.Return) {
			r = g.get(func() nvml.Return {
				if g.noEvents {
					return nvml.ERROR_NOT_SUPPORTED
				}
				m = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError
				return nvml.SUCCESS
			})
			return
		},
		RegisterEventsFunc: func(mask uint64, _ nvml.EventSet) nvml.Return {
			return g.get(func() nvml.Return {
				if mask != nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError {
					return nvml.ERROR_INVALID_ARGUMENT
				}
				g.registers++
				return nvml.SUCCESS
			})
		},
	}
	return g.dev
}

// waitResult is one scripted answer of EventSet.Wait.
type waitResult struct {
	data nvml.EventData
	ret  nvml.Return
}

// fakeHost is a scriptable NVML: its GPUs, and the events its event set delivers.
type fakeHost struct {
	gpus      []*fakeGPU
	initRet   nvml.Return
	handleErr map[int]nvml.Return // DeviceGetHandleByIndex fails for these indices
	events    chan waitResult
	mu        sync.Mutex
	lib       *mock.Interface
	set       *mock.EventSet
}

func newFakeHost(gpus ...*fakeGPU) *fakeHost {
	h := &fakeHost{gpus: gpus, events: make(chan waitResult, 16), handleErr: map[int]nvml.Return{}}
	h.set = &mock.EventSet{
		WaitFunc: func(ms uint32) (nvml.EventData, nvml.Return) {
			select {
			case w := <-h.events:
				return w.data, w.ret
			case <-time.After(time.Duration(ms) * time.Millisecond):
				return nvml.EventData{}, nvml.ERROR_TIMEOUT
			}
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
	h.lib = &mock.Interface{
		InitFunc:           func() nvml.Return { return h.initRet },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(h.gpus), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			h.mu.Lock()
			defer h.mu.Unlock()
			if r, ok := h.handleErr[i]; ok {
				return nil, r
			}
			if i < 0 || i >= len(h.gpus) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			return h.gpus[i].device(), nvml.SUCCESS
		},
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) { return h.set, nvml.SUCCESS },
	}
	return h
}

// xid scripts a critical Xid event on GPU i.
func (h *fakeHost) xid(i int, xid uint64) {
	h.events <- waitResult{data: nvml.EventData{Device: h.gpus[i].device(), EventType: nvml.EventTypeXidCriticalError, EventData: xid}}
}

func (h *fakeHost) nvml() NVML { return NewNVML(h.lib) }

func h100(i int) *fakeGPU {
	return &fakeGPU{
		uuid: "GPU-0000000" + string(rune('0'+i)), name: "NVIDIA H100 80GB HBM3",
		used: 1 << 30, total: 80 << 30, util: 42, temp: 40, slowdown: 87, powerMW: 123456,
	}
}
