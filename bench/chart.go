package bench

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Colours of the first (subject) and second (baseline) target.
var targetColors = []color.Color{
	color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	color.RGBA{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff},
}

// series is one line of a panel: a figure of one target at every level.
type series struct {
	name   string
	target int
	dashed bool
	value  func(LevelResult) Value
}

// WritePNG draws three panels against concurrency (log₂ axis): TTFB P50/P95, RTF P50/P95 and
// throughput in × real time, one colour per target, P95 dashed.
func (r *Report) WritePNG(w io.Writer) error {
	panels := []struct {
		title, ylabel string
		logY          bool
		lines         []series
	}{
		{"Time to first audio", "TTFB (ms)", true, r.pairs("P50", "P95",
			func(l LevelResult) Value { return l.TTFBP50Ms }, func(l LevelResult) Value { return l.TTFBP95Ms })},
		{"Real-time factor (below 1: faster than real time)", "RTF", true, r.pairs("P50", "P95",
			func(l LevelResult) Value { return l.RTFP50 }, func(l LevelResult) Value { return l.RTFP95 })},
		{"Throughput", "× real time", false, r.pairs("", "",
			func(l LevelResult) Value { return l.RealTimeX }, nil)},
	}
	plots := make([][]*plot.Plot, len(panels))
	for i, pn := range panels {
		p, err := r.panel(pn.title, pn.ylabel, pn.logY, pn.lines)
		if err != nil {
			return err
		}
		plots[i] = []*plot.Plot{p}
	}
	width, height := 8*vg.Inch, 11*vg.Inch
	img := vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(110), vgimg.UseBackgroundColor(color.White))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(plots), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6),
		PadLeft: vg.Points(6), PadRight: vg.Points(10), PadY: vg.Points(14)}
	canvases := plot.Align(plots, tiles, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	_, err := vgimg.PngCanvas{Canvas: img}.WriteTo(w)
	return err
}

// pairs builds the series of a panel: for each target, a solid line from a and, when b is set,
// a dashed one from b.
func (r *Report) pairs(aName, bName string, a, b func(LevelResult) Value) []series {
	var out []series
	for i, t := range r.Targets {
		name := t.Name
		if aName != "" {
			name += " " + aName
		}
		out = append(out, series{name: name, target: i, value: a})
		if b != nil {
			out = append(out, series{name: t.Name + " " + bName, target: i, dashed: true, value: b})
		}
	}
	return out
}

func (r *Report) panel(title, ylabel string, logY bool, lines []series) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "concurrent requests"
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())

	levels := map[int]bool{}
	ymin, ymax := math.Inf(1), math.Inf(-1)
	for _, s := range lines {
		if s.target >= len(r.Targets) {
			continue
		}
		var pts plotter.XYs
		for _, l := range r.Targets[s.target].Levels {
			levels[l.Concurrency] = true
			v := s.value(l)
			if !v.Known() || (logY && v <= 0) {
				continue
			}
			pts = append(pts, plotter.XY{X: float64(l.Concurrency), Y: float64(v)})
			ymin, ymax = math.Min(ymin, float64(v)), math.Max(ymax, float64(v))
		}
		if len(pts) == 0 {
			continue
		}
		line, points, err := plotter.NewLinePoints(pts)
		if err != nil {
			return nil, fmt.Errorf("chart %s: %w", title, err)
		}
		c := targetColors[s.target%len(targetColors)]
		line.Color, points.Color = c, c
		line.Width = vg.Points(1.5)
		points.Shape = draw.CircleGlyph{}
		points.Radius = vg.Points(2.5)
		if s.dashed {
			line.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		p.Add(line, points)
		p.Legend.Add(s.name, line, points)
	}

	// Concurrency on a log₂ axis, one labelled tick per level.
	var ticks []plot.Tick
	xmin, xmax := math.Inf(1), math.Inf(-1)
	for c := range levels {
		ticks = append(ticks, plot.Tick{Value: float64(c), Label: strconv.Itoa(c)})
		xmin, xmax = math.Min(xmin, float64(c)), math.Max(xmax, float64(c))
	}
	if len(ticks) == 0 {
		xmin, xmax = 1, 1
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = plot.ConstantTicks(ticks)
	p.X.Min, p.X.Max = xmin/1.25, xmax*1.25

	switch {
	case math.IsInf(ymin, 1):
		p.Y.Min, p.Y.Max = 0, 1 // no data
	case logY:
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.TickerFunc(logTicks125)
		p.Y.Min, p.Y.Max = ymin/1.3, ymax*1.3
	default:
		p.Y.Min, p.Y.Max = 0, math.Max(ymax*1.1, 1e-9)
	}
	return p, nil
}

// logTicks125 labels 1, 2 and 5 times each power of ten in [min, max].
func logTicks125(min, max float64) []plot.Tick {
	var ticks []plot.Tick
	for e := math.Floor(math.Log10(min)); e <= math.Ceil(math.Log10(max)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v < min || v > max {
				continue
			}
			ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
		}
	}
	if len(ticks) < 2 {
		ticks = append(ticks, plot.Tick{Value: min, Label: strconv.FormatFloat(min, 'g', 3, 64)},
			plot.Tick{Value: max, Label: strconv.FormatFloat(max, 'g', 3, 64)})
	}
	return ticks
}
