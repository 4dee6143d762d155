package router

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/rand"
	"testing"

	"github.com/voxmux/voxmux/router/audio"
)

// flacTotal reads STREAMINFO's total samples.
func flacTotal(t *testing.T, b []byte) uint64 {
	t.Helper()
	if len(b) < 42 || string(b[:4]) != "fLaC" {
		t.Fatalf("not FLAC: %.16q", b)
	}
	si := b[8:42]
	return uint64(si[13]&0x0F)<<32 | uint64(binary.BigEndian.Uint32(si[14:18]))
}

func TestStreamFalseSendsACompleteFile(t *testing.T) {
	url, _ := serveWith(t, tinyModel, nil, ready("a", &fakeSynth{chunks: 5}, 4))
	const samples = 5 * 480
	for _, format := range []string{"wav", "flac", "mp3", "opus", "aac", "pcm"} {
		t.Run(format, func(t *testing.T) {
			resp, b := do(t, "POST", url+"/v1/audio/speech", `{"input":"hi","stream":false,"response_format":"`+format+`"}`, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("%d %s", resp.StatusCode, b)
			}
			if resp.ContentLength != int64(len(b)) || len(resp.TransferEncoding) != 0 {
				t.Errorf("Content-Length %d, transfer encoding %v, %d bytes", resp.ContentLength, resp.TransferEncoding, len(b))
			}
			if got := resp.Header.Get("Content-Disposition"); got != `attachment; filename="speech.`+format+`"` {
				t.Errorf("Content-Disposition %q", got)
			}
			switch format {
			case "wav":
				riff, data := binary.LittleEndian.Uint32(b[4:8]), binary.LittleEndian.Uint32(b[40:44])
				if len(b) != 44+2*samples || riff != uint32(len(b)-8) || data != 2*samples {
					t.Errorf("%d bytes, RIFF size %d, data size %d", len(b), riff, data)
				}
			case "flac":
				if n := flacTotal(t, b); n != samples {
					t.Errorf("STREAMINFO total samples %d, want %d", n, samples)
				}
			}
		})
	}
	// Streaming stays the default: chunked, no length, and the WAV header says "unknown".
	resp, b := do(t, "POST", url+"/v1/audio/speech", `{"input":"hi","response_format":"wav"}`, nil)
	if resp.ContentLength != -1 || binary.LittleEndian.Uint32(b[40:44]) != audio.StreamingSize ||
		resp.Header.Get("Content-Disposition") != `attachment; filename="speech.wav"` {
		t.Errorf("streamed: Content-Length %d, data size %#x, %q", resp.ContentLength, binary.LittleEndian.Uint32(b[40:44]), resp.Header.Get("Content-Disposition"))
	}
	resp, b = do(t, "POST", url+"/v1/audio/speech", `{"input":"hi","stream":false,"stream_format":"sse"}`, nil)
	var e openAIError
	if resp.StatusCode != 400 || json.Unmarshal(b, &e) != nil || e.Error.Param == nil || *e.Error.Param != "stream" {
		t.Errorf("stream false with SSE: %d %s", resp.StatusCode, b)
	}
}

func TestStreamFalseFailureIsAnError(t *testing.T) {
	url, _ := serveWith(t, tinyModel, nil, ready("a", &fakeSynth{chunks: 5, failAt: 2}, 4))
	resp, b := do(t, "POST", url+"/v1/audio/speech", `{"input":"hi","stream":false,"response_format":"wav"}`, nil)
	var e openAIError
	if resp.StatusCode != 502 || json.Unmarshal(b, &e) != nil || e.Error.Code == nil || *e.Error.Code != "instance_error" {
		t.Fatalf("%d %.200s", resp.StatusCode, b)
	}
}

// TestCompleteFLAC counts the samples of FFmpeg's FLAC frames, noise included (whose bytes hold
// sync codes), for lengths that do and do not fill the last block.
func TestCompleteFLAC(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for _, n := range []int{0, 1, 4096, 4608, 12345, 100000} {
		var buf bytes.Buffer
		enc, err := audio.NewEncoder("flac", 24000, 1, &buf)
		if err != nil {
			t.Fatal(err)
		}
		pcm := make([]float32, n)
		for i := range pcm {
			pcm[i] = rng.Float32()*2 - 1
		}
		for i := 0; i < n; i += 1000 {
			if err := enc.Write(pcm[i:min(i+1000, n)]); err != nil {
				t.Fatal(err)
			}
		}
		if err := enc.Close(); err != nil {
			t.Fatal(err)
		}
		b := completeHeader("flac", buf.Bytes())
		if got := flacTotal(t, b); got != uint64(n) {
			t.Errorf("%d samples: STREAMINFO says %d", n, got)
		}
	}
}
