package advert

import (
	"context"
	"fmt"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// Promote makes the entry of (containerID, ifName) in k's advertisement
// the live entry of a holder with token generation: it clears the
// standby mark and sets holderGeneration, so galactic-router announces it
// with that generation. No advertisement or no such entry is Absent with
// no write (the chain publishes nothing for an attachment without
// addresses); an entry already so is Unchanged.
func (a *Advertiser) Promote(ctx context.Context, k Key, containerID, ifName string, generation int64) (Result, error) {
	res := Result{Name: k.Name()}
	if err := k.validate(); err != nil {
		return res, err
	}
	if generation < 1 {
		return res, fmt.Errorf("promoting %s/%s in %s: token %d is not a holder's", containerID, ifName, res.Name, generation)
	}
	err := a.retry(ctx, &res, func() error {
		cur, err := a.getOwned(ctx, k, &res)
		if cur == nil {
			return err
		}
		entries := make([]v1alpha1.ContainerEntry, 0, len(cur.Spec.Containers))
		found := false
		for _, c := range cur.Spec.Containers {
			if sameEntry(c, containerID, ifName) {
				c = *c.DeepCopy()
				c.Standby, c.HolderGeneration, found = false, generation, true
			}
			entries = append(entries, c)
		}
		if !found {
			res.Outcome = Absent
			return nil
		}
		next := withEntries(cur, k, entries)
		if unchanged(cur, next) {
			res.Outcome = Unchanged
			return nil
		}
		if err := a.update(ctx, next); err != nil {
			return err
		}
		res.Outcome = Updated
		return nil
	})
	return res, wrap(err, "promoting %s/%s in %s", containerID, ifName, res.Name)
}
