package harness

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// PollInterval is how often Poll and Eventually check their condition.
const PollInterval = 50 * time.Millisecond

// Poll checks cond every PollInterval until it returns nil, and returns an
// error naming what and cond's last error once limit passes or ctx ends.
// limit bounds a wait for something that must happen; it is never a speed
// requirement.
func Poll(ctx context.Context, limit time.Duration, what string, cond func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s: %v", what, limit, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w (last: %v)", what, ctx.Err(), err)
		case <-time.After(PollInterval):
		}
	}
}

// Eventually is Poll in a test: it fails t when cond does not hold within
// limit.
func Eventually(t testing.TB, limit time.Duration, what string, cond func() error) {
	t.Helper()
	if err := Poll(context.Background(), limit, what, cond); err != nil {
		t.Fatal(err)
	}
}
