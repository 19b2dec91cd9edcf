package soak

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/galactic-cni/galactic/test/harness"
)

const ifName = "eth0"

func harnessProc(pid int) (harness.ProcStats, bool) { return harness.ReadProcStats(pid) }

// execute runs the steps in order, each no earlier than planned, and
// returns when each ran.
func (r *runner) execute(steps []Step) map[int]Window {
	windows := map[int]Window{}
	for i, s := range steps {
		if r.ctx.Err() != nil {
			r.report.Aborted = r.ctx.Err().Error()
			break
		}
		if wait := time.Until(r.start.Add(s.At)); wait > 0 {
			r.sleep(wait)
		}
		r.say("%s", s)
		begin := time.Now()
		r.mu.Lock()
		r.checker.Begin(s, begin)
		r.trace.step("begin", s, begin)
		r.mu.Unlock()
		err := RunStep(r, s)
		done := time.Now()
		r.mu.Lock()
		r.checker.Done(s, done)
		r.trace.step("done", s, done)
		if err != nil {
			r.report.StepErrors[s.Seq] = err.Error()
			r.checker.Fail(done, "step failed", "%s: %v", s, err)
		}
		r.mu.Unlock()
		if err != nil {
			r.say("  step failed: %v", err)
		} else if d := done.Sub(begin); d > time.Second {
			r.say("  done in %.1fs", d.Seconds())
		}
		r.report.Executed = i + 1
		if s.End {
			w := windows[s.Start]
			w.To = done
			windows[s.Start] = w
		} else {
			windows[s.Seq] = Window{From: begin, To: done}
		}
	}
	return windows
}

func (r *runner) attachment(key string) Attachment { return r.topo.attachment(key) }

// add runs the chain's ADD of key on node for a new container.
func (r *runner) add(key, node string) (*instance, error) {
	return r.addAttachment(r.attachment(key), node)
}

func (r *runner) addAttachment(a Attachment, node string) (*instance, error) {
	key := a.Key()
	c, err := r.container()
	if err != nil {
		return nil, err
	}
	if _, err := r.nodes[node].CNITool("add", network(a), c, ifName); err != nil {
		c.Delete()
		return nil, fmt.Errorf("ADD of %s on %s: %w", key, node, err)
	}
	return &instance{a: a, node: node, netns: c}, nil
}

// del runs the DEL of an instance (after stopping its guest) and removes
// its container.
func (r *runner) del(in *instance) error {
	in.vm.stop()
	_, err := r.nodes[in.node].CNITool("del", network(in.a), in.netns, ifName)
	if err != nil {
		return fmt.Errorf("DEL of %s on %s: %w", in.a.Key(), in.node, err)
	}
	in.netns.Delete()
	return nil
}

// ready reports a whenAvailable instance available, as its runtime does
// once it serves, and records it as running.
func (r *runner) ready(in *instance) error {
	if in.a.Announce == "whenAvailable" {
		if err := r.availability(in, true); err != nil {
			return err
		}
	}
	r.mu.Lock()
	r.inst[in.a.Key()] = in
	r.setReachable(in.a.Key(), true)
	r.mu.Unlock()
	return nil
}

func (r *runner) availability(in *instance, available bool) error {
	verb := "unavailable"
	if available {
		verb = "available"
	}
	n := r.nodes[in.node]
	which := []string{"--vpc", in.a.VPC}
	if in.a.Namespace != "" {
		which = []string{"--namespace", in.a.Namespace}
	}
	args := append([]string{"netns", "exec", n.Netns.Name, filepath.Join(r.env.BinDir, "galactic-cni"), verb},
		append(which, "--attachment", in.a.Name, "--container", harness.ContainerID(in.netns.Path))...)
	cmd := exec.CommandContext(r.ctx, "ip", args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CNI_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, n.Environ()...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("galactic-cni %s for %s on %s: %v %s", verb, in.a.Key(), in.node, err, out)
	}
	in.available = available
	return nil
}

func (r *runner) current(key string) (*instance, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	in := r.inst[key]
	if in == nil {
		return nil, fmt.Errorf("%s is not running", key)
	}
	return in, nil
}

