package audio

import (
	"errors"
	"fmt"
	"io"
	"slices"
)

// PCMRate is the rate of the "pcm" format: OpenAI documents it as 24 kHz.
const PCMRate = 24000

// format describes one response_format.
type format struct {
	contentType string
	codec       string // FFmpeg encoder; "" for the formats written in Go
	muxer       string
	bitrate     int    // bits per second; 0 for lossless
	codecopts   string // "key=value:key=value" for the encoder
	muxopts     string // and for the muxer
}

// formats are OpenAI's response_format values.
var formats = map[string]format{
	"mp3": {contentType: "audio/mpeg", codec: "libmp3lame", muxer: "mp3", bitrate: 64000,
		// No ID3 tag and no Xing frame: the stream is MP3 frames only, as it leaves.
		muxopts: "id3v2_version=0:write_xing=0"},
	"opus": {contentType: "audio/opus", codec: "libopus", muxer: "ogg", bitrate: 32000,
		// Complexity 5 of 10: about an eighth of the default (10) CPU time, for speech at 32 kbit/s.
		codecopts: "compression_level=5"},
	"aac": {contentType: "audio/aac", codec: "aac", muxer: "adts", bitrate: 64000,
		// The fast coder: about half the default (twoloop) CPU time, for speech at 64 kbit/s.
		codecopts: "aac_coder=fast"},
	"flac": {contentType: "audio/flac", codec: "flac", muxer: "flac",
		// No padding block: nobody edits the tags of a stream.
		muxopts: "metadata_header_padding=0"},
	"wav": {contentType: "audio/wav"},
	"pcm": {contentType: "audio/pcm"},
}

// Formats lists the supported response_format values.
func Formats() []string {
	names := make([]string, 0, len(formats))
	for f := range formats {
		names = append(names, f)
	}
	slices.Sort(names)
	return names
}

// ContentType is the Content-Type of a format, or "" for an unknown format.
func ContentType(format string) string { return formats[format].contentType }

// Encoder turns mono float PCM into one response_format, writing to the io.Writer it was made
// with as it goes: each Write sends every complete codec frame it can, so audio leaves with the
// first chunk; only the part of a frame a codec still needs waits for the next Write.
// An Encoder is not safe for concurrent use.
type Encoder interface {
	// Write encodes samples in [-1, 1] at the rate the encoder was made for.
	Write(pcm []float32) error
	// Close encodes what is left, writes the container's trailer and frees the encoder.
	Close() error
	// Abort frees the encoder without writing anything more, e.g. when the client went away.
	Abort()
}

// Stage is a streaming transform of mono float PCM. Process returns what is ready now (it may
// be the input itself when the stage changes nothing); Flush returns the rest at the end.
// A Stage is not safe for concurrent use.
type Stage interface {
	Process(pcm []float32) ([]float32, error)
	Flush() ([]float32, error)
	Close()
}

var errClosed = errors.New("audio: use after Close")

// NewEncoder returns an encoder of format for PCM at sampleRate, applying speed (0.25 to 4;
// 1 changes nothing) by time-stretching, so the pitch stays. The output is at sampleRate except
// for pcm (always PCMRate) and for codecs that cannot take sampleRate (opus takes 8, 12, 16, 24
// or 48 kHz), which get the nearest rate above it.
func NewEncoder(format string, sampleRate int, speed float64, w io.Writer) (Encoder, error) {
	f, ok := formats[format]
	if !ok {
		return nil, fmt.Errorf("audio format %q is not supported; use one of %v", format, Formats())
	}
	if sampleRate <= 0 {
		return nil, fmt.Errorf("audio sample rate %d is not positive", sampleRate)
	}
	tempo, err := NewTempo(speed, sampleRate)
	if err != nil {
		return nil, err
	}
	var enc Encoder
	switch format {
	case "wav":
		enc = &wavEncoder{w: w, rate: sampleRate}
	case "pcm":
		var rs Stage
		rs, err = NewResampler(sampleRate, PCMRate)
		if err == nil {
			enc = &pcmEncoder{w: w, rs: rs}
		}
	default:
		enc, err = newCodecEncoder(f, sampleRate, w)
	}
	if err != nil {
		tempo.Close()
		return nil, fmt.Errorf("audio format %s: %w", format, err)
	}
	if _, same := tempo.(passThrough); same {
		return enc, nil
	}
	return &staged{stage: tempo, enc: enc}, nil
}

