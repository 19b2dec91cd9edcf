package bench

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// Sample is a set of measured durations.
type Sample []time.Duration

// Quantile is the q-quantile (0..1) by the nearest-rank method.
func (s Sample) Quantile(q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	sorted := slices.Clone(s)
	slices.Sort(sorted)
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// P50, P90 and P99 are the usual quantiles.
func (s Sample) P50() time.Duration { return s.Quantile(0.50) }
func (s Sample) P90() time.Duration { return s.Quantile(0.90) }
func (s Sample) P99() time.Duration { return s.Quantile(0.99) }

// Ratio is a/b, or NaN when b is zero.
func Ratio(a, b time.Duration) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// ms formats d in milliseconds with a precision that suits its size.
func ms(d time.Duration) string {
	v := float64(d) / float64(time.Millisecond)
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f ms", v)
	case v >= 10:
		return fmt.Sprintf("%.1f ms", v)
	}
	return fmt.Sprintf("%.2f ms", v)
}

func ratio(r float64) string {
	if math.IsNaN(r) {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", r)
}

func mib(bytes int64) string { return fmt.Sprintf("%.1f MiB", float64(bytes)/(1<<20)) }
