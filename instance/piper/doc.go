// Package piper is the Piper model family: VITS voices as Piper publishes them (an .onnx with its
// .onnx.json), phonemized by espeak-ng, one graph run per sentence (docs/piper.md).
package piper
