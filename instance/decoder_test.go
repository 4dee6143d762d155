package instance

import (
	"math"
	"testing"

	"github.com/voxmux/voxmux/instance/iobind"
)

func newTestDecoder(t *testing.T) *decoder {
	t.Helper()
	p := tinyPipeline(t) // initialises ONNX Runtime and iobind
	t.Cleanup(func() { p.Close() })
	d, err := newDecoder(p.m, iobind.Placement{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(d.close)
	return d
}

func maxDiff(a, b []float32) float64 {
	var w float64
	for i := range a {
		w = max(w, math.Abs(float64(a[i]-b[i])))
	}
	return w
}

// A sequence's logits must not depend on what else shares its batch: rows joining with longer
// prompts (the cache grows under it), rows leaving, and compaction (its real positions move).
func TestDecoderRowsAreIndependent(t *testing.T) {
	m := newTestDecoder(t).m
	promptA := m.Tokenize("short")
	promptB := m.Tokenize("a much longer prompt than the first")
	tokens := []int64{260, 270, 280, 290, 300, 310, 320, 321}

	// B alone: prefill, then decode every token.
	alone := newTestDecoder(t)
	rows, first, err := alone.join([][]int64{promptB})
	if err != nil {
		t.Fatal(err)
	}
	want := [][]float32{first[0]}
	for _, tok := range tokens {
		l, err := alone.step(rows, []int64{tok})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, l[0])
	}

	// B shares the batch: A runs first; B joins with a longer prompt after A's steps; A leaves
	// and the cache is compacted in the middle of B's decoding.
	d := newTestDecoder(t)
	ra, _, err := d.join([][]int64{promptA})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		if _, err := d.step(ra, []int64{int64(290 + i)}); err != nil {
			t.Fatal(err)
		}
	}
	rb, got0, err := d.join([][]int64{promptB})
	if err != nil {
		t.Fatal(err)
	}
	got := [][]float32{got0[0]}
	for i, tok := range tokens {
		rowsNow := []*lmRow{rb[0]}
		toks := []int64{tok}
		if i < 4 {
			rowsNow = append(rowsNow, ra[0])
			toks = append(toks, int64(300+i))
		}
		if i == 4 {
			d.leave(ra[0])
			if err := d.compact(); err != nil {
				t.Fatal(err)
			}
			if len(d.rows) != 1 || d.P != rb[0].real {
				t.Fatalf("after compaction: %d rows, P %d, want 1 row and P %d", len(d.rows), d.P, rb[0].real)
			}
		}
		l, err := d.step(rowsNow, toks)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, l[0])
	}
	for i := range want {
		if w := maxDiff(want[i], got[i]); w > 1e-4 {
			t.Errorf("step %d: batched logits differ from alone by %g", i, w)
		}
	}
}
