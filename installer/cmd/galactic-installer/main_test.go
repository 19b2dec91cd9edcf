package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestTheCommandLineRejectsWhatItDoesNotKnow(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{nil, 2, "usage: galactic-installer <command>"},
		{[]string{"reinstall"}, 2, `unknown command "reinstall"`},
		{[]string{"install", "extra"}, 2, "unexpected arguments"},
		{[]string{"uninstall", "--interval", "1s"}, 2, "flag provided but not defined: -interval"},
		{[]string{"help"}, 0, ""},
	} {
		var out, errs bytes.Buffer
		code := run(context.Background(), tc.args, func(string) string { return "" }, &out, &errs)
		if code != tc.code || !strings.Contains(errs.String(), tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errs.String(), tc.code, tc.want)
		}
	}
}

func TestInstallFailsWithTheReasonOnStderrAndExitCodeOne(t *testing.T) {
	var out, errs bytes.Buffer
	code := run(context.Background(), []string{"install", "--root", t.TempDir(), "--source-dir", t.TempDir()}, func(string) string { return "" }, &out, &errs)
	if code != 1 || !strings.Contains(errs.String(), "galactic-installer install: node name is not set") {
		t.Errorf("exit %d, stderr %q", code, errs.String())
	}
}
