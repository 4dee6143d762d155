package ort

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// FindLibrary finds libonnxruntime.so for tests and tools run from inside the source tree: $ORT_LIB,
// else third_party/onnxruntime/ of the module that holds the working directory (where
// scripts/install-onnxruntime.sh puts it).
func FindLibrary() (string, error) {
	if p := os.Getenv("ORT_LIB"); p != "" {
		return p, nil
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(dir, "third_party", "onnxruntime", "libonnxruntime.so")
			if _, err := os.Stat(p); err != nil {
				return "", fmt.Errorf("ONNX Runtime not installed (run scripts/install-onnxruntime.sh or set ORT_LIB): %w", err)
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("ONNX Runtime not found: set ORT_LIB, or run inside the source tree")
		}
		dir = parent
	}
}
