package engine

// Buckets are the batch sizes of graphs run in fixed shapes, up to the first of at least rows:
// powers of two to 8, then steps of ×1.5 and ×4/3 (16, 24, 32, 48, ...), so padding stays under
// half a step's rows.
func Buckets(rows int) []int {
	var out []int
	for b := 1; ; {
		out = append(out, b)
		if b >= rows {
			return out
		}
		switch {
		case b < 16:
			b *= 2
		case b&(b-1) == 0:
			b += b / 2
		default:
			b = b / 3 * 4
		}
	}
}
