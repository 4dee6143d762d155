package router

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/voxmux/voxmux/router/audio"
)

// elevenFormat is an ElevenLabs output_format: codec_rate[_kbps], such as pcm_24000,
// mp3_44100_128 or ulaw_8000.
type elevenFormat struct {
	name    string
	codec   string // pcm, mp3 or ulaw
	rate    int
	bitrate int // bits per second, mp3 only
}

// elevenDefaultFormat is ElevenLabs' default output_format.
const elevenDefaultFormat = "mp3_44100_128"

// elevenFormats are the output_format values served: ElevenLabs' pcm, mp3 and μ-law ones.
var elevenFormats = []string{
	"pcm_8000", "pcm_16000", "pcm_22050", "pcm_24000", "pcm_44100", "pcm_48000",
	"mp3_22050_32", "mp3_44100_32", "mp3_44100_64", "mp3_44100_96", "mp3_44100_128", "mp3_44100_192",
	"ulaw_8000",
}

func parseElevenFormat(s string) (elevenFormat, error) {
	if s == "" {
		s = elevenDefaultFormat
	}
	known := false
	for _, f := range elevenFormats {
		known = known || f == s
	}
	if !known {
		return elevenFormat{}, fmt.Errorf("output_format %q is not supported; use one of %s", excerpt(s), strings.Join(elevenFormats, ", "))
	}
	parts := strings.Split(s, "_")
	f := elevenFormat{name: s, codec: parts[0]}
	f.rate, _ = strconv.Atoi(parts[1])
	if len(parts) == 3 {
		kbps, _ := strconv.Atoi(parts[2])
		f.bitrate = kbps * 1000
	}
	return f, nil
}

// encodable tells whether this build can make f from PCM at rate (a build without FFmpeg makes
// only pcm at the model's rate), so that a request is refused before any synthesis.
func (f elevenFormat) encodable(rate int) error {
	e, err := newElevenEncoder(f, rate, 1, io.Discard)
	if err != nil {
		return err
	}
	e.Abort()
	return nil
}

// contentType is the Content-Type of an HTTP response in f.
func (f elevenFormat) contentType() string {
	switch f.codec {
	case "mp3":
		return "audio/mpeg"
	case "ulaw":
		return "audio/basic"
	}
	return "audio/pcm"
}

// elevenEncoder turns a model's float PCM into f: speed (a time stretch, pitch kept), then the
// format's rate, then its codec. It is an audio.Encoder, so the HTTP API's response body can
// carry it.
type elevenEncoder struct {
	f     elevenFormat
	w     io.Writer
	tempo audio.Stage
	rs    audio.Stage
	mp3   audio.Encoder // for mp3
	buf   []byte
	done  bool
}

var _ audio.Encoder = (*elevenEncoder)(nil)

// newElevenEncoder encodes PCM at rate, spoken at speed (1: as the model made it), as f into w.
func newElevenEncoder(f elevenFormat, rate int, speed float64, w io.Writer) (*elevenEncoder, error) {
	e := &elevenEncoder{f: f, w: w}
	var err error
	if e.tempo, err = audio.NewTempo(speed, rate); err != nil {
		return nil, fmt.Errorf("speed %g: %w", speed, err)
	}
	if e.rs, err = audio.NewResampler(rate, f.rate); err != nil {
		e.tempo.Close()
		return nil, fmt.Errorf("output_format %s from %d Hz: %w", f.name, rate, err)
	}
	if f.codec == "mp3" {
		if e.mp3, err = audio.NewMP3Encoder(f.rate, f.bitrate, w); err != nil {
			e.tempo.Close()
			e.rs.Close()
			return nil, fmt.Errorf("output_format %s: %w", f.name, err)
		}
	}
	return e, nil
}

func (e *elevenEncoder) Write(pcm []float32) error {
	if e.done {
		return fmt.Errorf("output_format %s: write after close", e.f.name)
	}
	out, err := e.tempo.Process(pcm)
	if err == nil {
		out, err = e.rs.Process(out)
	}
	if err != nil {
		return err
	}
	return e.emit(out)
}

func (e *elevenEncoder) emit(pcm []float32) error {
	if len(pcm) == 0 {
		return nil
	}
	switch e.f.codec {
	case "mp3":
		return e.mp3.Write(pcm)
	case "ulaw":
		e.buf = audio.ULaw(e.buf[:0], pcm)
	default:
		e.buf = audio.PCM16(e.buf[:0], pcm)
	}
	_, err := e.w.Write(e.buf)
	return err
}

func (e *elevenEncoder) Close() error {
	if e.done {
		return nil
	}
	e.done = true
	defer e.tempo.Close()
	defer e.rs.Close()
	tail, err := e.tempo.Flush()
	if err == nil && len(tail) > 0 {
		tail, err = e.rs.Process(tail)
	}
	if err == nil {
		err = e.emit(tail)
	}
	if err == nil {
		tail, err = e.rs.Flush()
	}
	if err == nil {
		err = e.emit(tail)
	}
	if e.mp3 != nil {
		if err != nil {
			e.mp3.Abort()
			return err
		}
		return e.mp3.Close()
	}
	return err
}

func (e *elevenEncoder) Abort() {
	if e.done {
		return
	}
	e.done = true
	e.tempo.Close()
	e.rs.Close()
	if e.mp3 != nil {
		e.mp3.Abort()
	}
}

// chunkEncoder is an elevenEncoder whose output is taken after each write, for the socket's
// audio messages.
type chunkEncoder struct {
	enc *elevenEncoder
	out bytes.Buffer
}

func newChunkEncoder(f elevenFormat, rate int, speed float64) (*chunkEncoder, error) {
	c := &chunkEncoder{}
	enc, err := newElevenEncoder(f, rate, speed, &c.out)
	if err != nil {
		return nil, err
	}
	c.enc = enc
	return c, nil
}

func (c *chunkEncoder) write(pcm []float32) ([]byte, error) {
	err := c.enc.Write(pcm)
	return c.take(), err
}

func (c *chunkEncoder) close() ([]byte, error) {
	err := c.enc.Close()
	return c.take(), err
}

func (c *chunkEncoder) take() []byte {
	b := bytes.Clone(c.out.Bytes())
	c.out.Reset()
	return b
}
