//go:build !noffmpeg

#include "decode.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
#include <libswresample/swresample.h>

// The file in memory that the custom AVIOContext reads.
typedef struct {
    const uint8_t *p;
    int64_t len, pos;
} mem;

static int mem_read(void *opaque, uint8_t *buf, int size) {
    mem *m = opaque;
    int64_t left = m->len - m->pos;
    if (left <= 0) return AVERROR_EOF;
    if (size > left) size = (int)left;
    memcpy(buf, m->p + m->pos, size);
    m->pos += size;
    return size;
}

static int64_t mem_seek(void *opaque, int64_t off, int whence) {
    mem *m = opaque;
    int64_t to;
    switch (whence & ~AVSEEK_FORCE) {
    case AVSEEK_SIZE: return m->len;
    case SEEK_SET: to = off; break;
    case SEEK_CUR: to = m->pos + off; break;
    case SEEK_END: to = m->len + off; break;
    default: return AVERROR(EINVAL);
    }
    if (to < 0 || to > m->len) return AVERROR(EINVAL);
    m->pos = to;
    return to;
}

static void derr(char *err, int errlen, const char *what, int code) {
    char msg[AV_ERROR_MAX_STRING_SIZE] = "";
    if (code < 0) av_strerror(code, msg, sizeof msg);
    snprintf(err, errlen, "%s%s%s", what, code < 0 ? ": " : "", msg);
}

// The decoding state, freed as a whole by dec_free.
typedef struct {
    mem m;
    AVIOContext *io;
    AVFormatContext *fmt;
    AVCodecContext *cc;
    SwrContext *swr;
    AVPacket *pkt;
    AVFrame *frame;
    float *out;
    int64_t n, cap, max;
} dec;

static void dec_free(dec *d) {
    if (d->fmt) avformat_close_input(&d->fmt);
    if (d->io) {
        av_freep(&d->io->buffer);
        avio_context_free(&d->io);
    }
    avcodec_free_context(&d->cc);
    swr_free(&d->swr);
    av_packet_free(&d->pkt);
    av_frame_free(&d->frame);
    free(d->out);
}

// grow makes room for want more samples.
static int grow(dec *d, int64_t want) {
    if (d->n + want <= d->cap) return 0;
    int64_t c = d->cap ? d->cap : 1 << 16;
    while (c < d->n + want) c *= 2;
    float *p = realloc(d->out, c * sizeof(float));
    if (!p) return AVERROR(ENOMEM);
    d->out = p;
    d->cap = c;
    return 0;
}

// convert resamples a frame (NULL: the resampler's tail) to mono float and appends it.
static int convert(dec *d, const AVFrame *f, char *err, int errlen) {
    if (!d->swr) {
        if (!f) return 0;
        AVChannelLayout in = {0}, mono = AV_CHANNEL_LAYOUT_MONO;
        int ret = av_channel_layout_copy(&in, &f->ch_layout);
        if (ret >= 0 && in.order == AV_CHANNEL_ORDER_UNSPEC) {
            int ch = in.nb_channels;
            av_channel_layout_uninit(&in);
            av_channel_layout_default(&in, ch);
        }
        if (ret >= 0)
            ret = swr_alloc_set_opts2(&d->swr, &mono, AV_SAMPLE_FMT_FLT, f->sample_rate, &in, f->format, f->sample_rate, 0,
                                      NULL);
        av_channel_layout_uninit(&in);
        if (ret >= 0) ret = swr_init(d->swr);
        if (ret < 0) {
            derr(err, errlen, "resampler", ret);
            return ret;
        }
    }
    int in_n = f ? f->nb_samples : 0;
    int want = swr_get_out_samples(d->swr, in_n);
    if (want < 0) return want;
    int ret = grow(d, want);
    if (ret < 0) {
        derr(err, errlen, "out of memory", 0);
        return ret;
    }
    uint8_t *o[1] = {(uint8_t *)(d->out + d->n)};
    ret = swr_convert(d->swr, o, want, f ? (const uint8_t **)f->extended_data : NULL, in_n);
    if (ret < 0) {
        derr(err, errlen, "resampling", ret);
        return ret;
    }
    d->n += ret;
    if (d->max > 0 && d->n > d->max) {
        snprintf(err, errlen, "longer than the limit");
        return VX_DECODE_TOO_LONG;
    }
    return 0;
}

