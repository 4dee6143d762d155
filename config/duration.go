package config

import (
	"fmt"
	"time"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
)

// Duration is a time.Duration written in YAML as "30s", "5m".
type Duration time.Duration

// UnmarshalYAML parses Go duration syntax; errors carry the value's position, so the message
// names the line.
func (d *Duration) UnmarshalYAML(node ast.Node) error {
	s, ok := node.(*ast.StringNode)
	if !ok {
		return &yaml.SyntaxError{Message: fmt.Sprintf("%s is not a duration like 30s or 5m", node.String()), Token: node.GetToken()}
	}
	v, err := time.ParseDuration(s.Value)
	if err != nil {
		return &yaml.SyntaxError{Message: fmt.Sprintf("%q is not a duration like 30s or 5m", s.Value), Token: node.GetToken()}
	}
	*d = Duration(v)
	return nil
}

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
