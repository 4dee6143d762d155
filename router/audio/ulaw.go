package audio

// ULaw encodes samples in [-1, 1] as 8-bit G.711 μ-law, appending to dst.
func ULaw(dst []byte, pcm []float32) []byte {
	const bias, clip = 0x84, 32635
	for _, v := range pcm {
		s := int(max(-1, min(1, v)) * 32767)
		sign := 0
		if s < 0 {
			s, sign = -s, 0x80
		}
		s = min(s, clip) + bias
		exp := 7
		for mask := 0x4000; s&mask == 0 && exp > 0; mask >>= 1 {
			exp--
		}
		mant := (s >> (exp + 3)) & 0x0f
		dst = append(dst, ^byte(sign|exp<<4|mant))
	}
	return dst
}
