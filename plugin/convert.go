package plugin

import (
	"github.com/voxmux/voxmux/plugin/proto"
	"github.com/voxmux/voxmux/tts"
)

// A group's engine section crosses the process boundary as the JSON the config loaded, which the
// instance's model family parses; the memory limit crosses typed, as the config parsed it.

func memoryLimitToProto(l tts.MemoryLimit) *proto.MemoryLimit {
	if l.IsZero() {
		return nil
	}
	return &proto.MemoryLimit{Bytes: l.Bytes, Fraction: l.Fraction}
}

func memoryLimitFromProto(p *proto.MemoryLimit) tts.MemoryLimit {
	return tts.MemoryLimit{Bytes: p.GetBytes(), Fraction: p.GetFraction()}
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
