//go:build !noffmpeg

#include "ffmpeg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <libavcodec/avcodec.h>
#include <libavfilter/avfilter.h>
#include <libavfilter/buffersink.h>
#include <libavfilter/buffersrc.h>
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
#include <libavutil/opt.h>
#include <libswresample/swresample.h>

// FFmpeg 6.1 made the AVIO write callback's buffer const.
#if LIBAVFORMAT_VERSION_MAJOR >= 61
#define VX_WBUF const uint8_t
#else
#define VX_WBUF uint8_t
#endif

void vx_quiet_logs(void) { av_log_set_level(AV_LOG_QUIET); }

static void seterr(char *err, int errlen, const char *what, int code) {
    char msg[AV_ERROR_MAX_STRING_SIZE] = "";
    if (code < 0) av_strerror(code, msg, sizeof msg);
    snprintf(err, errlen, "%s%s%s", what, code < 0 ? ": " : "", msg);
}

// A growable byte buffer in C memory, so FFmpeg's callbacks never touch Go memory.
typedef struct {
    uint8_t *p;
    size_t len, cap;
} vx_buf;

static int buf_append(vx_buf *b, const void *data, size_t n) {
    if (b->len + n > b->cap) {
        size_t c = b->cap ? b->cap : 4096;
        while (c < b->len + n) c *= 2;
        uint8_t *p = realloc(b->p, c);
        if (!p) return AVERROR(ENOMEM);
        b->p = p;
        b->cap = c;
    }
    memcpy(b->p + b->len, data, n);
    b->len += n;
    return 0;
}

int vx_codec_rate(const char *name, int rate) {
    const AVCodec *c = avcodec_find_encoder_by_name(name);
    if (!c) return -1;
    if (!c->supported_samplerates) return rate;
    int above = 0, max = 0;
    for (const int *r = c->supported_samplerates; *r; r++) {
        if (*r == rate) return rate;
        if (*r > rate && (!above || *r < above)) above = *r;
        if (*r > max) max = *r;
    }
    return above ? above : max;
}

// ---- encoder ----

struct vx_enc {
    AVCodecContext *ctx;
    AVFormatContext *fmt;
    AVIOContext *pb;
    AVFrame *frame;
    AVPacket *pkt;
    int64_t pts;
    vx_buf out;
};

static int enc_sink(void *opaque, VX_WBUF *data, int n) {
    vx_enc *e = opaque;
    int ret = buf_append(&e->out, data, (size_t)n);
    return ret < 0 ? ret : n;
}

// Float first (no conversion), then 16-bit, then 32-bit integers.
static enum AVSampleFormat pick_fmt(const AVCodec *c) {
    static const enum AVSampleFormat pref[] = {AV_SAMPLE_FMT_FLT, AV_SAMPLE_FMT_FLTP, AV_SAMPLE_FMT_S16,
                                               AV_SAMPLE_FMT_S16P, AV_SAMPLE_FMT_S32, AV_SAMPLE_FMT_S32P};
    if (!c->sample_fmts) return AV_SAMPLE_FMT_FLT;
    for (size_t i = 0; i < sizeof pref / sizeof pref[0]; i++)
        for (const enum AVSampleFormat *f = c->sample_fmts; *f != AV_SAMPLE_FMT_NONE; f++)
            if (*f == pref[i]) return *f;
    return AV_SAMPLE_FMT_NONE;
}

