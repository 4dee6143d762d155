package staged

import (
	"fmt"

	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// decoder runs the LM over a batch whose key/value cache stays where the LM computes (the GPU
// for CUDA): one tensor per layer holds every sequence of the batch, [rows, kv_heads, P, head_dim].
// Each step appends a position for every row; rows that join later are right-padded to P, and
// rows that leave are dropped at the next compaction. Padding is masked through attention_mask
// and positions come from position_ids, so a row's results never depend on its neighbours.
type decoder struct {
	m    *Manifest
	s    *iobind.Session
	elem iobind.Elem
	kv   []*iobind.Tensor // key0, value0, key1, ... ; nil while the batch is empty
	P    int
	rows []*lmRow
	ins  []string // past tensor names, in kv order
	outs []iobind.Output
}

// lmRow is one sequence in the decoder's batch.
type lmRow struct {
	live bool
	mask []byte // per cache position: 1 where the sequence has a real token
	pos  int64  // the sequence's next position id
	real int    // number of real positions
	slot int    // the row's slot in a shared cache
}

func newDecoder(m *Manifest, place iobind.Placement) (*decoder, error) {
	s, err := iobind.Open(m.Path(m.LM.File), place)
	if err != nil {
		return nil, fmt.Errorf("lm: %w", err)
	}
	d := &decoder{m: m, s: s, elem: iobind.Float32}
	if m.DType == "float16" {
		d.elem = iobind.Float16
	}
	d.outs = []iobind.Output{{Name: m.Tensor("logits"), Host: true}}
	var present []string
	d.ins, present = cacheNames(m)
	for _, name := range present {
		d.outs = append(d.outs, iobind.Output{Name: name})
	}
	return d, nil
}

// limit: the concat cache grows as needed.
func (d *decoder) limit() int { return 0 }

// prefillRows: this cache contract's prefill shapes are not prepared at load.
func (d *decoder) prefillRows() int { return 0 }

func (d *decoder) size() int { return len(d.rows) }

func (d *decoder) close() {
	d.release()
	d.s.Close()
}

func (d *decoder) release() {
	for _, t := range d.kv {
		t.Release()
	}
	d.kv, d.rows, d.P = nil, nil, 0
}

// rowBytes is the size of one position of one head.
func (d *decoder) rowBytes() int64 { return int64(d.m.LM.HeadDim * d.elem.Size()) }

// run feeds ids/positions/mask for B rows of T tokens over past and returns the logits (host) and
// the presents (device).
func (d *decoder) run(B, T int, ids, pos, mask []int64, past []*iobind.Tensor) ([]float32, []*iobind.Tensor, error) {
	in := map[string]*iobind.Tensor{}
	var host []*iobind.Tensor
	defer func() {
		for _, t := range host {
			t.Release()
		}
	}()
	for name, v := range map[string][]int64{"input_ids": ids, "position_ids": pos} {
		t, err := iobind.Host([]int64{int64(B), int64(T)}, v)
		if err != nil {
			return nil, nil, err
		}
		host = append(host, t)
		in[d.m.Tensor(name)] = t
	}
	mt, err := iobind.Host([]int64{int64(B), int64(len(mask) / B)}, mask)
	if err != nil {
		return nil, nil, err
	}
	host = append(host, mt)
	in[d.m.Tensor("attention_mask")] = mt
	for i, t := range past {
		in[d.ins[i]] = t
	}
	outs, err := d.s.Run(in, d.outs)
	if err != nil {
		return nil, nil, fmt.Errorf("lm: %w", err)
	}
	logits, err := outs[0].Float32s()
	outs[0].Release()
	if err != nil {
		for _, t := range outs[1:] {
			t.Release()
		}
		return nil, nil, err
	}
	V := d.m.LM.SpeechVocab + 1
	if len(logits) != B*T*V {
		for _, t := range outs[1:] {
			t.Release()
		}
		return nil, nil, fmt.Errorf("lm: logits have %d values, want B·T·(speech_vocab+1) = %d", len(logits), B*T*V)
	}
	return logits, outs[1:], nil
}

// join prefills prompts as new rows and returns each one's logits for its next token.
func (d *decoder) join(prompts [][]int64) ([]*lmRow, [][]float32, error) {
	Bn, T := len(prompts), 0
	for _, p := range prompts {
		T = max(T, len(p))
	}
	ids := make([]int64, Bn*T)
	pos := make([]int64, Bn*T)
	mask := make([]int64, Bn*T)
	for b, p := range prompts {
		for t := 0; t < T; t++ {
			pos[b*T+t] = int64(t)
			if t < len(p) {
				ids[b*T+t], mask[b*T+t] = p[t], 1
			}
		}
	}
	H, D := int64(d.m.LM.KVHeads), int64(d.m.LM.HeadDim)
	past := make([]*iobind.Tensor, len(d.ins))
	for i := range past {
		t, err := d.s.Alloc([]int64{int64(Bn), H, 0, D}, d.elem)
		if err != nil {
			release(past)
			return nil, nil, err
		}
		past[i] = t
	}
	logits, present, err := d.run(Bn, T, ids, pos, mask, past)
	release(past)
	if err != nil {
		return nil, nil, err
	}
	newP := max(d.P, T)
	B := len(d.rows)
	if B == 0 {
		d.kv = present // the new rows are the whole batch
	} else {
		defer release(present)
		rb := d.rowBytes()
		next := make([]*iobind.Tensor, len(present))
		for i := range present {
			dst, err := d.s.Alloc([]int64{int64(B + Bn), H, int64(newP), D}, d.elem)
			if err == nil {
				next[i] = dst
				err = iobind.Copy2D(dst, 0, int64(newP)*rb, d.kv[i], 0, int64(d.P)*rb, int64(d.P)*rb, int64(B)*H)
			}
			if err == nil {
				err = iobind.Copy2D(dst, int64(B)*H*int64(newP)*rb, int64(newP)*rb, present[i], 0, int64(T)*rb, int64(T)*rb, int64(Bn)*H)
			}
			if err != nil {
				release(next)
				return nil, nil, err
			}
		}
		release(d.kv)
		d.kv = next
	}
	for _, r := range d.rows {
		r.mask = append(r.mask, make([]byte, newP-d.P)...)
	}
	d.P = newP
	V := d.m.LM.SpeechVocab + 1
	rows := make([]*lmRow, Bn)
	out := make([][]float32, Bn)
	for b, p := range prompts {
		r := &lmRow{live: true, mask: make([]byte, newP), pos: int64(len(p)), real: len(p)}
		for t := range p {
			r.mask[t] = 1
		}
		rows[b] = r
		t := len(p) - 1
		out[b] = append([]float32(nil), logits[(b*T+t)*V:(b*T+t+1)*V]...)
	}
	d.rows = append(d.rows, rows...)
	return rows, out, nil
}

// step feeds tokens[i] to rows[i] (one position for every row of the batch; rows not listed get a
// masked one) and returns the rows' logits.
func (d *decoder) step(rows []*lmRow, tokens []int64) ([][]float32, error) {
	B := len(d.rows)
	P := d.P
	ids := make([]int64, B)
	pos := make([]int64, B)
	mask := make([]int64, B*(P+1))
	stepped := make(map[*lmRow]int, len(rows))
	for i, r := range rows {
		stepped[r] = i
	}
	for b, r := range d.rows {
		for j, v := range r.mask {
			mask[b*(P+1)+j] = int64(v)
		}
		if i, ok := stepped[r]; ok {
			ids[b], pos[b] = tokens[i], r.pos
			mask[b*(P+1)+P] = 1
		}
	}
	logits, present, err := d.run(B, 1, ids, pos, mask, d.kv)
	if err != nil {
		return nil, err
	}
	release(d.kv)
	d.kv = present
	d.P++
	V := d.m.LM.SpeechVocab + 1
	out := make([][]float32, len(rows))
	for b, r := range d.rows {
		i, ok := stepped[r]
		if !ok {
			r.mask = append(r.mask, 0)
			continue
		}
		r.mask = append(r.mask, 1)
		r.pos++
		r.real++
		out[i] = append([]float32(nil), logits[b*V:(b+1)*V]...)
	}
	return out, nil
}

// leave drops a row (at the next compaction).
func (d *decoder) leave(r *lmRow) { r.live = false }

// compact drops rows that left and the cache positions nobody needs, once enough of either has
// piled up; it copies each live row's real positions to the front of its new row.
func (d *decoder) compact() error {
	live, longest := 0, 0
	for _, r := range d.rows {
		if r.live {
			live++
			longest = max(longest, r.real)
		}
	}
	if live == 0 {
		d.release()
		return nil
	}
	dead := len(d.rows) - live
	if dead < max(1, len(d.rows)/4) && d.P <= 2*longest+64 {
		return nil
	}
	H, D := int64(d.m.LM.KVHeads), int64(d.m.LM.HeadDim)
	rb := d.rowBytes()
	newP := longest
	next := make([]*iobind.Tensor, len(d.kv))
	for i, old := range d.kv {
		dst, err := d.s.Alloc([]int64{int64(live), H, int64(newP), D}, d.elem)
		if err != nil {
			release(next)
			return err
		}
		next[i] = dst
		nb := int64(0)
		for b, r := range d.rows {
			if !r.live {
				continue
			}
			at := int64(0)
			for j := 0; j < len(r.mask); {
				if r.mask[j] == 0 {
					j++
					continue
				}
				k := j
				for k < len(r.mask) && r.mask[k] == 1 {
					k++
				}
				// One run of real positions, for every head of the row.
				src := (int64(b)*H*int64(d.P) + int64(j)) * rb
				dstOff := (nb*H*int64(newP) + at) * rb
				if err := iobind.Copy2D(dst, dstOff, int64(newP)*rb, old, src, int64(d.P)*rb, int64(k-j)*rb, H); err != nil {
					release(next)
					return err
				}
				at += int64(k - j)
				j = k
			}
			nb++
		}
	}
	release(d.kv)
	d.kv = next
	var rows []*lmRow
	for _, r := range d.rows {
		if r.live {
			r.mask = make([]byte, newP)
			for j := 0; j < r.real; j++ {
				r.mask[j] = 1
			}
			rows = append(rows, r)
		}
	}
	d.rows, d.P = rows, newP
	return nil
}

func release(ts []*iobind.Tensor) {
	for _, t := range ts {
		t.Release()
	}
}
