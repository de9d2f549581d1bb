package history

import (
	"fmt"
	"slices"
	"strings"
)

// Verdict is a checker's conclusion.
type Verdict string

// The verdicts.
const (
	Pass         Verdict = "pass"         // checked, nothing wrong
	Violated     Verdict = "fail"         // checked, violations found
	Measured     Verdict = "measured"     // figures only, not asserted
	Inconclusive Verdict = "inconclusive" // the check could not finish (porcupine's timeout)
	Skipped      Verdict = "skipped"      // does not apply here
)

// MaxViolations is how many violations a Result lists (Count has them
// all).
const MaxViolations = 20

// Result is one checker's verdict on a history.
type Result struct {
	Name       string             `json:"name"`
	Verdict    Verdict            `json:"verdict"`
	Summary    string             `json:"summary"`
	Count      int                `json:"violation_count"`
	Violations []string           `json:"violations,omitempty"` // the first MaxViolations, each in one line
	Notes      []string           `json:"notes,omitempty"`      // examples behind measured figures
	Figures    map[string]float64 `json:"figures,omitempty"`
	Artifacts  []string           `json:"artifacts,omitempty"` // files written (a porcupine visualization)
}

// OK reports whether the result lets a run pass: passed, measured or
// skipped.
func (r Result) OK() bool { return r.Verdict == Pass || r.Verdict == Measured || r.Verdict == Skipped }

// violate records one violation.
func (r *Result) violate(format string, args ...any) {
	r.Count++
	if len(r.Violations) < MaxViolations {
		r.Violations = append(r.Violations, fmt.Sprintf(format, args...))
	}
}

// figure sets one figure.
func (r *Result) figure(name string, v float64) {
	if r.Figures == nil {
		r.Figures = map[string]float64{}
	}
	r.Figures[name] = v
}

// settle sets the verdict from the count: Violated if any, else ok.
func (r *Result) settle(ok Verdict) {
	if r.Count > 0 {
		r.Verdict = Violated
	} else {
		r.Verdict = ok
	}
}

// String renders the result in a few lines of text.
func (r Result) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-17s %-12s %s\n", r.Name, strings.ToUpper(string(r.Verdict)), r.Summary)
	names := make([]string, 0, len(r.Figures))
	for n := range r.Figures {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(&b, "    %-32s %s\n", n, formatFigure(r.Figures[n]))
	}
	for _, v := range r.Violations {
		fmt.Fprintf(&b, "    ! %s\n", v)
	}
	if r.Count > len(r.Violations) {
		fmt.Fprintf(&b, "    ! ... and %d more\n", r.Count-len(r.Violations))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "    - %s\n", n)
	}
	for _, a := range r.Artifacts {
		fmt.Fprintf(&b, "    see %s\n", a)
	}
	return b.String()
}

func formatFigure(v float64) string {
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.3f", v)
}
