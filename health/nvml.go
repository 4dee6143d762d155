// Package health watches the GPUs of a host through NVML (Xid events, ECC errors, temperature)
// and keeps this host's registration in Consul true to whether it can serve.
//
// Both outside systems sit behind narrow interfaces (NVML, Agent) with one adapter each over the
// real client (go-nvml, consul/api); main builds the clients once and passes them in.
package health

import (
	"errors"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

var (
	// ErrNoNVML means the NVIDIA driver's NVML library could not be loaded or initialised: a host
	// without NVIDIA GPUs, or a container without the driver mounted.
	ErrNoNVML = errors.New("no NVIDIA driver/NVML on this host")
	// ErrNotSupported means the GPU does not report a figure (ECC on consumer GPUs, power on some);
	// it is not a fault.
	ErrNotSupported = errors.New("not supported by this GPU")
	// ErrTimeout is what EventSet.Wait returns when no event came in time.
	ErrTimeout = errors.New("no event before the timeout")
)

// NVML is the part of the NVIDIA Management Library the monitor uses.
type NVML interface {
	Init() error
	Shutdown() error
	DeviceCount() (int, error)
	// Device returns the GPU at an NVML index (PCI bus order, as nvidia-smi numbers them).
	Device(index int) (Device, error)
	NewEventSet() (EventSet, error)
}

// Device is one GPU. Methods return an error wrapping ErrNotSupported for figures the GPU lacks.
type Device interface {
	UUID() (string, error)
	Name() (string, error)
	Memory() (used, total uint64, err error)
	// Utilization is the percentage of the last sample period the GPU was busy.
	Utilization() (percent uint32, err error)
	Temperature() (celsius uint32, err error)
	// SlowdownTemperature is where the GPU starts to throttle itself.
	SlowdownTemperature() (celsius uint32, err error)
	PowerUsage() (milliwatts uint32, err error)
	// ClockEventReasons is the bit mask of why clocks are held down (nvmlClocksEventReason*).
	ClockEventReasons() (uint64, error)
	// ECCErrors are the volatile (since driver load) corrected and uncorrected error counts.
	ECCErrors() (corrected, uncorrected uint64, err error)
	// RegisterEvents subscribes set to the GPU's critical Xid and double-bit ECC events.
	RegisterEvents(set EventSet) error
}

// EventKind is the kind of an NVML event the monitor subscribes to.
type EventKind int

// Event kinds.
const (
	EventOther EventKind = iota
	EventXid
	EventDoubleBitECC
)

// Event is one NVML event.
type Event struct {
	Kind EventKind
	// DeviceUUID is the GPU the event is about; empty when NVML could not say.
	DeviceUUID string
	// Xid is the Xid error code of an EventXid.
	Xid uint64
}

// EventSet delivers the events of the GPUs registered on it.
type EventSet interface {
	// Wait blocks up to timeout for the next event; it returns ErrTimeout when none came.
	Wait(timeout time.Duration) (Event, error)
	Free() error
}

// NewNVML adapts a go-nvml library (nvml.New(), or a mock in tests). Nothing is loaded until Init.
func NewNVML(lib nvml.Interface) NVML { return nvmlLib{lib} }

type nvmlLib struct{ lib nvml.Interface }

// ret turns an NVML return code into an error that says what was asked.
func ret(op string, r nvml.Return) error {
	switch r {
	case nvml.SUCCESS:
		return nil
	case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND:
		return fmt.Errorf("%s: %w", op, ErrNotSupported)
	case nvml.ERROR_TIMEOUT:
		return ErrTimeout
	}
	return fmt.Errorf("%s: %w", op, r)
}

func (l nvmlLib) Init() error {
	if r := l.lib.Init(); r != nvml.SUCCESS {
		return fmt.Errorf("%w: nvmlInit: %w", ErrNoNVML, r)
	}
	return nil
}

func (l nvmlLib) Shutdown() error { return ret("nvmlShutdown", l.lib.Shutdown()) }

func (l nvmlLib) DeviceCount() (int, error) {
	n, r := l.lib.DeviceGetCount()
	return n, ret("nvmlDeviceGetCount", r)
}

func (l nvmlLib) Device(index int) (Device, error) {
	d, r := l.lib.DeviceGetHandleByIndex(index)
	if err := ret(fmt.Sprintf("nvmlDeviceGetHandleByIndex(%d)", index), r); err != nil {
		return nil, err
	}
	return nvmlDevice{d}, nil
}

func (l nvmlLib) NewEventSet() (EventSet, error) {
	s, r := l.lib.EventSetCreate()
	if err := ret("nvmlEventSetCreate", r); err != nil {
		return nil, err
	}
	return nvmlEventSet{s}, nil
}

type nvmlDevice struct{ d nvml.Device }

func (d nvmlDevice) UUID() (string, error) {
	s, r := d.d.GetUUID()
	return s, ret("nvmlDeviceGetUUID", r)
}

func (d nvmlDevice) Name() (string, error) {
	s, r := d.d.GetName()
	return s, ret("nvmlDeviceGetName", r)
}

func (d nvmlDevice) Memory() (uint64, uint64, error) {
	m, r := d.d.GetMemoryInfo()
	return m.Used, m.Total, ret("nvmlDeviceGetMemoryInfo", r)
}

func (d nvmlDevice) Utilization() (uint32, error) {
	u, r := d.d.GetUtilizationRates()
	return u.Gpu, ret("nvmlDeviceGetUtilizationRates", r)
}

func (d nvmlDevice) Temperature() (uint32, error) {
	t, r := d.d.GetTemperature(nvml.TEMPERATURE_GPU)
	return t, ret("nvmlDeviceGetTemperature", r)
}

func (d nvmlDevice) SlowdownTemperature() (uint32, error) {
	t, r := d.d.GetTemperatureThreshold(nvml.TEMPERATURE_THRESHOLD_SLOWDOWN)
	return t, ret("nvmlDeviceGetTemperatureThreshold", r)
}

func (d nvmlDevice) PowerUsage() (uint32, error) {
	p, r := d.d.GetPowerUsage()
	return p, ret("nvmlDeviceGetPowerUsage", r)
}

func (d nvmlDevice) ClockEventReasons() (uint64, error) {
	m, r := d.d.GetCurrentClocksEventReasons()
	if r == nvml.ERROR_FUNCTION_NOT_FOUND {
		// Drivers before 535 only have the older name of the same call.
		m, r = d.d.GetCurrentClocksThrottleReasons()
	}
	return m, ret("nvmlDeviceGetCurrentClocksEventReasons", r)
}

func (d nvmlDevice) ECCErrors() (uint64, uint64, error) {
	c, r := d.d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_CORRECTED, nvml.VOLATILE_ECC)
	if err := ret("nvmlDeviceGetTotalEccErrors(corrected)", r); err != nil {
		return 0, 0, err
	}
	u, r := d.d.GetTotalEccErrors(nvml.MEMORY_ERROR_TYPE_UNCORRECTED, nvml.VOLATILE_ECC)
	return c, u, ret("nvmlDeviceGetTotalEccErrors(uncorrected)", r)
}

