package main

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// curve is one target's latency distribution in one panel.
type curve struct {
	name  string
	color int // index in palette, the same for a target in every panel
	h     *Hist
}

// panel is one chart: a title and its curves.
type panel struct {
	title  string
	curves []curve
}

var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xd6, 0x27, 0x28, 0xff}, {0x2c, 0xa0, 0x2c, 0xff},
	{0x94, 0x67, 0xbd, 0xff}, {0xff, 0x7f, 0x0e, 0xff}, {0x8c, 0x56, 0x4b, 0xff},
	{0xe3, 0x77, 0xc2, 0xff}, {0x7f, 0x7f, 0x7f, 0xff}, {0xbc, 0xbd, 0x22, 0xff},
}

// svgMaxNines is the x range: up to 99.99 %, i.e. 1/(1-p) = 10^4.
const svgMaxNines = 4.0

// curvePoints is how many points draw one curve.
const curvePoints = 81

// panelW and panelH are one panel's size.
const panelW, panelH vg.Length = 560, 340

// writeSVG draws latency percentile curves with gonum/plot: x is the
// percentile on a log scale of 1/(1-p) (50 %, 90 %, 99 %, 99.9 %,
// 99.99 %), y the latency on a log scale. One panel per workload, stacked,
// one line per target.
func writeSVG(w io.Writer, panels []panel) error {
	if len(panels) == 0 {
		panels = []panel{{title: "no latency recorded"}}
	}
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"} // as the old hand-drawn SVG
	c := vgsvg.New(panelW, panelH*vg.Length(len(panels)))
	plots := make([][]*plot.Plot, len(panels))
	for i, p := range panels {
		plots[i] = []*plot.Plot{panelPlot(p)}
	}
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadTop: 4, PadBottom: 4, PadLeft: 4, PadRight: 8, PadY: 8}
	for i, row := range plot.Align(plots, tiles, draw.New(c)) {
		plots[i][0].Draw(row[0])
	}
	_, err := c.WriteTo(w)
	return err
}

// panelPlot is one panel's plot.
func panelPlot(pn panel) *plot.Plot {
	p := plot.New()
	p.Title.Text = pn.title
	p.X.Label.Text = "percentile"
	p.Y.Label.Text = "latency"
	p.X.Min, p.X.Max = 0, svgMaxNines
	p.X.Tick.Marker = plot.ConstantTicks([]plot.Tick{{Value: math.Log10(2), Label: "50%"}, {Value: 1, Label: "90%"},
		{Value: 2, Label: "99%"}, {Value: 3, Label: "99.9%"}, {Value: 4, Label: "99.99%"}})
	// y in µs, whole decades over every curve.
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, c := range pn.curves {
		if c.h != nil && c.h.Count() > 0 {
			lo = math.Min(lo, math.Log10(us(c.h.Quantile(0))))
			hi = math.Max(hi, math.Log10(us(c.h.Quantile(1))))
		}
	}
	if math.IsInf(lo, 0) {
		lo, hi = 0, 3
	}
	lo, hi = math.Floor(lo), math.Ceil(hi)
	if hi <= lo {
		hi = lo + 1
	}
	p.Y.Scale = plot.LogScale{}
	p.Y.Min, p.Y.Max = math.Pow(10, lo), math.Pow(10, hi)
	p.Y.Tick.Marker = plot.TickerFunc(decadeTicks)
	p.Add(plotter.NewGrid())
	p.Legend.Top = false // bottom right: the curves rise to the right
	for _, c := range pn.curves {
		if c.h == nil || c.h.Count() == 0 {
			continue
		}
		pts := make(plotter.XYs, curvePoints)
		for k := range pts {
			n := svgMaxNines * float64(k) / (curvePoints - 1)
			pts[k].X = n
			pts[k].Y = math.Max(us(c.h.Quantile(1-math.Pow(10, -n))), p.Y.Min)
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			continue // NaN or Inf: not drawn (cannot happen: us clamps)
		}
		l.Color = palette[c.color%len(palette)]
		l.Width = vg.Points(2)
		p.Add(l)
		p.Legend.Add(c.name, l)
	}
	return p
}

// decadeTicks marks each power of ten of microseconds with its name and
// the values between (2..9 × 10ⁿ) without one.
func decadeTicks(min, max float64) []plot.Tick {
	var ts []plot.Tick
	for l := math.Floor(math.Log10(min)); l <= math.Ceil(math.Log10(max)); l++ {
		base := math.Pow(10, l)
		if base >= min && base <= max {
			ts = append(ts, plot.Tick{Value: base, Label: tick(l)})
		}
		for m := 2.0; m < 10; m++ {
			if v := m * base; v >= min && v <= max {
				ts = append(ts, plot.Tick{Value: v})
			}
		}
	}
	return ts
}

func us(d time.Duration) float64 { return math.Max(float64(d)/1e3, 1e-3) }

// svgPanels merges every round's histograms per workload and target.
func svgPanels(rs []*Result) []panel {
	var out []panel
	add := func(title, wl string, get func(*Result) *Hist) {
		p := panel{title: title}
		for ti, tg := range order(rs, func(r *Result) string { return r.Target }) {
			h := NewHist()
			for _, r := range rs {
				if r.Workload == wl && r.Target == tg {
					h.Merge(get(r))
				}
			}
			if h.Count() > 0 {
				p.curves = append(p.curves, curve{tg, ti, h})
			}
		}
		if len(p.curves) > 0 {
			out = append(out, p)
		}
	}
	add("uncontended: acquire latency", wlUncontended, func(r *Result) *Hist { return r.hist })
	add("contended: acquire latency (whole wait)", wlContended, func(r *Result) *Hist { return r.hist })
	add("contended: handoff latency (release sent → next grant read)", wlContended, func(r *Result) *Hist { return r.hand })
	add("fanin: renew latency", wlFanin, func(r *Result) *Hist { return r.hist })
	return out
}

// tick labels a power of ten of microseconds.
func tick(l float64) string {
	names := map[int]string{-1: "100ns", 0: "1µs", 1: "10µs", 2: "100µs", 3: "1ms", 4: "10ms", 5: "100ms", 6: "1s", 7: "10s", 8: "100s"}
	if s, ok := names[int(l)]; ok {
		return s
	}
	return fmt.Sprintf("1e%.0fµs", l)
}
