package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/voxmux/voxmux/config"
	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/instance/staged"
	"github.com/voxmux/voxmux/tts"
)

// stagesCmd is `voxmux bench stages`: each batched stage of the configured model timed alone, in
// this process, so a load test's numbers can be read against what each stage can do.
func stagesCmd() *cobra.Command {
	var cfgPath, group, jsonOut string
	var batches, tokens []int
	var runs int
	var together, vary bool
	cmd := &cobra.Command{
		Use:   "stages",
		Short: "Time each batched stage (LM decode step, flow, vocoder) of the configured model alone",
		Long: "stages loads the model of --config in this process with the group's provider options and times\n" +
			"the LM decode step, the whole flow (encoder and every solver step) and the vocoder at each batch\n" +
			"size, for items of each length in speech tokens. It uses the first GPU this process sees (set\n" +
			"CUDA_VISIBLE_DEVICES to choose); run it on an idle GPU, not beside a serving router.\n" +
			"With --together each shape is timed again with the three stages running at once, as they do\n" +
			"in a serving instance. A flow shape larger than the model's flow.max_batch_frames is not run\n" +
			"(on CUDA it would crash the process) and shows as skipped, with the reason.\n" +
			"The group's provider option profile (a path prefix) makes ONNX Runtime\n" +
			"write a profile of each session when the command ends (scripts/common/ort_profile_summary.py reads them).",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if runs < 1 {
				return fmt.Errorf("--runs: %d must be at least 1", runs)
			}
			for _, v := range append(append([]int(nil), batches...), tokens...) {
				if v < 1 {
					return fmt.Errorf("--batch and --tokens: %d must be at least 1", v)
				}
			}
			cfg, err := config.Load(cfgPath)
			if err != nil {
				return err
			}
			if err := cfg.CheckEngines(instance.Families{staged.Family{}}); err != nil {
				return err
			}
			g := cfg.Groups[0]
			if group != "" {
				found := false
				for _, x := range cfg.Groups {
					if x.Name == group {
						g, found = x, true
					}
				}
				if !found {
					return fmt.Errorf("--group %q: no such group in %s", group, cfgPath)
				}
			}
			ortLib, err := findORT(cfg)
			if err != nil {
				return err
			}
			p, err := staged.LoadPipeline(stagesLoad(cfg, g, ortLib, batches))
			if err != nil {
				return err
			}
			defer p.Close()
			w := cmd.OutOrStdout()
			how := "each shape fixed"
			if vary {
				how = "each flow and vocoder run one token longer than the last"
			}
			fmt.Fprintf(w, "# Stages of %s, each alone (%s; %s)\n\n", cfg.ModelPath(), cfg.Provider, how)
			fmt.Fprintln(w, "| stage | batch | tokens | ms per run | median ms | fastest ms | audio s per s |")
			fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|")
			res, err := p.ProfileStages(staged.StageProfile{Batches: batches, Tokens: tokens, Runs: runs, Together: together, Vary: vary}, func(t staged.StageTiming) {
				fmt.Fprintf(cmd.ErrOrStderr(), "timing %s: batch %d × %d tokens ...\n", t.Stage, t.Batch, t.Tokens)
			})
			writeStages(w, res)
			if jsonOut != "" && len(res) > 0 {
				b, _ := json.MarshalIndent(res, "", "  ")
				if werr := os.WriteFile(jsonOut, append(b, '\n'), 0o644); werr != nil {
					return fmt.Errorf("--json: %w", werr)
				}
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfgPath, "config", "voxmux.yaml", "serve's config file: model, provider, onnxruntime and the group's options")
	f.StringVar(&group, "group", "", "group whose provider options apply (default: the first)")
	f.IntSliceVar(&batches, "batch", []int{1, 8, 32, 64}, "batch sizes")
	f.IntSliceVar(&tokens, "tokens", []int{15, 115}, "item lengths in speech tokens (a flow chunk with its context; the LM's cache length)")
	f.IntVar(&runs, "runs", 5, "timed runs per shape, after one untimed run")
	f.BoolVar(&together, "together", false, "also time each shape with the three stages running at once")
	f.BoolVar(&vary, "vary", false, "make each flow and vocoder run one token longer than the last, as a server's batches change shape")
	f.StringVar(&jsonOut, "json", "", "also write the timings to this JSON file")
	return cmd
}

// stagesLoad is what bench stages loads for group g: the group's pipeline on this process's one
// device, with room for the largest batch. The LM's CUDA graphs hold one sequence per request
// the instance takes at once (max_inflight, 16 unless set), and a timing of 32 rows needs 32.
func stagesLoad(cfg *config.Config, g config.Group, ortLib string, batches []int) tts.LoadConfig {
	load := memberSpec(cfg, g, 0, "", ortLib).Load
	load.Placement = "" // one device: this process
	if len(batches) > 0 {
		load.MaxInflight = max(load.MaxInflight, slices.Max(batches))
	}
	return load
}

func writeStages(w io.Writer, res []staged.StageTiming) {
	for _, t := range res {
		stage := t.Stage
		if t.Together {
			stage += ", with the others"
		}
		if t.Skipped != "" {
			fmt.Fprintf(w, "| %s | %d | %d | skipped: %s | | | |\n", stage, t.Batch, t.Tokens, t.Skipped)
			continue
		}
		ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
		fmt.Fprintf(w, "| %s | %d | %d | %.1f | %.1f | %.1f | %.0f |\n", stage, t.Batch, t.Tokens,
			ms(t.Mean), ms(t.Median), ms(t.Min), t.AudioPerSecond)
	}
}
