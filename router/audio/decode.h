// Decoding an audio file held in memory, over FFmpeg's libraries (the Go side is decode_ffmpeg.go).
#ifndef VOXMUX_AUDIO_DECODE_H
#define VOXMUX_AUDIO_DECODE_H

#include <stdint.h>

// The file could be read but holds more than max_seconds of audio.
#define VX_DECODE_TOO_LONG 1

// Decodes the first audio stream of the file data[0:len] to mono float samples at the stream's
// own rate. On success (0) *out holds *n samples, allocated with malloc (free them with free),
// and *rate the rate; on failure an AVERROR or VX_DECODE_TOO_LONG, with err set. data is only
// read during the call.
int vx_decode(const uint8_t *data, int64_t len, double max_seconds, float **out, int64_t *n, int *rate, char *err,
              int errlen);

#endif
