package config

import (
	"fmt"
	"time"
)

// Duration is a time.Duration written in YAML as "30s", "5m".
type Duration time.Duration

// UnmarshalText parses Go duration syntax.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("%q is not a duration like 30s or 5m", string(b))
	}
	*d = Duration(v)
	return nil
}

// Std returns the value as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }
