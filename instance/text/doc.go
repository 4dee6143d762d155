// Package text turns request text into what a model's LM reads: the Qwen2 byte-level BPE
// tokenizer (with the special tokens a model adds to it), rule-based normalization, and the
// split of long text into segments a model speaks one at a time.
package text
