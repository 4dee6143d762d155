package audio

import (
	"encoding/base64"
	"encoding/json"
	"io"
)

// The events of OpenAI's `stream_format: "sse"` on /v1/audio/speech (its OpenAPI schemas
// SpeechAudioDeltaEvent and SpeechAudioDoneEvent): each carries the encoded audio of the
// chosen response_format, base64, and the last one the usage.

// Usage is the token usage reported by the speech.audio.done event.
type Usage struct {
	InputTokens  int `json:"input_tokens"`
	OutputTokens int `json:"output_tokens"`
	TotalTokens  int `json:"total_tokens"`
}

// SSEDelta is one `speech.audio.delta` event carrying audio.
func SSEDelta(audio []byte) []byte {
	const head, tail = `data: {"type":"speech.audio.delta","audio":"`, "\"}\n\n"
	b := make([]byte, 0, len(head)+base64.StdEncoding.EncodedLen(len(audio))+len(tail))
	b = append(b, head...)
	b = base64.StdEncoding.AppendEncode(b, audio)
	return append(b, tail...)
}

// SSEDone is the closing `speech.audio.done` event.
func SSEDone(u Usage) []byte {
	ev, _ := json.Marshal(struct { // cannot fail: fixed types
		Type  string `json:"type"`
		Usage Usage  `json:"usage"`
	}{"speech.audio.done", u})
	b := append([]byte("data: "), ev...)
	return append(b, "\n\n"...)
}

// SSEWriter turns each Write into one speech.audio.delta event on W; an Encoder writing into it
// streams SSE.
type SSEWriter struct{ W io.Writer }

func (s SSEWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if _, err := s.W.Write(SSEDelta(p)); err != nil {
		return 0, err
	}
	return len(p), nil
}
