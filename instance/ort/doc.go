// Package ort is voxmux's binding to ONNX Runtime: the per-process Runtime that makes sessions
// for a provider and device, the graph I/O reader, CUDA device listing, and (in iobind) the
// I/O-binding layer that keeps tensors on the GPU and replays CUDA graphs. It knows sessions and
// devices, not models.
package ort
