//go:build !noffmpeg

package main

// withFFmpeg tells whether this build encodes through FFmpeg: compressed formats, resampling
// (pcm at 24 kHz from another rate) and speed. The binary the end-to-end tests build takes the
// same tags from GOFLAGS.
const withFFmpeg = true
