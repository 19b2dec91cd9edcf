package demo_test

import (
	"context"
	"strings"
	"testing"

	"github.com/galactic-cni/galactic/test/demo"
	"github.com/galactic-cni/galactic/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

// The demo is also a test: every step checks what it shows.
func TestTheDemoObservesEveryExpectedState(t *testing.T) {
	env := harness.Setup(t)
	var out strings.Builder
	err := demo.Run(context.Background(), &out, env)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
}
