// Package manifest reads the YAML manifests of every model family the same way: unknown and
// repeated keys refused, errors naming the file and, for a key, its line.
package manifest

import (
	"bytes"
	"fmt"
	"os"

	"github.com/goccy/go-yaml"
)

// Read decodes the manifest at path into v, which the family then checks. what names the kind
// of manifest in errors ("voxcpm manifest").
func Read(path, what string, v any) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if err := yaml.UnmarshalWithOptions(data, v, yaml.DisallowUnknownField(), yaml.Strict()); err != nil {
		return fmt.Errorf("%s %s: %s", what, path, yaml.FormatError(err, false, true))
	}
	return nil
}

// Kind reads only a manifest's top-level kind, which says the family it is for: "" where path is
// no readable YAML file (a binary file included) or names none.
func Kind(path string) string {
	data, err := os.ReadFile(path)
	if err != nil || bytes.IndexByte(data, 0) >= 0 {
		return ""
	}
	var k struct {
		Kind string `yaml:"kind"`
	}
	if yaml.Unmarshal(data, &k) != nil {
		return ""
	}
	return k.Kind
}
