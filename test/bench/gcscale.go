package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/galactic-cni/galactic/gc"
	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
	"github.com/galactic-cni/galactic/pkg/names"
	"github.com/galactic-cni/galactic/pkg/state"
	"github.com/galactic-cni/galactic/pkg/tap"
	"github.com/galactic-cni/galactic/test/harness"
)

// GCRow is one size of the GC scaling table.
type GCRow struct {
	Taps int
	// Pass is the pass durations the real `galactic-gc --once` logged over
	// steady passes (every tap seen before, every entry live); Wall the
	// runs' wall times and RSS their largest peak RSS (under /usr/bin/time).
	Pass, Wall Sample
	RSS        int64
	// Requests is what one steady pass asked of the API server.
	Requests []Request
	// The parts of a pass, timed on their own in the node: listing and
	// inspecting the taps, reading the records, listing the advertisements.
	TapScan, RecordRead, AdvertList time.Duration
	// InProcess is gc.Collector.Pass run in the bench, in the node, the
	// code the binary runs; the parts below are timed the same way.
	InProcess Sample
	// The tap scan's two parts on their own: listing the links, and the
	// one scan of /proc for tun holders it makes per pass.
	LinkList, HolderScan time.Duration
	// Detached is how many taps a steady pass found without a VMM, each
	// kept (and logged) because its record is live.
	Detached int
	// Setup is how long creating the taps, records and advertisements took.
	Setup time.Duration
}

// Lists is the number of list requests of the pass.
func (r GCRow) Lists() int {
	n := 0
	for _, q := range r.Requests {
		if q.Verb() == "list" {
			n++
		}
	}
	return n
}

const gcVPC = "gcscale"

func gcAttachment(i int) string { return fmt.Sprintf("gc-%05d", i) }

// gcScaling grows one node to each size in turn (taps, records and
// advertisements with one live entry each, as a node of that many idle
// attachments has) and times GC passes over it.
func (b *bench) gcScaling() error {
	n, err := b.newNode("gc")
	if err != nil {
		return err
	}
	if err := n.viaProxy(b, true); err != nil {
		return err
	}
	c, err := b.container()
	if err != nil {
		return err
	}
	defer func() {
		_ = b.env.API.BGPAdvertisements(harness.Namespace).DeleteCollection(context.Background(), metav1.DeleteOptions{},
			metav1.ListOptions{LabelSelector: names.NodeSelector(n.Name)})
	}()
	// The collector times the pass and its parts in the bench (and
	// profiles); it logs as the binary does, to nowhere.
	col, err := gc.NewCollector(n.Settings, slog.New(slog.NewJSONHandler(io.Discard, nil)))
	if err != nil {
		return err
	}
	have := 0
	for _, size := range b.opts.GCSizes {
		row := GCRow{Taps: size}
		t := time.Now()
		if err := b.grow(n, c, have, size); err != nil {
			return err
		}
		have = size
		row.Setup = time.Since(t)

		// Two passes make every tap a known sighting; then the timed ones.
		for i := range 2 + b.opts.GCPasses {
			mark := b.proxy.Mark()
			e, err := b.runRSS(n, nil, nil, filepath.Join(b.env.BinDir, "galactic-gc"), "--once", "--config", n.ConfigPath)
			if err != nil {
				return fmt.Errorf("GC pass over %d taps: %w", size, err)
			}
			rep, err := parseGCLog(e.Stderr)
			if err != nil {
				return err
			}
			if rep.TapsReclaimed+rep.EntriesPruned+rep.RecordsRemoved+rep.AdvertisementsDeleted > 0 {
				return fmt.Errorf("GC pass over %d live attachments collected something: %s", size, rep.Summary())
			}
			if i >= 2 {
				row.Pass = append(row.Pass, rep.Duration)
				row.Wall = append(row.Wall, e.Wall)
				row.RSS = max(row.RSS, e.MaxRSSKB*1024)
				row.Detached = rep.TapsDetached
				row.Requests = b.proxy.Since(mark, AgentGC)
			}
		}

		for range b.opts.GCPasses {
			err := n.Do(func() error {
				t := time.Now()
				_, err := col.Pass(b.ctx)
				row.InProcess = append(row.InProcess, time.Since(t))
				return err
			})
			if err != nil {
				return err
			}
		}
		err := n.Do(func() error {
			t := time.Now()
			if _, err := (gc.NodeKernel{}).Taps(); err != nil {
				return err
			}
			row.TapScan = time.Since(t)
			t = time.Now()
			if _, err := netlinksafe.LinkList(); err != nil {
				return err
			}
			row.LinkList = time.Since(t)
			t = time.Now()
			if _, err := tap.AllHolders("/proc"); err != nil {
				return err
			}
			row.HolderScan = time.Since(t)
			t = time.Now()
			if _, err := state.NewStore(n.Settings.StateDir).List(); err != nil {
				return err
			}
			row.RecordRead = time.Since(t)
			t = time.Now()
			if _, err := col.Adverts.List(b.ctx); err != nil {
				return err
			}
			row.AdvertList = time.Since(t)
			return nil
		})
		if err != nil {
			return err
		}
		if b.opts.GCProfile != "" && size == b.opts.GCSizes[len(b.opts.GCSizes)-1] {
			if err := b.profilePass(n, col); err != nil {
				return err
			}
		}
		b.res.GC = append(b.res.GC, row)
		b.say("GC %5d taps: pass p50 %s, --once wall %s, peak RSS %s; in-process pass %s, parts: taps %s (links %s, /proc %s), records %s, list %s; %d requests (%d lists); setup %s",
			size, ms(row.Pass.P50()), ms(row.Wall.P50()), mib(row.RSS), ms(row.InProcess.P50()), ms(row.TapScan), ms(row.LinkList), ms(row.HolderScan), ms(row.RecordRead), ms(row.AdvertList),
			len(row.Requests), row.Lists(), row.Setup.Round(time.Second))
	}
	return nil
}