// drain takes every frame the decoder has ready.
static int drain(dec *d, char *err, int errlen) {
    for (;;) {
        int ret = avcodec_receive_frame(d->cc, d->frame);
        if (ret == AVERROR(EAGAIN) || ret == AVERROR_EOF) return 0;
        if (ret < 0) {
            derr(err, errlen, "decoding", ret);
            return ret;
        }
        ret = convert(d, d->frame, err, errlen);
        av_frame_unref(d->frame);
        if (ret != 0) return ret;
    }
}

static int run(dec *d, double max_seconds, int *rate, char *err, int errlen) {
    const int bufsize = 1 << 16;
    uint8_t *buf = av_malloc(bufsize);
    if (!buf) return AVERROR(ENOMEM);
    d->io = avio_alloc_context(buf, bufsize, 0, &d->m, mem_read, NULL, mem_seek);
    if (!d->io) {
        av_free(buf);
        return AVERROR(ENOMEM);
    }
    d->fmt = avformat_alloc_context();
    if (!d->fmt) return AVERROR(ENOMEM);
    d->fmt->pb = d->io;
    d->fmt->flags |= AVFMT_FLAG_CUSTOM_IO;
    int ret = avformat_open_input(&d->fmt, NULL, NULL, NULL);
    if (ret < 0) {
        derr(err, errlen, "not an audio file FFmpeg can read", ret);
        return ret;
    }
    if ((ret = avformat_find_stream_info(d->fmt, NULL)) < 0) {
        derr(err, errlen, "reading the stream", ret);
        return ret;
    }
    const AVCodec *codec = NULL;
    int idx = av_find_best_stream(d->fmt, AVMEDIA_TYPE_AUDIO, -1, -1, &codec, 0);
    if (idx < 0 || !codec) {
        derr(err, errlen, "no audio stream FFmpeg can decode", idx < 0 ? idx : 0);
        return idx < 0 ? idx : AVERROR_DECODER_NOT_FOUND;
    }
    d->cc = avcodec_alloc_context3(codec);
    if (!d->cc) return AVERROR(ENOMEM);
    if ((ret = avcodec_parameters_to_context(d->cc, d->fmt->streams[idx]->codecpar)) < 0 ||
        (ret = avcodec_open2(d->cc, codec, NULL)) < 0) {
        derr(err, errlen, "opening the decoder", ret);
        return ret;
    }
    if (d->cc->sample_rate <= 0) {
        derr(err, errlen, "the stream has no sample rate", 0);
        return AVERROR_INVALIDDATA;
    }
    *rate = d->cc->sample_rate;
    d->max = max_seconds > 0 ? (int64_t)(max_seconds * d->cc->sample_rate) : 0;
    d->pkt = av_packet_alloc();
    d->frame = av_frame_alloc();
    if (!d->pkt || !d->frame) return AVERROR(ENOMEM);
    while ((ret = av_read_frame(d->fmt, d->pkt)) >= 0) {
        if (d->pkt->stream_index == idx) {
            ret = avcodec_send_packet(d->cc, d->pkt);
            // A damaged packet is skipped, as players do; the rest of the file may decode.
            if (ret >= 0 || ret == AVERROR_INVALIDDATA) ret = drain(d, err, errlen);
        } else {
            ret = 0;
        }
        av_packet_unref(d->pkt);
        if (ret != 0) return ret;
    }
    if (ret != AVERROR_EOF) {
        derr(err, errlen, "reading the file", ret);
        return ret;
    }
    avcodec_send_packet(d->cc, NULL);
    if ((ret = drain(d, err, errlen)) != 0) return ret;
    if ((ret = convert(d, NULL, err, errlen)) != 0) return ret;
    if (d->n == 0) {
        derr(err, errlen, "the file holds no audio", 0);
        return AVERROR_INVALIDDATA;
    }
    return 0;
}

int vx_decode(const uint8_t *data, int64_t len, double max_seconds, float **out, int64_t *n, int *rate, char *err,
              int errlen) {
    dec d = {.m = {.p = data, .len = len}};
    int ret = run(&d, max_seconds, rate, err, errlen);
    if (ret == 0) {
        *out = d.out;
        *n = d.n;
        d.out = NULL;
    }
    dec_free(&d);
    return ret;
}