func (r *runner) forget(key string) {
	r.mu.Lock()
	delete(r.inst, key)
	r.setReachable(key, false)
	r.mu.Unlock()
}

func (r *runner) Create(key, node string) error {
	add := r.add
	if r.attachment(key).VM {
		add = r.bootVM
	}
	in, err := add(key, node)
	if err != nil {
		return err
	}
	return r.ready(in)
}

func (r *runner) Delete(key string) error {
	in, err := r.current(key)
	if err != nil {
		return err
	}
	r.forget(key)
	// Stopping reports unavailable first, best effort, so traffic stops
	// before the instance goes.
	if in.a.Announce == "whenAvailable" && in.available {
		_ = r.availability(in, false)
	}
	return r.del(in)
}

// Upgrade replaces the instance in place: DEL, then ADD on the same node.
func (r *runner) Upgrade(key string) error {
	old, err := r.current(key)
	if err != nil {
		return err
	}
	if err := r.del(old); err != nil {
		return err
	}
	in, err := r.add(key, old.node)
	if err != nil {
		r.forget(key)
		return err
	}
	return r.ready(in)
}

// Move starts the successor's ADD on to, which waits for the lease, then
// stops the old instance (its DEL releases the lease).
func (r *runner) Move(key, to string) error {
	old, err := r.current(key)
	if err != nil {
		return err
	}
	type result struct {
		in  *instance
		err error
	}
	added := make(chan result, 1)
	go func() {
		in, err := r.add(key, to)
		added <- result{in, err}
	}()
	// The ADD waits for the lease, unless it expired (the old holder's
	// renewals stopped, with its GC down): then the successor takes it at
	// once and the old instance is stopped afterwards.
	var res result
	select {
	case res = <-added:
		if res.err != nil {
			return res.err
		}
		if err := r.del(old); err != nil {
			return err
		}
	case <-time.After(time.Second):
		if err := r.del(old); err != nil {
			<-added
			return err
		}
		res = <-added
	}
	if res.err != nil {
		r.forget(key)
		return res.err
	}
	return r.ready(res.in)
}

func (r *runner) Flip(key string, available bool) error {
	in, err := r.current(key)
	if err != nil {
		return err
	}
	if err := r.availability(in, available); err != nil {
		return err
	}
	r.mu.Lock()
	r.setReachable(key, available)
	r.mu.Unlock()
	return nil
}

// KillPlugin kills the chain (cnitool and the plugin it runs) after a
// while, then does what a runtime does: a failed ADD is cleaned up with a
// DEL and retried; a failed DEL is retried.
func (r *runner) KillPlugin(key, node, verb string, after time.Duration) error {
	a := r.attachment(key)
	var in *instance
	var c *harness.Netns
	if verb == "add" {
		var err error
		if c, err = r.container(); err != nil {
			return err
		}
	} else {
		var err error
		if in, err = r.current(key); err != nil {
			return err
		}
		r.forget(key)
		c = in.netns
	}
	cmd := r.nodes[node].CNIToolCommand(verb, network(a), c, ifName)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case <-exited:
	case <-time.After(after):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
	}
	if verb == "del" {
		return r.del(in)
	}
	tmp := &instance{a: a, node: node, netns: c}
	if _, err := r.nodes[node].CNITool("del", network(a), c, ifName); err != nil {
		return fmt.Errorf("DEL after the killed ADD of %s on %s: %w", key, node, err)
	}
	if _, err := r.nodes[node].CNITool("add", network(a), c, ifName); err != nil {
		return fmt.Errorf("ADD retried after the killed one of %s on %s: %w", key, node, err)
	}
	return r.ready(tmp)
}

func (r *runner) StopRouter(node string, sig syscall.Signal) error {
	if sig == syscall.SIGKILL {
		r.nodes[node].router.Kill()
	} else {
		r.nodes[node].router.Terminate()
	}
	return nil
}

func (r *runner) StartRouter(node string) error { return r.nodes[node].router.Start() }

func (r *runner) StopGC(node string, sig syscall.Signal) error {
	if sig == syscall.SIGKILL {
		r.nodes[node].gc.Kill()
	} else {
		r.nodes[node].gc.Terminate()
	}
	return nil
}

