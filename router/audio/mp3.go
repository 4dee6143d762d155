package audio

import "io"

// NewMP3Encoder encodes MP3 at sampleRate (one the MP3 encoder takes: 44100, 22050, ...) and
// bitrate bits per second, for APIs that name both in their format (ElevenLabs' mp3_44100_128);
// "mp3" of NewEncoder is 64 kbit/s at the model's rate.
func NewMP3Encoder(sampleRate, bitrate int, w io.Writer) (Encoder, error) {
	f := formats["mp3"]
	f.bitrate = bitrate
	e, err := newCodecEncoder(f, sampleRate, w)
	if err != nil {
		return nil, err
	}
	return e, nil
}
