//go:build noffmpeg

package main

// withFFmpeg is false in builds with -tags noffmpeg: only wav, and pcm at the model's rate, at
// speed 1.
const withFFmpeg = false
