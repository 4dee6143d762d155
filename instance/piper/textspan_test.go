package piper

import (
	"context"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

// A Piper chunk is a sentence and says so: its text span is the sentence's, the spans follow each
// other and the last ends at the text's end.
func TestPiperChunksSayTheirSentence(t *testing.T) {
	r, _ := openTinyPiper(t, tinyPiperEN)
	text := "Hello, world. How are you? 🫠 Fine!"
	var got []string
	err := r.Synthesize(context.Background(), tts.Request{Text: text}, func(c tts.Chunk) error {
		if c.Text == nil {
			t.Fatalf("chunk %d has no text span", c.Index)
		}
		got = append(got, text[c.Text.Start:c.Text.End])
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"Hello, world. ", "How are you? ", "🫠 Fine!"}
	if len(got) != len(want) {
		t.Fatalf("chunk texts %q, want %q", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("chunk %d speaks %q, want %q", i, got[i], want[i])
		}
	}
}
