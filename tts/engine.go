package tts

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// EngineSection is a group's `engine:` section as a JSON object: the options of the model family
// that serves the group, which alone knows their keys and parses them (instance.Family). The
// config, the router and the plugin carry it as it is, so a family's new option touches that
// family only. Empty (or JSON null): the group sets no engine option.
type EngineSection []byte

// EngineField is one key of an EngineSection and its value, as JSON.
type EngineField struct {
	Key   string
	Value json.RawMessage
}

// Fields lists the section's keys and values in the order the section gives them; an error when
// the section is not a JSON object.
func (s EngineSection) Fields() ([]EngineField, error) {
	if len(bytes.TrimSpace(s)) == 0 {
		return nil, nil
	}
	d := json.NewDecoder(bytes.NewReader(s))
	t, err := d.Token()
	if err != nil {
		return nil, fmt.Errorf("engine section: %w", err)
	}
	if t == nil {
		return nil, nil // null: no section
	}
	if t != json.Delim('{') {
		return nil, errors.New("is not a mapping of engine options to their values")
	}
	var out []EngineField
	for d.More() {
		k, err := d.Token()
		if err != nil {
			return nil, fmt.Errorf("engine section: %w", err)
		}
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return nil, fmt.Errorf("engine section: %w", err)
		}
		out = append(out, EngineField{Key: k.(string), Value: v})
	}
	return out, nil
}

// OptionError is an invalid engine option: Key is its name under `engine:`.
type OptionError struct {
	Key string
	Msg string
}

func (e *OptionError) Error() string { return "engine." + e.Key + ": " + e.Msg }

// MemoryLimit caps ONNX Runtime's CUDA arena on each GPU: Bytes, or else a Fraction of the
// device's memory in (0, 1]. The zero value sets no cap.
type MemoryLimit struct {
	Bytes    uint64
	Fraction float64
}

// IsZero reports whether the limit sets no cap.
func (l MemoryLimit) IsZero() bool { return l.Bytes == 0 && l.Fraction == 0 }