vx_enc *vx_enc_open(const char *codec, const char *muxer, int rate, int64_t bitrate, const char *codecopts,
                    const char *muxopts, char *err, int errlen) {
    const AVCodec *c = avcodec_find_encoder_by_name(codec);
    if (!c) {
        seterr(err, errlen, "encoder not in this FFmpeg build", 0);
        return NULL;
    }
    vx_enc *e = calloc(1, sizeof *e);
    AVDictionary *opts = NULL;
    int ret;
    if (!e) goto nomem;
    e->ctx = avcodec_alloc_context3(c);
    e->frame = av_frame_alloc();
    e->pkt = av_packet_alloc();
    if (!e->ctx || !e->frame || !e->pkt) goto nomem;
    e->ctx->sample_fmt = pick_fmt(c);
    if (e->ctx->sample_fmt == AV_SAMPLE_FMT_NONE) {
        seterr(err, errlen, "encoder takes no float or integer samples", 0);
        goto fail;
    }
    e->ctx->sample_rate = rate;
    e->ctx->time_base = (AVRational){1, rate};
    av_channel_layout_default(&e->ctx->ch_layout, 1);
    if (bitrate > 0) e->ctx->bit_rate = bitrate;

    if ((ret = avformat_alloc_output_context2(&e->fmt, NULL, muxer, NULL)) < 0) {
        seterr(err, errlen, "muxer", ret);
        goto fail;
    }
    if (e->fmt->oformat->flags & AVFMT_GLOBALHEADER) e->ctx->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
    if (codecopts[0] && (ret = av_dict_parse_string(&opts, codecopts, "=", ":", 0)) < 0) {
        seterr(err, errlen, "encoder options", ret);
        goto fail;
    }
    ret = avcodec_open2(e->ctx, c, &opts);
    av_dict_free(&opts);
    if (ret < 0) {
        seterr(err, errlen, "opening encoder", ret);
        goto fail;
    }

    unsigned char *iobuf = av_malloc(4096);
    if (!iobuf) goto nomem;
    e->pb = avio_alloc_context(iobuf, 4096, 1, e, NULL, enc_sink, NULL);
    if (!e->pb) {
        av_free(iobuf);
        goto nomem;
    }
    e->fmt->pb = e->pb;
    e->fmt->flags |= AVFMT_FLAG_CUSTOM_IO;

    AVStream *st = avformat_new_stream(e->fmt, NULL);
    if (!st) goto nomem;
    if ((ret = avcodec_parameters_from_context(st->codecpar, e->ctx)) < 0) {
        seterr(err, errlen, "codec parameters", ret);
        goto fail;
    }
    st->time_base = e->ctx->time_base;
    if (muxopts[0] && (ret = av_dict_parse_string(&opts, muxopts, "=", ":", 0)) < 0) {
        seterr(err, errlen, "muxer options", ret);
        goto fail;
    }
    ret = avformat_write_header(e->fmt, &opts);
    av_dict_free(&opts);
    if (ret < 0) {
        seterr(err, errlen, "writing header", ret);
        goto fail;
    }
    avio_flush(e->pb);
    return e;
nomem:
    seterr(err, errlen, "out of memory", 0);
fail:
    av_dict_free(&opts);
    vx_enc_free(e);
    return NULL;
}

int vx_enc_frame_size(const vx_enc *e) {
    if (e->ctx->codec->capabilities & AV_CODEC_CAP_VARIABLE_FRAME_SIZE) return 0;
    return e->ctx->frame_size;
}

// Moves every packet the encoder has ready into the muxer.
static int drain(vx_enc *e) {
    AVStream *st = e->fmt->streams[0];
    for (;;) {
        int ret = avcodec_receive_packet(e->ctx, e->pkt);
        if (ret == AVERROR(EAGAIN) || ret == AVERROR_EOF) return 0;
        if (ret < 0) return ret;
        av_packet_rescale_ts(e->pkt, e->ctx->time_base, st->time_base);
        e->pkt->stream_index = 0;
        ret = av_write_frame(e->fmt, e->pkt);
        av_packet_unref(e->pkt);
        if (ret < 0) return ret;
    }
}

static void convert(AVFrame *f, const float *pcm, int n) {
    switch (f->format) {
    case AV_SAMPLE_FMT_FLT:
    case AV_SAMPLE_FMT_FLTP:
        memcpy(f->data[0], pcm, (size_t)n * sizeof(float));
        break;
    case AV_SAMPLE_FMT_S16:
    case AV_SAMPLE_FMT_S16P: {
        int16_t *d = (int16_t *)f->data[0];
        for (int i = 0; i < n; i++) {
            float v = pcm[i] > 1 ? 1 : pcm[i] < -1 ? -1 : pcm[i];
            d[i] = (int16_t)lrintf(v * 32767.0f);
        }
        break;
    }
    default: {
        int32_t *d = (int32_t *)f->data[0];
        for (int i = 0; i < n; i++) {
            double v = pcm[i] > 1 ? 1 : pcm[i] < -1 ? -1 : pcm[i];
            d[i] = (int32_t)lrint(v * 2147483647.0);
        }
    }
    }
}

