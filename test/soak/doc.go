// Package soak is `make soak`: the demo's topology (a real control plane,
// an FRR route reflector on a fabric, three nodes with galactic-gc and
// galactic-router) driven by a seeded random schedule of workload
// operations and faults, with invariant checkers sampling the API, the
// nodes' kernels and the data plane every 100 ms.
//
// The schedule (schedule.go) is a pure function of the seed and the
// duration: replaying a seed, or a prefix of its schedule, runs the same
// steps in the same order. Event kinds live in a registry (Register), so a
// new operation or fault is one Kind with a planner and an executor. The
// checkers (check.go) are pure functions of snapshots and step times, so
// they are tested on a simulated world (sim.go) with planted bugs.
package soak
