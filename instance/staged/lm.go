package staged

import (
	"fmt"

	"github.com/voxmux/voxmux/instance/ort/iobind"
)

// lmDecoder runs the LM over a batch of sequences that join and leave between steps; there is
// one implementation per key/value cache contract (manifest lm.cache).
type lmDecoder interface {
	// join prefills prompts as new rows and returns each one's logits for its next token.
	join(prompts [][]int64) ([]*lmRow, [][]float32, error)
	// step feeds tokens[i] to rows[i] and returns the rows' logits, which may be memory the
	// decoder reuses: they hold until its next step.
	step(rows []*lmRow, tokens []int64) ([][]float32, error)
	// leave drops a row.
	leave(r *lmRow)
	// compact reclaims what rows that left held, when enough of it has piled up.
	compact() error
	// size is the number of rows in the batch.
	size() int
	// limit is the most positions (prompt and speech tokens) one sequence may hold; 0: no bound.
	limit() int
	// prefillRows is the most prompts one join takes in shapes prepared at load (warmed up or
	// captured as graphs); 0: any number is as good.
	prefillRows() int
	release()
	close()
}

// newLMDecoder opens the LM. graphRows > 0 runs its decode steps in fixed shapes for up to that
// many sequences at once, as CUDA graphs where place asks for them (lm_cuda_graph); only the
// shared cache contract has fixed-shape steps.
func newLMDecoder(m *Manifest, place iobind.Placement, graphRows int, prefillGraphs bool) (lmDecoder, error) {
	// On error a nil interface, never a nil pointer in one.
	if m.LM.Cache == "shared" {
		d, err := newSharedDecoder(m, place, graphRows, prefillGraphs)
		if err != nil {
			return nil, err
		}
		return d, nil
	}
	if graphRows > 0 {
		return nil, fmt.Errorf("engine.lm_cuda_graph needs an LM with lm.cache: shared (%s has %q)", m.Name, m.LM.Cache)
	}
	d, err := newDecoder(m, place)
	if err != nil {
		return nil, err
	}
	return d, nil
}

// cacheNames are the LM's past and present tensor names, key0, value0, key1, ...
func cacheNames(m *Manifest) (past, present []string) {
	for l := 0; l < m.LM.Layers; l++ {
		past = append(past, m.Tensor(fmt.Sprintf("past_key.%d", l)), m.Tensor(fmt.Sprintf("past_value.%d", l)))
		present = append(present, m.Tensor(fmt.Sprintf("present_key.%d", l)), m.Tensor(fmt.Sprintf("present_value.%d", l)))
	}
	return past, present
}
