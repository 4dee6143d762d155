package bench

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/schollz/progressbar/v3"
)

// Bar is a terminal progress bar (one line per level) showing the target, the concurrency and
// the requests done.
type Bar struct {
	w      io.Writer
	mu     sync.Mutex
	bar    *progressbar.ProgressBar
	failed int
	desc   string
}

// NewBar draws on w, normally a terminal's stderr.
func NewBar(w io.Writer) *Bar { return &Bar{w: w} }

// StartLevel begins a new bar.
func (b *Bar) StartLevel(target string, concurrency, total int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failed = 0
	b.desc = fmt.Sprintf("%s c=%d", target, concurrency)
	b.bar = progressbar.NewOptions(total,
		progressbar.OptionSetWriter(b.w),
		progressbar.OptionSetDescription(b.desc),
		progressbar.OptionShowCount(),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionSetPredictTime(total > 0),
		progressbar.OptionSetWidth(30),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetRenderBlankState(true),
	)
}

// Done counts a request.
func (b *Bar) Done(ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bar == nil {
		return
	}
	if !ok {
		b.failed++
		b.bar.Describe(fmt.Sprintf("%s (%d failed)", b.desc, b.failed))
	}
	_ = b.bar.Add(1)
}

// EndLevel closes the current bar and moves to a new line.
func (b *Bar) EndLevel() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.bar == nil {
		return
	}
	_ = b.bar.Finish()
	fmt.Fprintln(b.w)
	b.bar = nil
}
