package instance_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/voxmux/voxmux/config"
)

// checkEngine loads a config of one group serving model with the given engine section, and has
// the families check it as serve does; the error, if any, comes with the config's file.
func checkEngine(t *testing.T, model, group string) (string, error) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "voxmux.yaml")
	data := "model: " + model + "\ngroups:\n  - name: g\n" + group
	if err := os.WriteFile(file, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := config.Load(file)
	if err != nil {
		t.Fatal(err)
	}
	return file, c.CheckEngines(families())
}

// Each family parses its own engine options when the config loads: a key of another family is
// refused naming the family it belongs to, and a value outside a typed enum naming its values;
// every error names the key, its line and the file.
func TestEngineOptionsOfTheServingFamily(t *testing.T) {
	dir := t.TempDir()
	voxcpmModel := filepath.Join(dir, "voxcpm.yaml")
	if err := os.WriteFile(voxcpmModel, []byte("kind: voxcpm\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	piperModel, err := filepath.Abs("../models/tiny-piper/en_US-tiny-x_low.onnx")
	if err != nil {
		t.Fatal(err)
	}
	stagedModel, err := filepath.Abs("../models/tiny/pipeline.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, model, group string
		want               []string
	}{
		{"staged key on a voxcpm group", voxcpmModel, "    engine:\n      lm_cuda_graph: \"on\"\n      flow_workers: 2\n",
			[]string{":6:", "groups[0].engine.flow_workers", "flow_workers is an option of the staged family", "served by the voxcpm family"}},
		{"staged key on a piper group", piperModel, "    engine: {piper_batch: 8, vocoder_window: 40}\n",
			[]string{":4:", "groups[0].engine.vocoder_window", "option of the staged family", "served by the piper family"}},
		{"key of two other families", piperModel, "    engine:\n      lm_cuda_graph: \"on\"\n",
			[]string{":5:", "groups[0].engine.lm_cuda_graph", "option of the voxcpm/staged family", "served by the piper family"}},
		{"piper key on a staged group", stagedModel, "    engine:\n      piper_queue: 8\n",
			[]string{":5:", "groups[0].engine.piper_queue", "option of the piper family", "served by the staged family"}},
		{"unknown key", piperModel, "    engine:\n      piper_batches: 8\n",
			[]string{":5:", "groups[0].engine.piper_batches", "unknown key; the piper family's keys are ", "piper_batch, piper_workers"}},
		{"bad enum value", stagedModel, "    engine:\n      flow_first_worker: both\n",
			[]string{":5:", "groups[0].engine.flow_first_worker", `"both" is not one of [keep share]`}},
		{"negative LM minimum", stagedModel, "    engine:\n      lm_min_tokens_per_text_token: -2\n",
			[]string{":5:", "groups[0].engine.lm_min_tokens_per_text_token", "-2 is not a number of speech tokens per text token"}},
		{"LM minimum not a number", stagedModel, "    engine:\n      lm_min_tokens_per_text_token: realistic\n",
			[]string{":5:", "groups[0].engine.lm_min_tokens_per_text_token"}},
		{"bad voxcpm enum value", voxcpmModel, "    engine:\n      vocoder_cuda_graph: fixed\n",
			[]string{":5:", "groups[0].engine.vocoder_cuda_graph", `"fixed" is not one of [on off]`}},
		{"piper front on the CPU with whole sentences", piperModel, "    engine:\n      piper_decode: sentences\n      piper_front: cpu\n",
			[]string{":6:", "groups[0].engine.piper_front", "cannot be used with piper_decode sentences"}},
		{"piper flow in chunks with whole sentences", piperModel, "    engine:\n      piper_decode: sentences\n      piper_flow: chunks\n",
			[]string{":6:", "groups[0].engine.piper_flow", "cannot be used with piper_decode sentences"}},
		{"piper flow nowhere", piperModel, "    engine:\n      piper_flow: gpu\n",
			[]string{":5:", "groups[0].engine.piper_flow", "front", "chunks"}},
		{"engine option among provider options", piperModel, "    provider_options:\n      piper_batch: \"8\"\n",
			[]string{":5:", "groups[0].provider_options.piper_batch", "engine option (of the piper family)", "groups[0].engine.piper_batch"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			file, err := checkEngine(t, c.model, c.group)
			if err == nil {
				t.Fatal("accepted")
			}
			t.Log(err)
			for _, w := range append([]string{"config " + file + ":"}, c.want...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
	for model, group := range map[string]string{
		voxcpmModel: "    engine: {lm_cuda_graph: decode, vocoder_batches: [], intra_op_num_threads: 2}\n",
		piperModel:  "    engine: {piper_batch: 8, profile: /tmp/p-}\n",
		stagedModel: "    engine: {flow_workers: 3, vocoder_batches: [1, 4], exact_batches: true, lm_min_tokens_per_text_token: 9}\n",
	} {
		if _, err := checkEngine(t, model, group); err != nil {
			t.Errorf("%s: %v", model, err)
		}
	}
}