// Encodes one frame of n samples; a short frame is zero-padded for codecs that cannot take one.
static int encode(vx_enc *e, const float *pcm, int n) {
    int size = vx_enc_frame_size(e);
    int len = n;
    if (size > 0 && n < size && !(e->ctx->codec->capabilities & AV_CODEC_CAP_SMALL_LAST_FRAME)) len = size;
    AVFrame *f = e->frame;
    f->nb_samples = len;
    f->format = e->ctx->sample_fmt;
    f->sample_rate = e->ctx->sample_rate;
    int ret = av_channel_layout_copy(&f->ch_layout, &e->ctx->ch_layout);
    if (ret < 0) return ret;
    // A fresh buffer per frame: the encoder may keep a reference to the previous one.
    if ((ret = av_frame_get_buffer(f, 0)) < 0) return ret;
    if (len > n) av_samples_set_silence(f->data, n, len - n, 1, f->format);
    convert(f, pcm, n);
    f->pts = e->pts;
    e->pts += len;
    ret = avcodec_send_frame(e->ctx, f);
    av_frame_unref(f);
    if (ret < 0) return ret;
    return drain(e);
}

// Every muxed byte leaves now: muxers that buffer (ogg pages) close what they hold.
static int flush(vx_enc *e) {
    int ret = av_write_frame(e->fmt, NULL);
    if (ret < 0) return ret;
    avio_flush(e->pb);
    return e->pb->error;
}

int vx_enc_write(vx_enc *e, const float *pcm, int n) {
    int size = vx_enc_frame_size(e);
    if (size == 0) size = n > 0 ? n : 1;
    for (int i = 0; i + size <= n; i += size) {
        int ret = encode(e, pcm + i, size);
        if (ret < 0) return ret;
    }
    return flush(e);
}

int vx_enc_finish(vx_enc *e, const float *pcm, int n) {
    int ret;
    if (n > 0 && (ret = encode(e, pcm, n)) < 0) return ret;
    ret = avcodec_send_frame(e->ctx, NULL);
    if (ret < 0 && ret != AVERROR_EOF) return ret;
    if ((ret = drain(e)) < 0) return ret;
    if ((ret = av_write_trailer(e->fmt)) < 0) return ret;
    avio_flush(e->pb);
    return e->pb->error;
}

const uint8_t *vx_enc_out(const vx_enc *e, int *len) {
    *len = (int)e->out.len;
    return e->out.p;
}

void vx_enc_take(vx_enc *e) { e->out.len = 0; }

void vx_enc_free(vx_enc *e) {
    if (!e) return;
    avformat_free_context(e->fmt); // leaves pb alone: it is custom IO
    if (e->pb) av_freep(&e->pb->buffer);
    avio_context_free(&e->pb);
    avcodec_free_context(&e->ctx);
    av_frame_free(&e->frame);
    av_packet_free(&e->pkt);
    free(e->out.p);
    free(e);
}

// ---- resampler ----

struct vx_swr {
    SwrContext *swr;
};

vx_swr *vx_swr_open(int from, int to, char *err, int errlen) {
    AVChannelLayout mono = AV_CHANNEL_LAYOUT_MONO;
    vx_swr *s = calloc(1, sizeof *s);
    if (!s) {
        seterr(err, errlen, "out of memory", 0);
        return NULL;
    }
    int ret = swr_alloc_set_opts2(&s->swr, &mono, AV_SAMPLE_FMT_FLT, to, &mono, AV_SAMPLE_FMT_FLT, from, 0, NULL);
    if (ret >= 0) ret = swr_init(s->swr);
    if (ret < 0) {
        seterr(err, errlen, "resampler", ret);
        vx_swr_free(s);
        return NULL;
    }
    return s;
}

int vx_swr_out_cap(vx_swr *s, int n) { return swr_get_out_samples(s->swr, n); }

