// Package voxcpm serves VoxCPM 1.5 exports (pipeline.yaml with kind: voxcpm; docs/voxcpm.md is
// the graph contract): one scheduler goroutine prefills requests in groups into slots of two
// shared in-place caches (the base and the residual LM's) and advances every running request by
// one patch per step, the step graph running once over all the slots in use; the streaming
// AudioVAE decoder then decodes that patch for every slot on a goroutine of its own, beside the
// next step.
package voxcpm
