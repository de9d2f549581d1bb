package main

import (
	"fmt"
	"io"
	"math"
	"strings"
	"time"
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

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"}

// svgPercentiles is the x range: up to 99.99 %, i.e. 1/(1-p) = 10^4.
const svgMaxNines = 4.0

// writeSVG draws latency percentile curves: x is the percentile on a log
// scale of 1/(1-p) (50 %, 90 %, 99 %, 99.9 %, 99.99 %), y the latency on a
// log scale. One panel per workload, one line per target.
func writeSVG(w io.Writer, panels []panel) error {
	const (
		pw, ph         = 560.0, 340.0 // panel size
		ml, mr, mt, mb = 70.0, 120.0, 40.0, 50.0
	)
	W := pw
	H := ph * float64(len(panels))
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", W, H, W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	for pi, p := range panels {
		oy := ph * float64(pi)
		x0, x1 := ml, pw-mr
		y0, y1 := oy+ph-mb, oy+mt
		// y range in log10(µs) over every curve.
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, c := range p.curves {
			if c.h == nil || c.h.Count() == 0 {
				continue
			}
			lo = math.Min(lo, math.Log10(us(c.h.Quantile(0))))
			hi = math.Max(hi, math.Log10(us(c.h.Quantile(1))))
		}
		if math.IsInf(lo, 0) {
			lo, hi = 0, 3
		}
		lo, hi = math.Floor(lo), math.Ceil(hi)
		if hi <= lo {
			hi = lo + 1
		}
		px := func(nines float64) float64 { return x0 + (x1-x0)*nines/svgMaxNines }
		py := func(l float64) float64 { return y0 - (y0-y1)*(l-lo)/(hi-lo) }
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="14" font-weight="bold">%s</text>`+"\n", x0, oy+22, esc(p.title))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#888"/>`+"\n", x0, y1, x1-x0, y0-y1)
		for _, t := range []struct {
			n float64
			l string
		}{{math.Log10(2), "50%"}, {1, "90%"}, {2, "99%"}, {3, "99.9%"}, {4, "99.99%"}} {
			x := px(t.n)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x, y0, x, y1)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">%s</text>`+"\n", x, y0+16, t.l)
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle">percentile</text>`+"\n", (x0+x1)/2, y0+34)
		for l := lo; l <= hi; l++ {
			y := py(l)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", x0, y, x1, y)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end">%s</text>`+"\n", x0-6, y+4, tick(l))
		}
		for ci, c := range p.curves {
			if c.h == nil || c.h.Count() == 0 {
				continue
			}
			col := palette[c.color%len(palette)]
			var pts []string
			for k := 0; k <= 80; k++ {
				n := svgMaxNines * float64(k) / 80
				q := 1 - math.Pow(10, -n)
				v := math.Max(us(c.h.Quantile(q)), math.Pow(10, lo))
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(n), py(math.Log10(v))))
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", col, strings.Join(pts, " "))
			ly := y1 + 14 + 18*float64(ci)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", x1+10, ly-4, x1+30, ly-4, col)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f">%s</text>`+"\n", x1+36, ly, esc(c.name))
		}
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func us(d time.Duration) float64 { return math.Max(float64(d)/1e3, 1e-3) }

func esc(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

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
