package bench

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"path/filepath"
	"slices"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// Plots (gonum.org/v1/plot), written as PNG next to report.md. Every
// variant keeps one colour and glyph across a scenario's plots.

const (
	plotWidth  = 7 * vg.Inch
	plotHeight = 4.5 * vg.Inch
)

var plotColors = []color.RGBA{
	{R: 0xd6, G: 0x27, B: 0x28, A: 0xff}, // red
	{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff}, // blue
	{R: 0x2c, G: 0xa0, B: 0x2c, A: 0xff}, // green
	{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff}, // grey
	{R: 0xff, G: 0x7f, B: 0x0e, A: 0xff}, // orange
	{R: 0x94, G: 0x67, B: 0xbd, A: 0xff}, // purple
	{R: 0x8c, G: 0x56, B: 0x4b, A: 0xff}, // brown
	{R: 0xe3, G: 0x77, B: 0xc2, A: 0xff}, // pink
	{R: 0x17, G: 0xbe, B: 0xcf, A: 0xff}, // cyan
}

var plotGlyphs = []draw.GlyphDrawer{draw.CircleGlyph{}, draw.TriangleGlyph{}, draw.SquareGlyph{}, draw.CrossGlyph{}, draw.RingGlyph{}, draw.PlusGlyph{}}

// series is one variant's line on a plot.
type series struct {
	name string
	xys  plotter.XYs
}

func newPlot(title, xLabel, yLabel string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.Add(plotter.NewGrid())
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.XOffs = vg.Points(12)
	p.Legend.YOffs = -vg.Points(12)
	return p
}

// logAxis makes an axis logarithmic, widening a degenerate range (log
// scales need min < max, both positive).
func logAxis(a *plot.Axis, min, max float64) {
	if min <= 0 {
		min = 1e-3
	}
	if max <= min {
		min, max = min/2, min*2
	}
	a.Scale = plot.LogScale{}
	a.Tick.Marker = plot.LogTicks{Prec: -1}
	// A little room either side, and at least one decade shown whole, so
	// that the axis has labelled ticks.
	a.Min, a.Max = min/1.4, max*1.4
	if math.Floor(math.Log10(a.Max)) == math.Floor(math.Log10(a.Min)) {
		a.Min = math.Pow(10, math.Floor(math.Log10(a.Min)))
		a.Max = math.Pow(10, math.Ceil(math.Log10(a.Max)))
	}
}

// addSeries draws each series as a line with points, in its variant's
// colour (by index into names).
func addSeries(p *plot.Plot, names []string, ss []series, points bool) error {
	for _, s := range ss {
		i := max(0, slices.Index(names, s.name))
		c := plotColors[i%len(plotColors)]
		l, err := plotter.NewLine(s.xys)
		if err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		l.Color = c
		l.Width = vg.Points(1.5)
		p.Add(l)
		if points {
			sc, err := plotter.NewScatter(s.xys)
			if err != nil {
				return fmt.Errorf("%s: %w", s.name, err)
			}
			sc.Color = c
			sc.Shape = plotGlyphs[i%len(plotGlyphs)]
			sc.Radius = vg.Points(3)
			p.Add(sc)
			p.Legend.Add(s.name, l, sc)
		} else {
			p.Legend.Add(s.name, l)
		}
	}
	return nil
}

// cdfPoints turns a latency histogram (µs) into (ms, cumulative fraction)
// points, dense in the tail.
func cdfPoints(h *hdrhistogram.Histogram) plotter.XYs {
	if h == nil || h.TotalCount() == 0 {
		return nil
	}
	var qs []float64
	for q := 0.5; q < 90; q += 0.5 {
		qs = append(qs, q)
	}
	for q := 90.0; q < 99; q += 0.1 {
		qs = append(qs, q)
	}
	for q := 99.0; q < 99.9; q += 0.01 {
		qs = append(qs, q)
	}
	qs = append(qs, 99.9, 99.95, 99.99, 100)
	var out plotter.XYs
	for _, q := range qs {
		v := float64(h.ValueAtQuantile(q)) / 1000
		if v <= 0 {
			v = 0.001
		}
		out = append(out, plotter.XY{X: v, Y: q / 100})
	}
	return out
}

// savePlot writes p as dir/name and returns name.
func savePlot(p *plot.Plot, dir, name string) (string, error) {
	if err := p.Save(plotWidth, plotHeight, filepath.Join(dir, name)); err != nil {
		return "", fmt.Errorf("save %s: %w", name, err)
	}
	return name, nil
}

