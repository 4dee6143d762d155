package engine

import "fmt"

// OpenReplicas opens one engine per device with open, device by device in order (so the first
// engine, which holds what runs once per model, is device 0's), and returns the one engine itself
// or Replicas over them all. When one fails, those already open are closed and the error names
// the device.
func OpenReplicas[E Replica](devices int, open func(device int) (E, error)) (Replica, error) {
	engines := make([]E, 0, devices)
	for d := range max(devices, 1) {
		e, err := open(d)
		if err != nil {
			for _, e := range engines {
				e.Close()
			}
			return nil, fmt.Errorf("device %d: %w", d, err)
		}
		engines = append(engines, e)
	}
	if len(engines) == 1 {
		return engines[0], nil
	}
	return NewReplicas(engines), nil
}
