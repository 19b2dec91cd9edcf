// Package client builds the Kubernetes clients galactic components share:
// typed clients of galactic's kinds and of Leases over one HTTP client, with no
// discovery calls. Only the two API groups are registered, so a plugin
// process does not pay for client-go's registry of every built-in type.
package client

import (
	"fmt"
	"net/http"

	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/gentype"
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
	if err := coordinationv1.AddToScheme(Scheme); err != nil {
		panic(err)
	}
}

// BGPAdvertisementInterface reads and writes BGPAdvertisements in one namespace.
type BGPAdvertisementInterface = *gentype.ClientWithList[*v1alpha1.BGPAdvertisement, *v1alpha1.BGPAdvertisementList]

// LeaseInterface reads and writes Leases in one namespace.
type LeaseInterface = *gentype.ClientWithList[*coordinationv1.Lease, *coordinationv1.LeaseList]

// Clients are the API clients of one process.
type Clients struct {
	rest   rest.Interface
	leases rest.Interface
}

// BGPAdvertisements returns a typed client for the namespace.
func (c *Clients) BGPAdvertisements(namespace string) BGPAdvertisementInterface {
	return gentype.NewClientWithList[*v1alpha1.BGPAdvertisement, *v1alpha1.BGPAdvertisementList](
		"bgpadvertisements", c.rest, parameterCodec, namespace,
		func() *v1alpha1.BGPAdvertisement { return &v1alpha1.BGPAdvertisement{} },
		func() *v1alpha1.BGPAdvertisementList { return &v1alpha1.BGPAdvertisementList{} })
}

// VPCInterface reads and writes VPCs in one namespace.
type VPCInterface = *gentype.ClientWithList[*v1alpha1.VPC, *v1alpha1.VPCList]

// VPCAttachmentInterface reads and writes VPCAttachments in one namespace.
type VPCAttachmentInterface = *gentype.ClientWithList[*v1alpha1.VPCAttachment, *v1alpha1.VPCAttachmentList]

// VPCAddressInterface reads and writes VPCAddresses in one namespace.
type VPCAddressInterface = *gentype.ClientWithList[*v1alpha1.VPCAddress, *v1alpha1.VPCAddressList]

// VNIInterface reads and writes VNIs (cluster-scoped).
type VNIInterface = *gentype.ClientWithList[*v1alpha1.VNI, *v1alpha1.VNIList]

// VPCs returns a typed client for the namespace ("" for all namespaces).
func (c *Clients) VPCs(namespace string) VPCInterface {
	return gentype.NewClientWithList[*v1alpha1.VPC, *v1alpha1.VPCList](
		"vpcs", c.rest, parameterCodec, namespace,
		func() *v1alpha1.VPC { return &v1alpha1.VPC{} },
		func() *v1alpha1.VPCList { return &v1alpha1.VPCList{} })
}

// VPCAttachments returns a typed client for the namespace ("" for all
// namespaces).
func (c *Clients) VPCAttachments(namespace string) VPCAttachmentInterface {
	return gentype.NewClientWithList[*v1alpha1.VPCAttachment, *v1alpha1.VPCAttachmentList](
		"vpcattachments", c.rest, parameterCodec, namespace,
		func() *v1alpha1.VPCAttachment { return &v1alpha1.VPCAttachment{} },
		func() *v1alpha1.VPCAttachmentList { return &v1alpha1.VPCAttachmentList{} })
}

// VPCAddresses returns a typed client for the namespace ("" for all
// namespaces).
func (c *Clients) VPCAddresses(namespace string) VPCAddressInterface {
	return gentype.NewClientWithList[*v1alpha1.VPCAddress, *v1alpha1.VPCAddressList](
		"vpcaddresses", c.rest, parameterCodec, namespace,
		func() *v1alpha1.VPCAddress { return &v1alpha1.VPCAddress{} },
		func() *v1alpha1.VPCAddressList { return &v1alpha1.VPCAddressList{} })
}

// VNIs returns a typed client for the cluster-scoped VNIs.
func (c *Clients) VNIs() VNIInterface {
	return gentype.NewClientWithList[*v1alpha1.VNI, *v1alpha1.VNIList](
		"vnis", c.rest, parameterCodec, "",
		func() *v1alpha1.VNI { return &v1alpha1.VNI{} },
		func() *v1alpha1.VNIList { return &v1alpha1.VNIList{} })
}

// Leases returns a typed Lease client for the namespace.
func (c *Clients) Leases(namespace string) LeaseInterface {
	return gentype.NewClientWithList[*coordinationv1.Lease, *coordinationv1.LeaseList](
		"leases", c.leases, parameterCodec, namespace,
		func() *coordinationv1.Lease { return &coordinationv1.Lease{} },
		func() *coordinationv1.LeaseList { return &coordinationv1.LeaseList{} })
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
	cfg = rest.CopyConfig(cfg)
	// The transport sets the user agent, so it must be known before the
	// HTTP client is built: it names the program in the API server's logs.
	if cfg.UserAgent == "" {
		cfg.UserAgent = rest.DefaultKubernetesUserAgent()
	}
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return newFirstConn(rt) })
	httpClient, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("building HTTP client: %w", err)
	}
	// Both groups share the HTTP client: one process, one connection pool.
	crds, err := restClient(cfg, httpClient, v1alpha1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	leases, err := restClient(cfg, httpClient, coordinationv1.SchemeGroupVersion)
	if err != nil {
		return nil, err
	}
	return &Clients{rest: crds, leases: leases}, nil
}

func restClient(cfg *rest.Config, httpClient *http.Client, gv schema.GroupVersion) (rest.Interface, error) {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &gv
	c.APIPath = "/apis"
	c.ContentType = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(Scheme).WithoutConversion()
	rc, err := rest.RESTClientForConfigAndClient(c, httpClient)
	if err != nil {
		return nil, fmt.Errorf("building the %s client: %w", gv, err)
	}
	return rc, nil
}
