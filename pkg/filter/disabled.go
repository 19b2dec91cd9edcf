//go:build galactic_nofilter

package filter

// enabled: this build leaves the filter alone, so that test/bench can
// measure the same chain without it. Only the benchmark builds it.
const enabled = false