// staged runs a Stage before an Encoder.
type staged struct {
	stage Stage
	enc   Encoder
	done  bool
}

func (s *staged) Write(pcm []float32) error {
	if s.done {
		return errClosed
	}
	out, err := s.stage.Process(pcm)
	if err != nil {
		return err
	}
	if len(out) == 0 {
		return nil
	}
	return s.enc.Write(out)
}

func (s *staged) Close() error {
	if s.done {
		return nil
	}
	s.done = true
	defer s.stage.Close()
	out, err := s.stage.Flush()
	if err == nil && len(out) > 0 {
		err = s.enc.Write(out)
	}
	if err != nil {
		s.enc.Abort()
		return err
	}
	return s.enc.Close()
}

func (s *staged) Abort() {
	s.done = true
	s.stage.Close()
	s.enc.Abort()
}

// NewResampler converts PCM from one rate to another; equal rates give a pass-through.
func NewResampler(from, to int) (Stage, error) {
	if from <= 0 || to <= 0 {
		return nil, fmt.Errorf("resampling %d to %d Hz: rates must be positive", from, to)
	}
	if from == to {
		return passThrough{}, nil
	}
	return newSWR(from, to)
}

// NewTempo changes the speed of PCM at sampleRate by speed (0.25 to 4) keeping its pitch, with
// FFmpeg's atempo; 1 gives a pass-through that costs nothing.
func NewTempo(speed float64, sampleRate int) (Stage, error) {
	if !(speed >= 0.25 && speed <= 4) { // also rejects NaN
		return nil, fmt.Errorf("speed %g is outside 0.25 to 4", speed)
	}
	if speed == 1 {
		return passThrough{}, nil
	}
	return newGraph(sampleRate, tempoFilters(speed))
}

type passThrough struct{}

func (passThrough) Process(pcm []float32) ([]float32, error) { return pcm, nil }
func (passThrough) Flush() ([]float32, error)                { return nil, nil }
func (passThrough) Close()                                   {}

// wavEncoder writes a 16-bit WAV whose header, sent before the first samples, gives the length
// as unknown (StreamingSize), so it can leave before the length is known.
type wavEncoder struct {
	w       io.Writer
	rate    int
	started bool
	closed  bool
	buf     []byte
}

func (e *wavEncoder) Write(pcm []float32) error {
	if e.closed {
		return errClosed
	}
	e.buf = e.buf[:0]
	if !e.started {
		e.buf, e.started = append(e.buf, WAVHeader(e.rate, StreamingSize)...), true
	}
	e.buf = PCM16(e.buf, pcm)
	_, err := e.w.Write(e.buf)
	return err
}

func (e *wavEncoder) Close() error {
	if e.closed {
		return nil
	}
	e.closed = true
	if !e.started { // an empty stream is still a WAV file
		_, err := e.w.Write(WAVHeader(e.rate, 0))
		return err
	}
	return nil
}

func (e *wavEncoder) Abort() { e.closed = true }

// pcmEncoder writes raw signed 16-bit little-endian samples at PCMRate.
type pcmEncoder struct {
	w   io.Writer
	rs  Stage
	buf []byte
}

func (e *pcmEncoder) Write(pcm []float32) error {
	if e.rs == nil {
		return errClosed
	}
	out, err := e.rs.Process(pcm)
	if err != nil {
		return err
	}
	return e.put(out)
}

func (e *pcmEncoder) put(pcm []float32) error {
	if len(pcm) == 0 {
		return nil
	}
	e.buf = PCM16(e.buf[:0], pcm)
	_, err := e.w.Write(e.buf)
	return err
}

func (e *pcmEncoder) Close() error {
	if e.rs == nil {
		return nil
	}
	defer e.Abort()
	out, err := e.rs.Flush()
	if err != nil {
		return err
	}
	return e.put(out)
}

func (e *pcmEncoder) Abort() {
	if e.rs != nil {
		e.rs.Close()
		e.rs = nil
	}
}