int vx_swr_convert(vx_swr *s, float *out, int cap, const float *in, int n) {
    uint8_t *o[1] = {(uint8_t *)out};
    const uint8_t *i[1] = {(const uint8_t *)in};
    return swr_convert(s->swr, o, cap, in ? i : NULL, n);
}

void vx_swr_free(vx_swr *s) {
    if (!s) return;
    swr_free(&s->swr);
    free(s);
}

// ---- filter graph ----

struct vx_graph {
    AVFilterGraph *g;
    AVFilterContext *src, *sink;
    AVFrame *frame;
    int rate;
    int64_t pts;
    vx_buf out;
};

vx_graph *vx_graph_open(int rate, const char *filters, char *err, int errlen) {
    vx_graph *g = calloc(1, sizeof *g);
    AVFilterInOut *in = NULL, *out = NULL;
    char args[128];
    int ret;
    if (!g) goto nomem;
    g->rate = rate;
    g->g = avfilter_graph_alloc();
    g->frame = av_frame_alloc();
    in = avfilter_inout_alloc();
    out = avfilter_inout_alloc();
    if (!g->g || !g->frame || !in || !out) goto nomem;
    // One thread: the graph is tiny and the router runs many of them at once.
    g->g->nb_threads = 1;
    snprintf(args, sizeof args, "time_base=1/%d:sample_rate=%d:sample_fmt=flt:channel_layout=mono", rate, rate);
    if ((ret = avfilter_graph_create_filter(&g->src, avfilter_get_by_name("abuffer"), "in", args, NULL, g->g)) < 0 ||
        (ret = avfilter_graph_create_filter(&g->sink, avfilter_get_by_name("abuffersink"), "out", NULL, NULL, g->g)) < 0) {
        seterr(err, errlen, "filter graph ends", ret);
        goto fail;
    }
    out->name = av_strdup("in");
    out->filter_ctx = g->src;
    in->name = av_strdup("out");
    in->filter_ctx = g->sink;
    if ((ret = avfilter_graph_parse_ptr(g->g, filters, &in, &out, NULL)) < 0) {
        seterr(err, errlen, "parsing filters", ret);
        goto fail;
    }
    if ((ret = avfilter_graph_config(g->g, NULL)) < 0) {
        seterr(err, errlen, "configuring filters", ret);
        goto fail;
    }
    avfilter_inout_free(&in);
    avfilter_inout_free(&out);
    return g;
nomem:
    seterr(err, errlen, "out of memory", 0);
fail:
    avfilter_inout_free(&in);
    avfilter_inout_free(&out);
    vx_graph_free(g);
    return NULL;
}

int vx_graph_push(vx_graph *g, const float *in, int n) {
    int ret;
    if (in) {
        AVFrame *f = g->frame;
        f->nb_samples = n;
        f->format = AV_SAMPLE_FMT_FLT;
        f->sample_rate = g->rate;
        av_channel_layout_default(&f->ch_layout, 1);
        if ((ret = av_frame_get_buffer(f, 0)) < 0) return ret;
        memcpy(f->data[0], in, (size_t)n * sizeof(float));
        f->pts = g->pts;
        g->pts += n;
        ret = av_buffersrc_add_frame(g->src, f); // takes the frame's reference
        av_frame_unref(f);
    } else {
        ret = av_buffersrc_add_frame(g->src, NULL);
    }
    if (ret < 0) return ret;
    for (;;) {
        ret = av_buffersink_get_frame(g->sink, g->frame);
        if (ret == AVERROR(EAGAIN) || ret == AVERROR_EOF) return 0;
        if (ret < 0) return ret;
        ret = buf_append(&g->out, g->frame->data[0], (size_t)g->frame->nb_samples * sizeof(float));
        av_frame_unref(g->frame);
        if (ret < 0) return ret;
    }
}

const float *vx_graph_out(const vx_graph *g, int *len) {
    *len = (int)(g->out.len / sizeof(float));
    return (const float *)g->out.p;
}

void vx_graph_take(vx_graph *g) { g->out.len = 0; }

void vx_graph_free(vx_graph *g) {
    if (!g) return;
    avfilter_graph_free(&g->g); // frees src and sink
    av_frame_free(&g->frame);
    free(g->out.p);
    free(g);
}
