package voxcpm

import (
	"fmt"

	"github.com/voxmux/voxmux/instance/text"
)

// loadTokenizer loads tokenizer.file: the model's Llama-style tokenizer.json, which gives ids
// without <s> (what VoxCPM feeds its LM), multi-character CJK tokens split as
// tokenizer.split_chinese says.
func loadTokenizer(m *Manifest) (tokenizer, error) {
	t, err := text.LoadLlama(m.Path(m.Tokenizer.File))
	if err != nil {
		return nil, fmt.Errorf("tokenizer.file: %w", err)
	}
	t.SplitCJK = m.Tokenizer.SplitChinese
	return t, nil
}
