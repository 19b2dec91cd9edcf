//go:build !galactic_nofilter

package filter

// enabled is false only in the benchmark's reference build (the
// galactic_nofilter tag, which no Makefile or image target sets): shipped
// binaries have no way to run without the filter.
const enabled = true
