package scale

import "time"

// EnvLarge sizes the large fabric test (1, or "<nodes>,<vpcs>,<prefixes per
// node and VPC>"); EnvResult names the JSON file it writes its figures to.
const (
	EnvLarge  = "GALACTIC_SCALE_LARGE"
	EnvResult = "GALACTIC_SCALE_RESULT"
	// EnvChurnResult names the JSON file the churn test writes to.
	EnvChurnResult = "GALACTIC_SCALE_CHURN_RESULT"
)

// ChurnResult is CNI ADD latency on a node idle and while its router
// imports ChurnPerSecond route changes a second, in one run, with the
// router's lock-held and pass time over the churned ADDs.
type ChurnResult struct {
	// ADDs were timed each way, alternating in blocks of Block.
	ChurnPerSecond, ADDs, Block          int
	IdleP50, IdleP99, ChurnP50, ChurnP99 time.Duration
	LockHeld, PassTime                   time.Duration
}

// LargeResult is what the large fabric test measured: one row per way a
// real node was fed.
type LargeResult struct {
	Nodes, VPCs, Routes int
	// ADDParallel is how many of a node's ADDs ran at once.
	ADDParallel int
	Rows        []LargeRow
}

// LargeRow is one real node of the large fabric.
type LargeRow struct {
	// Via is the reflector: "galactic (rtc)" or "FRR (no rtc)"; VPCs the
	// node's.
	Via  string
	VPCs int
	// Received is its adj-RIB-in, Installed its remote routes.
	Received, Installed int
	// Took is from its router's start (its VPCs' ADDs done before) to
	// every route installed, ADDs how long those took; CPU the router's
	// CPU time by then; RSS its resident set in MiB.
	Took, ADDs, CPU time.Duration
	RSS             float64
	// LiveHeap is what the router's last garbage collection kept, in
	// MiB, after the churn; PeakRSS its resident set's high-water mark.
	LiveHeap, PeakRSS float64
	// ReflectorRSS is the galactic reflector's, in MiB (0 for FRR);
	// Load how long the simulated nodes took to get every route to it
	// from their start, LoadCPU the reflector's CPU time by then, and
	// CPUPerUpdate its CPU time over the churn per update it was sent.
	ReflectorRSS                float64
	Load, LoadCPU, CPUPerUpdate time.Duration
	// AnnounceP50 and AnnounceP99 time a churned route from the
	// simulated node's announce to the node's kernel, while the fabric
	// churns ChurnPerSecond updates a second; Announces is how many.
	AnnounceP50, AnnounceP99  time.Duration
	Announces, ChurnPerSecond int
	// PropagationP50 and PropagationP99 time the same announces from
	// the simulated node that sent them to a simulated node importing
	// that VPC, through the reflector (Propagated of them).
	PropagationP50, PropagationP99 time.Duration
	Propagated                     int
	// ChurnPasses is how many passes the node's router ran while the
	// announces were timed, ChurnPassMean their mean time.
	ChurnPasses   int
	ChurnPassMean time.Duration
	// Reestablished counts the galactic reflector's client sessions that
	// came up again after they were first up (a hold timer missed).
	Reestablished int
}
