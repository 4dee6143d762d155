//go:build noffmpeg

package audio

func decodeFFmpeg([]byte, float64) ([]float32, int, error) { return nil, 0, ErrUnsupported }
