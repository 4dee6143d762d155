// The small C surface over FFmpeg's libraries that the Go side of instance/audio calls. Every
// object is owned by C and freed by its *_free function; no function keeps a pointer it was
// given past its return, so Go memory passed in is only borrowed for the call.
#ifndef VOXMUX_AUDIO_FFMPEG_H
#define VOXMUX_AUDIO_FFMPEG_H

#include <stdint.h>

void vx_quiet_logs(void);

// Picks the sample rate a codec encodes rate at: rate itself when the codec takes it, else the
// smallest rate it takes above rate, else its largest. Returns <0 if the codec is missing.
int vx_codec_rate(const char *codec, int rate);

// An encoder and muxer writing one mono stream into a growing output buffer.
typedef struct vx_enc vx_enc;

// codecopts and muxopts are "key=value" pairs separated by ':', or "". err gets a message on failure.
vx_enc *vx_enc_open(const char *codec, const char *muxer, int rate, int64_t bitrate, const char *codecopts,
                    const char *muxopts, char *err, int errlen);
// Samples per codec frame; 0 when any count is accepted.
int vx_enc_frame_size(const vx_enc *e);
// Encodes n samples, a whole number of frames, muxes the packets that come out and flushes them
// into the output buffer. Returns an AVERROR on failure.
int vx_enc_write(vx_enc *e, const float *pcm, int n);
// Encodes the last n samples (less than a frame; may be 0), drains the encoder and writes the trailer.
int vx_enc_finish(vx_enc *e, const float *pcm, int n);
// The bytes muxed since the last vx_enc_take; vx_enc_take empties the buffer.
const uint8_t *vx_enc_out(const vx_enc *e, int *len);
void vx_enc_take(vx_enc *e);
void vx_enc_free(vx_enc *e);

// A streaming resampler of mono float samples.
typedef struct vx_swr vx_swr;
vx_swr *vx_swr_open(int from, int to, char *err, int errlen);
// The most samples the next vx_swr_convert of n input samples can return.
int vx_swr_out_cap(vx_swr *s, int n);
// Converts n samples (in NULL, n 0: flush) into out; returns the count written or an AVERROR.
int vx_swr_convert(vx_swr *s, float *out, int cap, const float *in, int n);
void vx_swr_free(vx_swr *s);

// A filter graph of mono float samples (used for atempo).
typedef struct vx_graph vx_graph;
vx_graph *vx_graph_open(int rate, const char *filters, char *err, int errlen);
// Pushes n samples (in NULL: end of stream) and pulls what the graph has ready into its output
// buffer; returns an AVERROR on failure.
int vx_graph_push(vx_graph *g, const float *in, int n);
const float *vx_graph_out(const vx_graph *g, int *len);
void vx_graph_take(vx_graph *g);
void vx_graph_free(vx_graph *g);

#endif
