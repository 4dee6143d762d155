package engine

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/voxmux/voxmux/tts"
)

// ParseOptions decodes a family's `engine:` section into dst, a pointer to the family's options
// struct: each field is a key, named by its json tag, and an embedded struct's fields are keys of
// the family too (a set shared by several families, such as ort.Options). Each key is decoded on
// its own, so every error is a *tts.OptionError naming its key; an unknown key lists the
// family's keys. A key whose value is null stays unset.
func ParseOptions(family string, section tts.EngineSection, dst any) error {
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("engine options of the %s family: %T is not a pointer to a struct", family, dst)
	}
	fields, err := section.Fields()
	if err != nil {
		return err
	}
	keys := optionFields(v.Elem().Type())
	for _, f := range fields {
		k, ok := keys[f.Key]
		if !ok {
			return &tts.OptionError{Key: f.Key, Msg: fmt.Sprintf("unknown key; the %s family's keys are %s",
				family, strings.Join(OptionKeys(dst), ", "))}
		}
		field := v.Elem().FieldByIndex(k.index)
		if err := json.Unmarshal(f.Value, field.Addr().Interface()); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) {
				return &tts.OptionError{Key: f.Key, Msg: fmt.Sprintf("%s is not %s", f.Value, describe(field.Type()))}
			}
			return &tts.OptionError{Key: f.Key, Msg: err.Error()}
		}
	}
	return nil
}

// Parse decodes section into a family's options O (ParseOptions) and checks them with their
// Validate.
func Parse[O interface{ Validate() error }](family string, section tts.EngineSection) (O, error) {
	var o O
	if err := ParseOptions(family, section, &o); err != nil {
		var zero O
		return zero, err
	}
	return o, o.Validate()
}

// OptionKeys lists the keys of the options struct v points to (or is), in the order of its fields.
func OptionKeys(v any) []string {
	t := reflect.TypeOf(v)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var keys []string
	walkOptions(t, nil, func(key string, _ []int) { keys = append(keys, key) })
	return keys
}

// ParseEnum reads s as one of allowed: the UnmarshalText of a family's string-kinded options. An
// empty string is the zero value, the option unset.
func ParseEnum[T ~string](s []byte, allowed ...T) (T, error) {
	if len(s) == 0 {
		return "", nil
	}
	for _, a := range allowed {
		if string(s) == string(a) {
			return a, nil
		}
	}
	return "", fmt.Errorf("%q is not one of %v", s, allowed)
}

type optionField struct{ index []int }

func optionFields(t reflect.Type) map[string]optionField {
	m := map[string]optionField{}
	walkOptions(t, nil, func(key string, index []int) { m[key] = optionField{index} })
	return m
}

// walkOptions calls fn for every key of the struct type t, in field order, with the field's index
// path from the outermost struct.
func walkOptions(t reflect.Type, prefix []int, fn func(key string, index []int)) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		index := append(append([]int(nil), prefix...), i)
		switch {
		case name == "-" || !f.IsExported():
		case name == "" && f.Anonymous && f.Type.Kind() == reflect.Struct:
			walkOptions(f.Type, index, fn)
		case name != "":
			fn(name, index)
		}
	}
}

var textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()

// describe says what a value of type t is written as, for an error.
func describe(t reflect.Type) string {
	if reflect.PointerTo(t).Implements(textUnmarshaler) {
		return "a string"
	}
	switch t.Kind() {
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Slice:
		return "a list of " + strings.TrimPrefix(describe(t.Elem()), "a ") + "s"
	}
	return "a " + t.String()
}

// Precision is the float type a family's graph computes in, an option of the families that can
// convert a graph to float16 in memory (piper_precision, vocoder_precision). Unset: float32.
type Precision string

const (
	Float32 Precision = "float32"
	Float16 Precision = "float16"
)

func (p *Precision) UnmarshalText(b []byte) (err error) {
	*p, err = ParseEnum(b, Float32, Float16)
	return err
}
