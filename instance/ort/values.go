package ort

import (
	"fmt"

	onnxrt "github.com/yalue/onnxruntime_go"
)

// Floats is the data of a float32 output.
func Floats(v onnxrt.Value) ([]float32, error) {
	t, ok := v.(*onnxrt.Tensor[float32])
	if !ok {
		return nil, fmt.Errorf("output is %T, want a float32 tensor", v)
	}
	return t.GetData(), nil
}

// Destroy frees values; nil ones are skipped.
func Destroy(vals []onnxrt.Value) {
	for _, v := range vals {
		if v != nil {
			v.Destroy()
		}
	}
}