// cdfPlot draws one latency CDF per series (x: ms, log scale).
func cdfPlot(dir, name, title string, names []string, hists []*hdrhistogram.Histogram, labels []string) (string, error) {
	p := newPlot(title, "client latency (ms, log scale)", "fraction of operations at or below")
	var ss []series
	lo, hi := math.Inf(1), 0.0
	for i, h := range hists {
		pts := cdfPoints(h)
		if len(pts) == 0 {
			continue
		}
		lo, hi = min(lo, pts[0].X), max(hi, pts[len(pts)-1].X)
		ss = append(ss, series{name: labels[i], xys: pts})
	}
	if len(ss) == 0 {
		return "", nil
	}
	logAxis(&p.X, lo, hi)
	p.Y.Min, p.Y.Max = 0, 1.05
	if err := addSeries(p, names, ss, false); err != nil {
		return "", err
	}
	return savePlot(p, dir, name)
}

// dcPlots draws follower-read-dc's plots: a latency CDF per scan length,
// and p99 and ops/s by scan length.
func dcPlots(dir string, runs []DCRun, lengths []int) ([]string, error) {
	var names []string
	for _, v := range DCVariants {
		names = append(names, v.Name)
	}
	var out []string
	var errs []error
	for _, l := range lengths {
		var hists []*hdrhistogram.Histogram
		var labels []string
		for _, r := range runs {
			if r.ScanLength == l {
				hists = append(hists, r.Phase.Latency)
				labels = append(labels, r.Variant.Name)
			}
		}
		f, err := cdfPlot(dir, fmt.Sprintf("cdf-scan-%d.png", l), fmt.Sprintf("follower-read-dc: latency CDF, %d-key scans", l), names, hists, labels)
		if err != nil {
			errs = append(errs, err)
		} else if f != "" {
			out = append(out, f)
		}
	}
	if len(lengths) > 1 {
		for _, m := range []struct {
			file, title, label string
			get                func(Row) float64
		}{
			{"p99-by-scan-length.png", "follower-read-dc: client p99 by scan length", "client p99 latency (ms, log scale)", func(r Row) float64 { return r.P99Ms }},
			{"qps-by-scan-length.png", "follower-read-dc: throughput by scan length", "scans per second (log scale)", func(r Row) float64 { return r.QPS }},
		} {
			f, err := byScanLengthPlot(dir, m.file, m.title, m.label, names, runs, m.get)
			if err != nil {
				errs = append(errs, err)
			} else if f != "" {
				out = append(out, f)
			}
		}
	}
	return out, errors.Join(errs...)
}

func byScanLengthPlot(dir, file, title, yLabel string, names []string, runs []DCRun, get func(Row) float64) (string, error) {
	p := newPlot(title, "keys per scan (log scale)", yLabel)
	var ss []series
	xlo, xhi, ylo, yhi := math.Inf(1), 0.0, math.Inf(1), 0.0
	for _, name := range names {
		var xys plotter.XYs
		for _, r := range runs {
			if r.Variant.Name != name {
				continue
			}
			y := get(r.Phase.Row)
			if y <= 0 {
				continue
			}
			x := float64(r.ScanLength)
			xys = append(xys, plotter.XY{X: x, Y: y})
			xlo, xhi, ylo, yhi = min(xlo, x), max(xhi, x), min(ylo, y), max(yhi, y)
		}
		if len(xys) > 0 {
			slices.SortFunc(xys, func(a, b plotter.XY) int { return int(a.X - b.X) })
			ss = append(ss, series{name: name, xys: xys})
		}
	}
	if len(ss) == 0 {
		return "", nil
	}
	logAxis(&p.X, xlo, xhi)
	logAxis(&p.Y, ylo, yhi)
	if err := addSeries(p, names, ss, true); err != nil {
		return "", err
	}
	if file == "qps-by-scan-length.png" {
		// Throughput falls with scan length: the top right is empty.
		p.Legend.Left, p.Legend.XOffs = false, -vg.Points(12)
	}
	return savePlot(p, dir, file)
}

// barPlot draws one bar per label (hot-region's total ops/s per
// variant), each with its value and, if notes is set, a note above it.
func barPlot(dir, file, title, yLabel string, labels []string, values []float64, notes []string) (string, error) {
	p := newPlot(title, "", yLabel)
	bars, err := plotter.NewBarChart(plotter.Values(values), vg.Points(50))
	if err != nil {
		return "", err
	}
	bars.Color = plotColors[1]
	bars.LineStyle.Width = 0
	p.Add(bars)
	var top float64
	xys := make(plotter.XYs, len(values))
	texts := make([]string, len(values))
	for i, v := range values {
		top = max(top, v)
		xys[i] = plotter.XY{X: float64(i), Y: v}
		texts[i] = FormatFloat(v, 0)
		if i < len(notes) && notes[i] != "" {
			texts[i] += " (" + notes[i] + ")"
		}
	}
	tl, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
	if err != nil {
		return "", err
	}
	for i := range tl.TextStyle {
		tl.TextStyle[i].XAlign = draw.XCenter
		tl.TextStyle[i].YAlign = draw.YBottom
	}
	p.Add(tl)
	p.NominalX(labels...)
	p.X.Min, p.X.Max = -0.6, float64(len(values))-0.4
	p.Y.Min, p.Y.Max = 0, top*1.15
	return savePlot(p, dir, file)
}