func (r *runner) StartGC(node string) error { return r.nodes[node].gc.Start() }

// takeover starts each moved attachment on its new node, in parallel:
// each ADD waits until the lost holder's lease expires.
func (r *runner) takeover(moves map[string]string) error {
	errs := make(chan error, len(moves))
	for key, to := range moves {
		go func() {
			in, err := r.add(key, to)
			if err == nil {
				err = r.ready(in)
			} else {
				r.forget(key)
			}
			errs <- err
		}()
	}
	var all []error
	for range moves {
		all = append(all, <-errs)
	}
	return errors.Join(all...)
}

func (r *runner) Crash(node string, moves map[string]string) error {
	n := r.nodes[node]
	r.mu.Lock()
	n.down = true
	var lost []*instance
	for key, in := range r.inst {
		if in.node == node {
			lost = append(lost, in)
			delete(r.inst, key)
		}
	}
	r.mu.Unlock()
	if out, err := n.Run("ip", "link", "set", "ul0", "down"); err != nil {
		return fmt.Errorf("taking %s off the fabric: %v %s", node, err, out)
	}
	if err := n.SetAPIReachable(false); err != nil {
		return err
	}
	n.router.Kill()
	n.gc.Kill()
	for _, in := range lost {
		in.netns.Delete()
		if _, moved := moves[in.a.Key()]; !moved {
			r.forget(in.a.Key())
		}
	}
	return r.takeover(moves)
}

func (r *runner) Return(node string) error {
	n := r.nodes[node]
	if out, err := n.Run("ip", "link", "set", "ul0", "up"); err != nil {
		return fmt.Errorf("%s back on the fabric: %v %s", node, err, out)
	}
	if err := n.SetAPIReachable(true); err != nil {
		return err
	}
	if err := n.router.Start(); err != nil {
		return err
	}
	if err := n.gc.Start(); err != nil {
		return err
	}
	r.mu.Lock()
	n.down = false
	r.mu.Unlock()
	return nil
}

func (r *runner) CutOff(node string, moves map[string]string) error {
	n := r.nodes[node]
	if err := n.SetAPIReachable(false); err != nil {
		return err
	}
	r.mu.Lock()
	for key, in := range r.inst {
		if in.node == node {
			r.stale[node] = append(r.stale[node], in)
			delete(r.inst, key)
			if _, moved := moves[key]; !moved {
				r.setReachable(key, false)
			}
		}
	}
	r.mu.Unlock()
	return r.takeover(moves)
}

// Reconnect restores the node's API and deletes the instances replaced
// while it was cut off, as their runtime does once it learns of it.
func (r *runner) Reconnect(node string) error {
	n := r.nodes[node]
	if err := n.SetAPIReachable(true); err != nil {
		return err
	}
	r.mu.Lock()
	old := r.stale[node]
	delete(r.stale, node)
	r.mu.Unlock()
	var errs []error
	for _, in := range old {
		errs = append(errs, r.del(in))
	}
	return errors.Join(errs...)
}

func (r *runner) SetAPI(up bool) error {
	for _, n := range r.upNodes() {
		if err := n.SetAPIReachable(up); err != nil {
			return err
		}
	}
	return nil
}

func (r *runner) StopReflector() error { r.fabric.StopFRR(); return nil }

func (r *runner) StartReflector() error { return r.fabric.StartFRR() }

// SetLoss drops percent of the packets crossing the fabric's bridge with
// an nftables numgen rule (netem is not in this kernel); 0 removes it.
func (r *runner) SetLoss(percent int) error {
	_, _ = r.fabric.Run("nft", "delete", "table", "bridge", "soak")
	if percent == 0 {
		return nil
	}
	script := fmt.Sprintf("table bridge soak {\n chain forward {\n  type filter hook forward priority 0; policy accept;\n  numgen random mod 100 < %d drop\n }\n}\n", percent)
	f := filepath.Join(r.dir, "loss.nft")
	if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
		return err
	}
	if out, err := r.fabric.Run("nft", "-f", f); err != nil {
		return fmt.Errorf("nft: %v %s", err, out)
	}
	return nil
}
