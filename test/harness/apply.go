package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// ApplyManifests server-side applies every YAML document in the files (or
// the *.yaml files of the directories) named, in order, and waits for any
// CRD among them to be served.
func ApplyManifests(ctx context.Context, cfg *rest.Config, paths ...string) error {
	objs, err := readManifests(paths...)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	disco, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disco))
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		var gvr schema.GroupVersionResource
		for attempt := 0; ; attempt++ {
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err == nil {
				gvr = m.Resource
				break
			}
			// A kind defined by a CRD applied just before may not be served yet.
			if attempt > 50 {
				return fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
			}
			mapper.Reset()
			time.Sleep(200 * time.Millisecond)
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			return err
		}
		res := dyn.Resource(gvr)
		var ri dynamic.ResourceInterface = res
		if ns := obj.GetNamespace(); ns != "" {
			ri = res.Namespace(ns)
		}
		force := true
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: "galactic-test", Force: &force}); err != nil {
			return fmt.Errorf("applying %s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		if gvk.Kind == "CustomResourceDefinition" {
			if err := waitEstablished(ctx, ri, obj.GetName()); err != nil {
				return err
			}
			mapper.Reset()
		}
	}
	return nil
}

func waitEstablished(ctx context.Context, ri dynamic.ResourceInterface, name string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		crd, err := ri.Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
			for _, c := range conds {
				m, _ := c.(map[string]any)
				if m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("CRD %s not established after 30s", name)
}

func readManifests(paths ...string) ([]*unstructured.Unstructured, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		matches, _ := filepath.Glob(filepath.Join(p, "*.yaml"))
		sort.Strings(matches)
		files = append(files, matches...)
	}
	var objs []*unstructured.Unstructured
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var m map[string]any
			if err := dec.Decode(&m); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			if len(m) == 0 {
				continue
			}
			u := &unstructured.Unstructured{Object: m}
			if strings.TrimSpace(u.GetKind()) == "" {
				return nil, fmt.Errorf("%s: a document has no kind", f)
			}
			objs = append(objs, u)
		}
	}
	return objs, nil
}