func (d nvmlDevice) RegisterEvents(set EventSet) error {
	s, ok := set.(nvmlEventSet)
	if !ok {
		return fmt.Errorf("nvmlDeviceRegisterEvents: event set %T is not from this NVML", set)
	}
	supported, r := d.d.GetSupportedEventTypes()
	if err := ret("nvmlDeviceGetSupportedEventTypes", r); err != nil {
		return err
	}
	mask := uint64(nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError) & supported
	if mask == 0 {
		return fmt.Errorf("nvmlDeviceRegisterEvents: %w", ErrNotSupported)
	}
	return ret("nvmlDeviceRegisterEvents", d.d.RegisterEvents(mask, s.s))
}

type nvmlEventSet struct{ s nvml.EventSet }

func (s nvmlEventSet) Wait(timeout time.Duration) (Event, error) {
	e, r := s.s.Wait(uint32(timeout.Milliseconds()))
	if err := ret("nvmlEventSetWait", r); err != nil {
		return Event{}, err
	}
	ev := Event{Kind: EventOther}
	switch e.EventType {
	case nvml.EventTypeXidCriticalError:
		ev.Kind, ev.Xid = EventXid, e.EventData
	case nvml.EventTypeDoubleBitEccError:
		ev.Kind = EventDoubleBitECC
	}
	if e.Device != nil {
		if uuid, r := e.Device.GetUUID(); r == nvml.SUCCESS {
			ev.DeviceUUID = uuid
		}
	}
	return ev, nil
}

func (s nvmlEventSet) Free() error { return ret("nvmlEventSetFree", s.s.Free()) }

// clockEventReasonNames names the bits of nvmlClocksEventReason*, for logs and metric labels.
var clockEventReasonNames = []struct {
	bit  uint64
	name string
}{
	{nvml.ClocksEventReasonGpuIdle, "gpu_idle"},
	{nvml.ClocksEventReasonApplicationsClocksSetting, "applications_clocks_setting"},
	{nvml.ClocksEventReasonSwPowerCap, "sw_power_cap"},
	{nvml.ClocksThrottleReasonHwSlowdown, "hw_slowdown"},
	{nvml.ClocksEventReasonSyncBoost, "sync_boost"},
	{nvml.ClocksEventReasonSwThermalSlowdown, "sw_thermal_slowdown"},
	{nvml.ClocksThrottleReasonHwThermalSlowdown, "hw_thermal_slowdown"},
	{nvml.ClocksThrottleReasonHwPowerBrakeSlowdown, "hw_power_brake_slowdown"},
	{nvml.ClocksEventReasonDisplayClockSetting, "display_clock_setting"},
}

// ClockEventReasonNames decodes a clock event (throttle) reason mask.
func ClockEventReasonNames(mask uint64) []string {
	var names []string
	for _, r := range clockEventReasonNames {
		if mask&r.bit != 0 {
			names = append(names, r.name)
		}
	}
	return names
}
