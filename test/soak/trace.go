package soak

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// tracer writes what changed between snapshots (leases, entries, records,
// receivers' routes), one line per change, so a violation can be read
// against the world's history next to the daemons' logs.
type tracer struct {
	w     io.Writer
	start time.Time
	prev  map[string]string
}

func (t *tracer) note(s Snapshot) {
	if t == nil || t.w == nil {
		return
	}
	cur := map[string]string{}
	for k, l := range s.Leases {
		cur["lease "+k] = fmt.Sprintf("holder=%q token=%d available=%v", l.Holder, l.Token, l.Available)
	}
	for what, es := range map[string][]EntryView{"entry": s.Entries, "record": s.Records} {
		for _, e := range es {
			cur[fmt.Sprintf("%s %s %s/%s", what, e.Key, e.Node, e.ContainerID)] = fmt.Sprintf("gen=%d live=%v", e.Generation, e.Live)
		}
	}
	for rk, via := range s.Routes {
		cur["route "+rk.Observer+" "+rk.Key] = "via=" + via
	}
	var lines []string
	for k, v := range cur {
		if old, ok := t.prev[k]; !ok || old != v {
			lines = append(lines, k+" "+v)
		}
	}
	for k := range t.prev {
		if _, ok := cur[k]; !ok {
			lines = append(lines, k+" gone")
		}
	}
	slices.Sort(lines)
	at := s.At.Sub(t.start).Seconds()
	for _, l := range lines {
		fmt.Fprintf(t.w, "[%7.1fs] %s\n", at, l)
	}
	t.prev = cur
}

// traceStep writes a step's start or end into the trace.
func (t *tracer) step(what string, s Step, at time.Time) {
	if t == nil || t.w == nil {
		return
	}
	fmt.Fprintf(t.w, "[%7.1fs] %s %s\n", at.Sub(t.start).Seconds(), what, strings.TrimSpace(s.String()))
}
