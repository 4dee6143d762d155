package router

import "encoding/binary"

// A response sent whole ("stream": false) is encoded as a stream and then has its header
// completed here, since the length is known only at the end: the encoders write headers that say
// "length unknown" because those headers leave before the audio.

// completeHeader fills in the lengths a format's header leaves open; other formats are returned
// as they are.
func completeHeader(format string, b []byte) []byte {
	switch format {
	case "wav":
		completeWAV(b)
	case "flac":
		completeFLAC(b)
	}
	return b
}

// completeWAV writes the RIFF and data chunk sizes of a 44-byte-header WAV file.
func completeWAV(b []byte) {
	if len(b) < 44 || string(b[0:4]) != "RIFF" || string(b[8:12]) != "WAVE" || string(b[36:40]) != "data" {
		return
	}
	binary.LittleEndian.PutUint32(b[4:8], uint32(len(b)-8))
	binary.LittleEndian.PutUint32(b[40:44], uint32(len(b)-44))
}

// completeFLAC writes the total number of samples into STREAMINFO, counted from the frames (a
// FLAC stream's header, written before the audio, says 0: unknown). The stream is left alone
// when its frames cannot be followed to the end.
func completeFLAC(b []byte) {
	if len(b) < 42 || string(b[0:4]) != "fLaC" || b[4]&0x7F != 0 { // STREAMINFO comes first
		return
	}
	// Skip the metadata blocks.
	p := 4
	for {
		if p+4 > len(b) {
			return
		}
		last := b[p]&0x80 != 0
		p += 4 + (int(b[p+1])<<16 | int(b[p+2])<<8 | int(b[p+3]))
		if last {
			break
		}
	}
	total, ok := flacSamples(b, p)
	if !ok || total >= 1<<36 {
		return
	}
	si := b[8:42]
	si[13] = si[13]&0xF0 | byte(total>>32)
	binary.BigEndian.PutUint32(si[14:18], uint32(total))
}

// flacSamples sums the block sizes of the frames from p to the end of b. Each frame's end is the
// next offset where a frame header with a valid CRC-8 begins and the CRC-16 of the bytes before it
// matches (or the end of b): a frame's own bytes may contain the sync code.
func flacSamples(b []byte, p int) (uint64, bool) {
	var total uint64
	for p < len(b) {
		size, hlen, ok := flacFrameHeader(b[p:])
		if !ok {
			return 0, false
		}
		crc := crc16(0, b[p:p+hlen])
		end := -1
		for q := p + hlen; q+2 <= len(b); q++ {
			// crc covers b[p:q]; b[q:q+2] would be this frame's CRC-16.
			if binary.BigEndian.Uint16(b[q:q+2]) == crc {
				next := q + 2
				if next == len(b) {
					end = next
					break
				}
				if _, _, ok := flacFrameHeader(b[next:]); ok {
					end = next
					break
				}
			}
			crc = crc16(crc, b[q:q+1])
		}
		if end < 0 {
			return 0, false
		}
		total += uint64(size)
		p = end
	}
	return total, true
}

// flacFrameHeader parses a frame header at the start of b: its block size and length, false when
// b does not start with one (or its CRC-8 is wrong).
func flacFrameHeader(b []byte) (size, n int, ok bool) {
	if len(b) < 6 || b[0] != 0xFF || b[1]&0xFE != 0xF8 || b[3]&1 != 0 {
		return 0, 0, false
	}
	bsCode, srCode := int(b[2]>>4), int(b[2]&0x0F)
	if bsCode == 0 || srCode == 15 {
		return 0, 0, false
	}
	// The frame or sample number, UTF-8 coded in 1 to 7 bytes.
	n = 4
	lead := b[n]
	extra := 0
	switch {
	case lead&0x80 == 0:
	case lead&0xE0 == 0xC0:
		extra = 1
	case lead&0xF0 == 0xE0:
		extra = 2
	case lead&0xF8 == 0xF0:
		extra = 3
	case lead&0xFC == 0xF8:
		extra = 4
	case lead&0xFE == 0xFC:
		extra = 5
	case lead == 0xFE:
		extra = 6
	default:
		return 0, 0, false
	}
	n += 1 + extra
	switch {
	case bsCode == 1:
		size = 192
	case bsCode <= 5:
		size = 576 << (bsCode - 2)
	case bsCode == 6:
		n++
	case bsCode == 7:
		n += 2
	default:
		size = 256 << (bsCode - 8)
	}
	switch srCode {
	case 12:
		n++
	case 13, 14:
		n += 2
	}
	if n+1 > len(b) {
		return 0, 0, false
	}
	switch bsCode {
	case 6:
		size = int(b[n-1-srExtra(srCode)]) + 1
	case 7:
		i := n - 2 - srExtra(srCode)
		size = int(binary.BigEndian.Uint16(b[i:i+2])) + 1
	}
	if crc8(b[:n]) != b[n] {
		return 0, 0, false
	}
	return size, n + 1, true
}

func srExtra(code int) int {
	switch code {
	case 12:
		return 1
	case 13, 14:
		return 2
	}
	return 0
}

// crc8 is FLAC's header CRC (polynomial x^8+x^2+x+1, initial 0).
func crc8(b []byte) byte {
	var c byte
	for _, v := range b {
		c ^= v
		for i := 0; i < 8; i++ {
			if c&0x80 != 0 {
				c = c<<1 ^ 0x07
			} else {
				c <<= 1
			}
		}
	}
	return c
}

// crc16 continues FLAC's frame CRC (polynomial x^16+x^15+x^2+1, initial 0) over b.
func crc16(c uint16, b []byte) uint16 {
	for _, v := range b {
		c ^= uint16(v) << 8
		for i := 0; i < 8; i++ {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x8005
			} else {
				c <<= 1
			}
		}
	}
	return c
}
