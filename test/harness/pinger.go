package harness

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/galactic-cni/galactic/test/packet"
)

// Pinger sends an ICMP echo request from a namespace every interval and
// records which were answered, so a test can tell lost replies and the
// longest blackout.
type Pinger struct {
	addr     netip.Addr
	interval time.Duration
	conn     *net.IPConn
	e        echoKind
	id       uint16
	stop     chan struct{}
	done     sync.WaitGroup
	stopOnce sync.Once
	final    PingerStats

	mu      sync.Mutex
	sent    map[uint16]time.Time
	replied map[uint16]time.Time
	order   []uint16
}

// PingerStats summarise a Pinger's run.
type PingerStats struct {
	Sent, Received int
	// Lost are the requests not answered; LongestGap is the longest time
	// between two answered requests' send times, starting at LongestGapFrom.
	Lost           int
	LongestGap     time.Duration
	LongestGapFrom time.Time
	// LongestOutage is the longest run of unanswered requests: from the
	// first of them to the next answered one, or to the end of the window.
	LongestOutage time.Duration
	// FirstReply and LastReply are the send times of the first and the
	// last answered request; zero without replies.
	FirstReply, LastReply time.Time
}

// StartPinger pings addr from n every interval until Stop.
func (n *Netns) StartPinger(addr netip.Addr, interval time.Duration) (*Pinger, error) {
	p := &Pinger{addr: addr, interval: interval, id: uint16(rand.N(65535) + 1), stop: make(chan struct{}),
		sent: map[uint16]time.Time{}, replied: map[uint16]time.Time{}}
	// A socket belongs to the namespace it was made in, so it can be used
	// from any goroutine afterwards.
	err := n.Do(func() (err error) {
		p.e, p.conn, err = echoSocket(addr)
		return err
	})
	if err != nil {
		return nil, err
	}
	p.done.Add(2)
	go p.send()
	go p.receive()
	return p, nil
}

func (p *Pinger) send() {
	defer p.done.Done()
	t := time.NewTicker(p.interval)
	defer t.Stop()
	for seq := uint16(1); ; seq++ {
		msg := []byte{p.e.request, 0, 0, 0, 0, 0, 0, 0, 'g', 'a', 'l', 'a', 'c', 't', 'i', 'c'}
		binary.BigEndian.PutUint16(msg[4:], p.id)
		binary.BigEndian.PutUint16(msg[6:], seq)
		if p.addr.Is4() {
			binary.BigEndian.PutUint16(msg[2:], packet.Checksum(msg))
		}
		p.mu.Lock()
		p.sent[seq] = time.Now()
		p.order = append(p.order, seq)
		p.mu.Unlock()
		_, _ = p.conn.WriteTo(msg, &net.IPAddr{IP: p.addr.AsSlice()})
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
	}
}

func (p *Pinger) receive() {
	defer p.done.Done()
	buf := make([]byte, 1500)
	for {
		n, from, err := p.conn.ReadFrom(buf)
		if err != nil {
			return
		}
		b := buf[:n]
		src, _ := netip.AddrFromSlice(from.(*net.IPAddr).IP)
		if len(b) >= 8 && b[0] == p.e.reply && src.Unmap() == p.addr && binary.BigEndian.Uint16(b[4:]) == p.id {
			p.mu.Lock()
			p.replied[binary.BigEndian.Uint16(b[6:])] = time.Now()
			p.mu.Unlock()
		}
	}
}

// Replies is how many replies have come so far.
func (p *Pinger) Replies() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.replied)
}

// WaitReplies waits until n more replies have come than when it is
// called: the pinger's traffic flows.
func (p *Pinger) WaitReplies(t testing.TB, n int) {
	t.Helper()
	from := p.Replies()
	Eventually(t, 30*time.Second, fmt.Sprintf("%d replies to the pings of %s", n, p.addr), func() error {
		if got := p.Replies() - from; got < n {
			return fmt.Errorf("%d replies", got)
		}
		return nil
	})
}

// Stats are the counts so far, leaving out requests sent in the last
// second (their replies may still come).
func (p *Pinger) Stats() PingerStats { return p.StatsBetween(time.Time{}, time.Now()) }

// StatsBetween are the counts of the requests sent from from until to,
// leaving out those sent in the last second.
func (p *Pinger) StatsBetween(from, to time.Time) PingerStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	var s PingerStats
	if cutoff := time.Now().Add(-time.Second); to.After(cutoff) {
		to = cutoff
	}
	var lastOK, lostSince, lastSent time.Time
	for _, seq := range p.order {
		at := p.sent[seq]
		if at.Before(from) {
			continue
		}
		if at.After(to) {
			break
		}
		s.Sent++
		lastSent = at
		if _, ok := p.replied[seq]; ok {
			s.Received++
			if !lostSince.IsZero() {
				s.LongestOutage = max(s.LongestOutage, at.Sub(lostSince))
				lostSince = time.Time{}
			}
			if s.FirstReply.IsZero() {
				s.FirstReply = at
			}
			s.LastReply = at
			if !lastOK.IsZero() && at.Sub(lastOK) > s.LongestGap {
				s.LongestGap, s.LongestGapFrom = at.Sub(lastOK), lastOK
			}
			lastOK = at
		} else {
			s.Lost++
			if lostSince.IsZero() {
				lostSince = at
			}
		}
	}
	if !lostSince.IsZero() {
		s.LongestOutage = max(s.LongestOutage, lastSent.Add(p.interval).Sub(lostSince))
	}
	return s
}

// Stop ends the pinger, waits a second for late replies and returns the
// final stats; stopping it again returns them again.
func (p *Pinger) Stop() PingerStats {
	p.stopOnce.Do(func() {
		close(p.stop)
		time.Sleep(time.Second + 50*time.Millisecond)
		p.final = p.Stats()
		p.conn.Close()
		p.done.Wait()
	})
	return p.final
}
