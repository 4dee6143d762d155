// Package staged is the staged model family: CosyVoice-style pipelines whose speech-token LM
// feeds a flow-matching mel generator and a vocoder, described by a manifest (docs/pipeline.md).
// Its Engine runs every stage batched across requests: one LM step for all running sequences,
// and flow and vocoder batches of the chunks waiting for them.
package staged
