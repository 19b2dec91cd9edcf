package handoff

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/galactic-cni/galactic/pkg/state"
)

// observation is when this node first saw one version of a held lease.
// Time read in memory carries Go's monotonic reading; time read back from
// a file is this node's wall clock.
type observation struct {
	ResourceVersion string    `json:"resourceVersion"`
	Holder          string    `json:"holder"`
	FirstSeen       time.Time `json:"firstSeen"`
}

// observe returns when this node first saw cur unchanged. An observation
// kept in ObservationDir by an earlier process wins over a later one in
// memory; one that lies in the future (the clock went back) restarts, which
// only delays a takeover.
func (l *Lock) observe(cur Observed, now time.Time) (time.Time, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	same := func(o observation) bool {
		return o.ResourceVersion == cur.ResourceVersion && o.Holder == cur.Record.HolderIdentity && !o.FirstSeen.After(now)
	}
	if l.obsDir != "" {
		if o, ok := l.readObservation(); ok && same(o) {
			if !same(l.obs) || o.FirstSeen.Before(l.obs.FirstSeen) {
				l.obs = o
			}
			return l.obs.FirstSeen, nil
		}
	}
	if !same(l.obs) {
		l.obs = observation{ResourceVersion: cur.ResourceVersion, Holder: cur.Record.HolderIdentity, FirstSeen: now}
	}
	if l.obsDir != "" {
		if err := l.writeObservation(l.obs); err != nil {
			return time.Time{}, fmt.Errorf("keeping the observation of lease %s: %w", l.key, err)
		}
	}
	return l.obs.FirstSeen, nil
}

// readObservation treats a missing or unreadable file as no observation:
// starting over only delays a takeover.
func (l *Lock) readObservation() (observation, bool) {
	data, err := os.ReadFile(l.observationFile())
	if err != nil {
		return observation{}, false
	}
	var o observation
	if json.Unmarshal(data, &o) != nil {
		return observation{}, false
	}
	return o, true
}

func (l *Lock) writeObservation(o observation) error {
	if err := os.MkdirAll(l.obsDir, 0o700); err != nil {
		return err
	}
	// Drop the monotonic reading: the file holds wall-clock time.
	o.FirstSeen = o.FirstSeen.Round(0)
	data, err := json.Marshal(o)
	if err != nil {
		return err
	}
	return state.WriteFileAtomic(l.observationFile(), data, 0o600)
}

// forget drops the observation once the lease is ours: the next acquirer
// must observe our renewals itself. A file left behind names a
// resourceVersion that is gone, so it can never match again.
func (l *Lock) forget() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.obs = observation{}
	if l.obsDir != "" {
		_ = os.Remove(l.observationFile())
	}
}

// observationFile is where ObservationDir keeps this lease's observation.
func (l *Lock) observationFile() string {
	return filepath.Join(l.obsDir, url.PathEscape(l.key)+".json")
}
