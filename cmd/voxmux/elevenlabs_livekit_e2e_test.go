package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// LiveKit Agents' ElevenLabs plugin (scripts/livekit-test, pinned in its package-lock.json),
// unchanged but for its base URL, speaks a three-turn conversation streamed a word at a time on
// the multi-context socket: the turns it finishes end with their words timed, the one the user
// barges in on stops, and the next turn speaks whole. (The plugin flushes each sentence as it
// sends it, so close_context finds nothing unflushed to cancel: as at ElevenLabs, the flushed
// rest is still made and the plugin discards it. elevenlabs_e2e_test.go checks the cancel of
// text not flushed.)
func TestLiveKitElevenLabsPlugin(t *testing.T) {
	needCommand(t, "node", "npm")
	dir, ctx := npmCI(t, "livekit-test")
	const key = "sk-livekit-3"
	s := serveWithKey(t, "VOXMUX_LK_KEYS", key)

	out := t.TempDir()
	node := exec.CommandContext(ctx, "node", filepath.Join(dir, "livekit-test.mjs"), s.url+"/v1", "default", out)
	node.Env = append(os.Environ(), "ELEVEN_API_KEY="+key)
	b, err := node.CombinedOutput()
	if err != nil {
		t.Fatalf("livekit-test.mjs: %v\n%s", err, b)
	}
	t.Logf("%s", b)
	var turns []struct {
		Text    string  `json:"text"`
		BargeIn bool    `json:"bargeIn"`
		Seconds float64 `json:"seconds"`
		Ended   bool    `json:"ended"`
		Words   []struct {
			Text string `json:"text"`
		} `json:"words"`
	}
	if b, err := os.ReadFile(filepath.Join(out, "results.json")); err != nil || json.Unmarshal(b, &turns) != nil || len(turns) != 3 {
		t.Fatalf("results.json: %v, %d turns", err, len(turns))
	}
	for i, turn := range turns {
		n := float64(len(turn.Text))
		var words []string
		for _, w := range turn.Words {
			words = append(words, strings.TrimSpace(w.Text))
		}
		switch {
		case turn.BargeIn:
			if turn.Ended || turn.Seconds > 1.5 {
				t.Errorf("turn %d (barge-in): ended %v after %.2f s", i+1, turn.Ended, turn.Seconds)
			}
		case !turn.Ended || turn.Seconds < n*2/25*0.9:
			t.Errorf("turn %d: ended %v with %.2f s of audio for %d characters", i+1, turn.Ended, turn.Seconds, int(n))
		case strings.Join(words, " ") != turn.Text:
			t.Errorf("turn %d: timed words %q, want %q", i+1, strings.Join(words, " "), turn.Text)
		}
	}
}
