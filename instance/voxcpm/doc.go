// Package voxcpm serves VoxCPM 1.5 exports (pipeline.yaml with kind: voxcpm; docs/voxcpm.md is
// the graph contract): one scheduler goroutine owns the graphs, prefills each request into a slot
// of two shared in-place caches (the base and the residual LM's) and advances every running
// request by one patch per step, the step graph and the streaming AudioVAE decoder each running
// once over all the slots in use.
package voxcpm
