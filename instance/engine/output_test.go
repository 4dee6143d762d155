package engine

import (
	"errors"
	"testing"

	"github.com/voxmux/voxmux/tts"
)

// Chunks come out in order, each once; the first end counts.
func TestOutput(t *testing.T) {
	var o Output
	o.Push(tts.Chunk{Index: 0})
	o.Push(tts.Chunk{Index: 1})
	<-o.Ready()
	if cs, closed, err := o.Take(); len(cs) != 2 || cs[1].Index != 1 || closed || err != nil {
		t.Fatalf("took %v, %v, %v", cs, closed, err)
	}
	boom := errors.New("boom")
	o.Finish(boom)
	o.Finish(nil)
	<-o.Ready()
	if cs, closed, err := o.Take(); len(cs) != 0 || !closed || err != boom {
		t.Fatalf("after the end: %v, %v, %v", cs, closed, err)
	}
	if closed, err := o.Ended(); !closed || err != boom {
		t.Fatalf("ended %v, %v", closed, err)
	}
}