// grow adds attachments from..to-1 to the node: a galactic tap (name and
// alias as galactic-cni makes them, up, no VMM), a node record and an
// advertisement with one live entry, all for the same container netns.
func (b *bench) grow(n *node, c *harness.Netns, from, to int) error {
	err := n.Do(func() error {
		for i := from; i < to; i++ {
			att := gcAttachment(i)
			t := &netlink.Tuntap{LinkAttrs: netlink.LinkAttrs{Name: names.HostInterface(names.ModeTap, gcVPC, att)}, Mode: netlink.TUNTAP_MODE_TAP, Flags: netlink.TUNTAP_NO_PI}
			if err := netlink.LinkAdd(t); err != nil {
				return fmt.Errorf("creating tap %d: %w", i, err)
			}
			l, err := netlink.LinkByName(t.Name)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetAlias(l, names.Alias(gcVPC, att)); err != nil {
				return err
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	store := state.NewStore(n.Settings.StateDir)
	api := b.env.API.BGPAdvertisements(harness.Namespace)
	work := make(chan int)
	errs := make(chan error, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				if err := b.addAttachment(store, api, n, c, i); err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for i := from; i < to; i++ {
		work <- i
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}

func (b *bench) addAttachment(store state.Store, api advertisementCreator, n *node, c *harness.Netns, i int) error {
	att := gcAttachment(i)
	cid := fmt.Sprintf("gcscale-%05d", i)
	prefix := v1alpha1.Prefix(fmt.Sprintf("10.%d.%d.%d/32", 100+i/65536, (i/256)%256, i%256))
	rec := state.Record{
		Network: "bench-gc", ContainerID: cid, IfName: ifName, Netns: c.Path, VPC: gcVPC, Attachment: att,
		Mode: names.ModeTap, Routing: "table", HostInterface: names.HostInterface(names.ModeTap, gcVPC, att),
		Addresses: []string{string(prefix)}, Created: time.Now(),
	}
	if err := store.Put(rec); err != nil {
		return err
	}
	adv := &v1alpha1.BGPAdvertisement{
		ObjectMeta: metav1.ObjectMeta{Name: names.Advertisement(gcVPC, att, n.Name), Labels: names.AdvertisementLabels(gcVPC, att, n.Name)},
		Spec: v1alpha1.BGPAdvertisementSpec{
			VPC: gcVPC, Attachment: att, Node: n.Name, Prefixes: []v1alpha1.Prefix{prefix},
			Containers: []v1alpha1.ContainerEntry{{ContainerID: cid, IfName: ifName, Netns: c.Path, Prefixes: []v1alpha1.Prefix{prefix}}},
		},
	}
	_, err := api.Create(b.ctx, adv, metav1.CreateOptions{})
	return err
}

type advertisementCreator interface {
	Create(ctx context.Context, obj *v1alpha1.BGPAdvertisement, opts metav1.CreateOptions) (*v1alpha1.BGPAdvertisement, error)
}

// profilePass writes a CPU profile of one in-process pass.
func (b *bench) profilePass(n *node, col *gc.Collector) error {
	f, err := os.Create(b.opts.GCProfile)
	if err != nil {
		return err
	}
	defer f.Close()
	return n.Do(func() error {
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		t := time.Now()
		_, err := col.Pass(b.ctx)
		pprof.StopCPUProfile()
		b.say("profiled an in-process pass (%s) into %s", ms(time.Since(t)), b.opts.GCProfile)
		return err
	})
}
