// Package client builds the Kubernetes clients galactic components share: a
// typed BGPAdvertisement client and the coordination client for Leases, both
// from one rest.Config, with no discovery calls.
package client

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/gentype"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/galactic-cni/galactic/pkg/apis/network/v1alpha1"
)

// Scheme knows the galactic API types.
var Scheme = runtime.NewScheme()

var parameterCodec = runtime.NewParameterCodec(Scheme)

func init() {
	if err := v1alpha1.AddToScheme(Scheme); err != nil {
		panic(err)
	}
}

// BGPAdvertisementInterface reads and writes BGPAdvertisements in one namespace.
type BGPAdvertisementInterface = *gentype.ClientWithList[*v1alpha1.BGPAdvertisement, *v1alpha1.BGPAdvertisementList]

// Clients are the API clients of one process.
type Clients struct {
	rest   rest.Interface
	Leases coordinationv1.CoordinationV1Interface
}

// BGPAdvertisements returns a typed client for the namespace.
func (c *Clients) BGPAdvertisements(namespace string) BGPAdvertisementInterface {
	return gentype.NewClientWithList[*v1alpha1.BGPAdvertisement, *v1alpha1.BGPAdvertisementList](
		"bgpadvertisements", c.rest, parameterCodec, namespace,
		func() *v1alpha1.BGPAdvertisement { return &v1alpha1.BGPAdvertisement{} },
		func() *v1alpha1.BGPAdvertisementList { return &v1alpha1.BGPAdvertisementList{} })
}

// LoadConfig reads a kubeconfig file into a rest.Config, with an error that
// names the file.
func LoadConfig(kubeconfig string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("cannot use kubeconfig %q: %w", kubeconfig, err)
	}
	return cfg, nil
}

// New builds the clients from cfg. The config is copied, never modified.
func New(cfg *rest.Config) (*Clients, error) {
	gv := v1alpha1.SchemeGroupVersion
	crdCfg := rest.CopyConfig(cfg)
	crdCfg.GroupVersion = &gv
	crdCfg.APIPath = "/apis"
	crdCfg.ContentType = runtime.ContentTypeJSON
	crdCfg.NegotiatedSerializer = serializer.NewCodecFactory(Scheme).WithoutConversion()
	if crdCfg.UserAgent == "" {
		crdCfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	httpClient, err := rest.HTTPClientFor(crdCfg)
	if err != nil {
		return nil, fmt.Errorf("building HTTP client: %w", err)
	}
	rc, err := rest.RESTClientForConfigAndClient(crdCfg, httpClient)
	if err != nil {
		return nil, fmt.Errorf("building API client: %w", err)
	}
	// Leases share the HTTP client, so one process keeps one connection pool.
	leases, err := coordinationv1.NewForConfigAndClient(rest.CopyConfig(cfg), httpClient)
	if err != nil {
		return nil, fmt.Errorf("building lease client: %w", err)
	}
	return &Clients{rest: rc, Leases: leases}, nil
}
