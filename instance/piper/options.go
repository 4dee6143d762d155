package piper

import (
	"fmt"

	"github.com/voxmux/voxmux/instance/engine"
	"github.com/voxmux/voxmux/instance/ort"
	"github.com/voxmux/voxmux/tts"
)

// Options are the piper family's engine options, set under a group's `engine:` (docs/piper.md,
// "Batching"). The zero value of each is the default for the provider (piperOptionsFrom).
type Options struct {
	ort.Options
	// Batch is the most sentences of one voice run as one graph run, 1 to 1024 (1: no batching).
	// 0: 64 on CUDA, 1 on the CPU (docs/piper.md, "Batching").
	Batch int `json:"piper_batch"`
	// Workers is how many graph runs of one voice run at once, 1 to 256. 0: 2 on CUDA (one run's
	// host work overlaps the other's kernels), max_inflight on the CPU.
	Workers int `json:"piper_workers"`
	// Queue is how many sentences may wait per voice before requests are refused as busy (HTTP
	// 429), 1 to 1048576. 0: 1024.
	Queue int `json:"piper_queue"`
}

// Name is the family's name, the Kind of its descriptions.
func (Family) Name() string { return "piper" }

// OptionKeys are the keys of Options.
func (Family) OptionKeys() []string { return engine.OptionKeys(Options{}) }

// ParseOptions parses and checks a group's engine section.
func (Family) ParseOptions(section tts.EngineSection) (any, error) { return parseOptions(section) }

func parseOptions(section tts.EngineSection) (Options, error) {
	return engine.Parse[Options]("piper", section)
}

// Validate checks every option; the error is a *tts.OptionError naming the first bad one.
func (o Options) Validate() error {
	if err := o.Options.Validate(); err != nil {
		return err
	}
	for _, r := range []struct {
		key     string
		v, most int
	}{{"piper_batch", o.Batch, 1024}, {"piper_workers", o.Workers, 256}, {"piper_queue", o.Queue, 1 << 20}} {
		if r.v < 0 || r.v > r.most {
			return &tts.OptionError{Key: r.key, Msg: fmt.Sprintf("%d is not a number from 1 to %d", r.v, r.most)}
		}
	}
	return nil
}
