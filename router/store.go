package router

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"

	"github.com/galactic-cni/galactic/pkg/state"
	"github.com/galactic-cni/galactic/router/config"
	"github.com/galactic-cni/galactic/router/speaker"
)

// Saved is what the router keeps in the state dir across restarts: the RD
// number of each VPC (so RDs are stable), the VPCs' VNIs, and the last
// desired paths, which a restarted router announces before the API server
// answers. BootID and Identity say which boot and which speaker identity
// the paths are from: only a restart within both replays them.
type Saved struct {
	RDs      map[string]uint16 `json:"rds"`
	VNIs     map[string]uint32 `json:"vnis"`
	Paths    []SavedPath       `json:"paths"`
	BootID   string            `json:"bootID,omitempty"`
	Identity string            `json:"identity,omitempty"`
}

// Identity is the fingerprint of what identifies the speaker to its
// peers and receivers: router ID, underlay, ASN and route-target AS.
func Identity(c *config.Config) string {
	return fmt.Sprintf("routerID=%s underlay=%s asn=%d routeTargetASN=%d", c.RouterID, c.Underlay, c.ASN, c.RouteTargetASN)
}

// Resume decides how a start uses the saved state: a restart (the R and
// F bits, the saved paths replayed) only when it is of this boot and this
// identity. Otherwise the paths are discarded; RD numbers and VNIs stay,
// so RDs remain stable. why says what did not match.
func Resume(saved Saved, ok bool, bootID, identity string) (out Saved, restarting bool, why string) {
	switch {
	case !ok:
		return saved, false, "no saved state"
	case bootID == "":
		why = "the boot ID is unknown"
	case saved.BootID != bootID:
		why = fmt.Sprintf("the node booted since (boot ID %q, saved %q)", bootID, saved.BootID)
	case saved.Identity != identity:
		why = fmt.Sprintf("the speaker's identity changed (%s, saved %s)", identity, saved.Identity)
	default:
		return saved, true, ""
	}
	saved.Paths = nil
	return saved, false, why
}

// SavedPath is one announced route, with its VPC.
type SavedPath struct {
	VPC        string     `json:"vpc"`
	RD         speaker.RD `json:"rd"`
	Prefix     string     `json:"prefix"`
	VNI        uint32     `json:"vni"`
	RTASN      uint16     `json:"rtASN"`
	NextHop    string     `json:"nextHop"`
	RouterMAC  string     `json:"routerMAC"`
	Generation uint32     `json:"generation"`
	Drained    bool       `json:"drained,omitempty"`
}

// Store reads and writes Saved under <stateDir>/router/state.json.
type Store struct{ Path string }

// NewStore is the store of a state dir.
func NewStore(stateDir string) Store {
	return Store{Path: filepath.Join(stateDir, "router", "state.json")}
}

// Load returns the saved state; ok is false when there is none (a first
// start, or after a drain).
func (s Store) Load() (Saved, bool, error) {
	var v Saved
	data, err := os.ReadFile(s.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return Saved{RDs: map[string]uint16{}, VNIs: map[string]uint32{}}, false, nil
	}
	if err != nil {
		return v, false, err
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return v, false, fmt.Errorf("%s: %w", s.Path, err)
	}
	if v.RDs == nil {
		v.RDs = map[string]uint16{}
	}
	if v.VNIs == nil {
		v.VNIs = map[string]uint32{}
	}
	return v, true, nil
}

// Save writes v atomically.
func (s Store) Save(v Saved) error {
	sort.Slice(v.Paths, func(i, j int) bool {
		a, b := v.Paths[i], v.Paths[j]
		if a.RD != b.RD {
			return a.RD.String() < b.RD.String()
		}
		return a.Prefix < b.Prefix
	})
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.Path), 0o700); err != nil {
		return err
	}
	return state.WriteFileAtomic(s.Path, data, 0o600)
}

// Forget removes the saved state: after a drain nothing is re-announced.
func (s Store) Forget() error {
	if err := os.Remove(s.Path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// AllocateRD gives vpc the lowest RD number no other VPC has, keeping the
// one it has.
func AllocateRD(rds map[string]uint16, vpc string) (uint16, error) {
	if n, ok := rds[vpc]; ok {
		return n, nil
	}
	used := make(map[uint16]bool, len(rds))
	for _, n := range rds {
		used[n] = true
	}
	for n := uint16(1); n != 0; n++ {
		if !used[n] {
			rds[vpc] = n
			return n, nil
		}
	}
	return 0, errors.New("no free route distinguisher number")
}

func savedPath(r speaker.Route) SavedPath {
	return SavedPath{RD: r.RD, Prefix: r.Prefix.String(), VNI: r.VNI, RTASN: r.RTASN, NextHop: r.NextHop.String(),
		RouterMAC: r.RouterMAC.String(), Generation: r.Generation, Drained: r.Drained}
}

func (p SavedPath) route() (speaker.Route, error) {
	pfx, err := netip.ParsePrefix(p.Prefix)
	if err != nil {
		return speaker.Route{}, err
	}
	nh, err := netip.ParseAddr(p.NextHop)
	if err != nil {
		return speaker.Route{}, err
	}
	mac, err := net.ParseMAC(p.RouterMAC)
	if err != nil {
		return speaker.Route{}, err
	}
	return speaker.Route{RD: p.RD, Prefix: pfx, VNI: p.VNI, RTASN: p.RTASN, NextHop: nh, RouterMAC: mac,
		Generation: p.Generation, Drained: p.Drained}, nil
}

func equalSaved(a, b Saved) bool {
	if a.BootID != b.BootID || a.Identity != b.Identity {
		return false
	}
	if len(a.Paths) != len(b.Paths) || len(a.VNIs) != len(b.VNIs) || len(a.RDs) != len(b.RDs) {
		return false
	}
	for k, v := range a.VNIs {
		if b.VNIs[k] != v {
			return false
		}
	}
	for k, v := range a.RDs {
		if b.RDs[k] != v {
			return false
		}
	}
	seen := map[SavedPath]bool{}
	for _, p := range b.Paths {
		seen[p] = true
	}
	for _, p := range a.Paths {
		if !seen[p] {
			return false
		}
	}
	return true
}
