package plugin

import (
	"github.com/voxmux/voxmux/plugin/proto"
	"github.com/voxmux/voxmux/tts"
)

// The engine options cross the process boundary field by field, typed, as the config loaded them.

func engineToProto(o tts.EngineOptions) *proto.EngineOptions {
	p := &proto.EngineOptions{
		VocoderBatchesSet: o.VocoderBatchesSet || o.VocoderBatches != nil,
		VocoderWindow:     int32(o.VocoderWindow),
		Profile:           o.Profile,
		LmStreamPriority:  o.LMStreamPriority,
		LmCudaGraph:       o.LMCUDAGraph,
		FlowCudaGraph:     o.FlowCUDAGraph,
		VocoderCudaGraph:  o.VocoderCUDAGraph,
		FlowWorkers:       int32(o.FlowWorkers),
		FlowFirstWorker:   o.FlowFirstWorker,
		IntraOpNumThreads: int32(o.IntraOpThreads),
		PiperBatch:        int32(o.PiperBatch),
		PiperWorkers:      int32(o.PiperWorkers),
		PiperQueue:        int32(o.PiperQueue),
		ExactBatches:      o.ExactBatches,
	}
	for _, b := range o.VocoderBatches {
		p.VocoderBatches = append(p.VocoderBatches, int32(b))
	}
	return p
}

func engineFromProto(p *proto.EngineOptions) tts.EngineOptions {
	if p == nil {
		return tts.EngineOptions{}
	}
	o := tts.EngineOptions{
		VocoderBatchesSet: p.VocoderBatchesSet,
		VocoderWindow:     int(p.VocoderWindow),
		Profile:           p.Profile,
		LMStreamPriority:  p.LmStreamPriority,
		LMCUDAGraph:       p.LmCudaGraph,
		FlowCUDAGraph:     p.FlowCudaGraph,
		VocoderCUDAGraph:  p.VocoderCudaGraph,
		FlowWorkers:       int(p.FlowWorkers),
		FlowFirstWorker:   p.FlowFirstWorker,
		IntraOpThreads:    int(p.IntraOpNumThreads),
		PiperBatch:        int(p.PiperBatch),
		PiperWorkers:      int(p.PiperWorkers),
		PiperQueue:        int(p.PiperQueue),
		ExactBatches:      p.ExactBatches,
	}
	for _, b := range p.VocoderBatches {
		o.VocoderBatches = append(o.VocoderBatches, int(b))
	}
	return o
}

func promptToProto(p *tts.VoicePrompt) *proto.VoicePrompt {
	if p == nil {
		return nil
	}
	return &proto.VoicePrompt{Text: p.Text, SpeechTokens: p.SpeechTokens, MelF32Le: encodeF32(p.Mel),
		MelBins: uint32(p.MelBins), EmbeddingF32Le: encodeF32(p.Embedding),
		LatentsF32Le: encodeF32(p.Latents), LatentDim: uint32(p.LatentDim)}
}

func promptFromProto(p *proto.VoicePrompt) *tts.VoicePrompt {
	if p == nil {
		return nil
	}
	return &tts.VoicePrompt{Text: p.Text, SpeechTokens: p.SpeechTokens, Mel: decodeF32(p.MelF32Le),
		MelBins: int(p.MelBins), Embedding: decodeF32(p.EmbeddingF32Le),
		Latents: decodeF32(p.LatentsF32Le), LatentDim: int(p.LatentDim)}
}
