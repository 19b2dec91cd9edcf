package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/galactic-cni/galactic/pkg/hostif"
	"github.com/galactic-cni/galactic/pkg/routing"
)

func TestATapHeldByAVMMIsTryAgainLaterNamingTheVMMsPid(t *testing.T) {
	busy := fmt.Errorf("setting up: %w", &hostif.BusyError{Interface: "gt0123456789abc", Holders: []int{4242}})
	e := setupError(busy)
	if e.Code != types.ErrTryAgainLater {
		t.Fatalf("code %d, want %d (try again later)", e.Code, types.ErrTryAgainLater)
	}
	for _, want := range []string{"gt0123456789abc", "[4242]"} {
		if !strings.Contains(e.Msg, want) {
			t.Errorf("message %q does not name %s", e.Msg, want)
		}
	}
}

func TestSetupErrorsMapToTheirCNICodes(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code uint
	}{
		{&hostif.BusyError{Interface: "gv0123456789abc", Container: "c1"}, types.ErrTryAgainLater},
		{fmt.Errorf("domain: %w", routing.ErrNoVRF), types.ErrInvalidNetworkConfig},
		{fmt.Errorf("netlink: boom"), types.ErrInternal},
	} {
		if got := setupError(tc.err).Code; got != tc.code {
			t.Errorf("%v: code %d, want %d", tc.err, got, tc.code)
		}
	}
}
