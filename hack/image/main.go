// Command image builds galactic's image from the binaries of `make build`
// (`make image`) and renders the manifests with it (`make manifests`).
//
//	image build --bin DIR --out FILE.tar --ref-file FILE [--name REPO:TAG] [--push REF] [--epoch SECONDS]
//	image manifests --ref-file FILE --src DIR --out DIR
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/galactic-cni/galactic/installer/image"
)

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: image build|manifests [flags]"))
	}
	var err error
	switch os.Args[1] {
	case "build":
		err = build(os.Args[2:])
	case "manifests":
		err = manifests(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want build or manifests", os.Args[1])
	}
	fail(err)
}

func fail(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func build(args []string) error {
	fs := flag.NewFlagSet("build", flag.ExitOnError)
	bin := fs.String("bin", "bin", "directory holding the binaries of make build")
	out := fs.String("out", "bin/galactic-image.tar", "OCI layout archive to write")
	refFile := fs.String("ref-file", "bin/galactic-image.ref", "file to write the reference by digest to")
	repo := fs.String("name", "galactic.invalid/galactic:dev", "name of the image in the archive when not pushed")
	push := fs.String("push", "", "registry reference (repo:tag) to push to; empty: no push")
	epoch := fs.Int64("epoch", 0, "time of every entry, seconds since 1970 (the commit's time keeps the digest per commit)")
	_ = fs.Parse(args)
	spec, err := image.Galactic(*bin, time.Unix(*epoch, 0))
	if err != nil {
		return err
	}
	img, err := image.Build(spec)
	if err != nil {
		return err
	}
	name := *repo
	if *push != "" {
		name = *push
	}
	ref, err := image.ByDigest(name, img)
	if err != nil {
		return err
	}
	if err := image.WriteArchive(*out, img, name, ref); err != nil {
		return err
	}
	if *push != "" {
		if ref, err = image.Push(*push, img); err != nil {
			return err
		}
	}
	if err := os.WriteFile(*refFile, []byte(ref+"\n"), 0o644); err != nil {
		return err
	}
	fmt.Printf("%s\n%s\n", *out, ref)
	return nil
}

func manifests(args []string) error {
	fs := flag.NewFlagSet("manifests", flag.ExitOnError)
	refFile := fs.String("ref-file", "bin/galactic-image.ref", "file holding the image reference by digest (make image)")
	src := fs.String("src", "installer/manifests", "manifests to render")
	out := fs.String("out", "bin/manifests", "directory to render into")
	_ = fs.Parse(args)
	b, err := os.ReadFile(*refFile)
	if err != nil {
		return fmt.Errorf("%w (run make image first)", err)
	}
	ref := strings.TrimSpace(string(b))
	if err := os.RemoveAll(*out); err != nil {
		return err
	}
	if err := image.RenderManifests(*src, *out, ref); err != nil {
		return err
	}
	fmt.Printf("%s (image %s): kubectl apply -k %s\n", *out, ref, *out)
	return nil
}
