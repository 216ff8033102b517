// Package kubeapi is the exporter's client of the Kubernetes API for the
// built-in resources it reads: pods, nodes, Services, EndpointSlices and
// ResourceSlices, decoded with a scheme of their three API groups alone.
//
// It is not client-go's typed clientset: that one's scheme registers every
// API group at start, and its informer factories bring every group's
// informers, listers and apply configurations into the binary (about
// 17 MB of a 79 MB exporter, 9 MiB of resident binary pages in each of the
// exporter's processes; docs/performance.md). The requests are the typed
// clients' own (client-go's rest client, protobuf preferred, the same
// query parameters), and informers are client-go's shared informers.
package kubeapi

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Scheme holds the types of the groups the exporter reads, and nothing
// else.
var Scheme = runtime.NewScheme()

var (
	codecs         = serializer.NewCodecFactory(Scheme)
	parameterCodec = runtime.NewParameterCodec(Scheme)
)

func init() {
	metav1.AddToGroupVersion(Scheme, schema.GroupVersion{Version: "v1"})
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, discoveryv1.AddToScheme, resourcev1.AddToScheme} {
		if err := add(Scheme); err != nil {
			panic(err) // registering the API's own types
		}
	}
}

// Resource is one resource the exporter reads.
type Resource struct {
	GVR        schema.GroupVersionResource
	Namespaced bool
	newObject  func() runtime.Object
	newList    func() runtime.Object
}

// Object returns an empty object of the resource (an informer's example).
func (r Resource) Object() runtime.Object { return r.newObject() }

// The resources the exporter reads.
var (
	Pods = Resource{corev1.SchemeGroupVersion.WithResource("pods"), true,
		func() runtime.Object { return &corev1.Pod{} }, func() runtime.Object { return &corev1.PodList{} }}
	Nodes = Resource{corev1.SchemeGroupVersion.WithResource("nodes"), false,
		func() runtime.Object { return &corev1.Node{} }, func() runtime.Object { return &corev1.NodeList{} }}
	Services = Resource{corev1.SchemeGroupVersion.WithResource("services"), true,
		func() runtime.Object { return &corev1.Service{} }, func() runtime.Object { return &corev1.ServiceList{} }}
	EndpointSlices = Resource{discoveryv1.SchemeGroupVersion.WithResource("endpointslices"), true,
		func() runtime.Object { return &discoveryv1.EndpointSlice{} }, func() runtime.Object { return &discoveryv1.EndpointSliceList{} }}
	ResourceSlices = Resource{resourcev1.SchemeGroupVersion.WithResource("resourceslices"), false,
		func() runtime.Object { return &resourcev1.ResourceSlice{} }, func() runtime.Object { return &resourcev1.ResourceSliceList{} }}
)

// Interface is what the exporter asks of an API server: lists and watches
// of its resources, and which resources a group version serves (the
// question client-go's discovery client answers, by the same name).
type Interface interface {
	List(ctx context.Context, r Resource, namespace string, opts metav1.ListOptions) (runtime.Object, error)
	Watch(ctx context.Context, r Resource, namespace string, opts metav1.ListOptions) (watch.Interface, error)
	ServerResourcesForGroupVersion(groupVersion string) (*metav1.APIResourceList, error)
}

// Client reads an API server through one rest client per group version,
// sharing one HTTP client.
type Client struct {
	groups map[schema.GroupVersion]rest.Interface
}

var _ Interface = (*Client)(nil)

// NewForConfig returns a client for cfg, as client-go's NewForConfig does
// (one HTTP client, the typed clients' defaults).
func NewForConfig(cfg *rest.Config) (*Client, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, err
	}
	c := &Client{groups: map[schema.GroupVersion]rest.Interface{}}
	for _, gv := range []schema.GroupVersion{corev1.SchemeGroupVersion, discoveryv1.SchemeGroupVersion, resourcev1.SchemeGroupVersion} {
		gc := rest.CopyConfig(cfg)
		gc.GroupVersion = &gv
		gc.APIPath = "/apis"
		if gv.Group == "" {
			gc.APIPath = "/api"
		}
		gc.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(Scheme, codecs).WithoutConversion()
		if gc.UserAgent == "" {
			gc.UserAgent = rest.DefaultKubernetesUserAgent()
		}
		rc, err := rest.RESTClientForConfigAndClient(gc, hc)
		if err != nil {
			return nil, fmt.Errorf("%s client: %w", gv, err)
		}
		c.groups[gv] = rc
	}
	return c, nil
}

// NewForConfigOrDie is NewForConfig for tests and set-up that cannot go on
// without it.
func NewForConfigOrDie(cfg *rest.Config) *Client {
	c, err := NewForConfig(cfg)
	if err != nil {
		panic(err)
	}
	return c
}

func (c *Client) request(r Resource, namespace string, opts *metav1.ListOptions) (*rest.Request, time.Duration, error) {
	rc, ok := c.groups[r.GVR.GroupVersion()]
	if !ok {
		return nil, 0, fmt.Errorf("kubeapi: no client for %s", r.GVR.GroupVersion())
	}
	var timeout time.Duration
	if opts.TimeoutSeconds != nil {
		timeout = time.Duration(*opts.TimeoutSeconds) * time.Second
	}
	return rc.Get().
		UseProtobufAsDefault().
		NamespaceIfScoped(namespace, r.Namespaced && namespace != "").
		Resource(r.GVR.Resource).
		VersionedParams(opts, parameterCodec), timeout, nil
}

// List lists r in namespace ("" for all) with opts; the result is r's list
// type.
func (c *Client) List(ctx context.Context, r Resource, namespace string, opts metav1.ListOptions) (runtime.Object, error) {
	req, timeout, err := c.request(r, namespace, &opts)
	if err != nil {
		return nil, err
	}
	out := r.newList()
	if err := req.Timeout(timeout).Do(ctx).Into(out); err != nil {
		return nil, err
	}
	return out, nil
}

// Watch watches r in namespace ("" for all) with opts.
func (c *Client) Watch(ctx context.Context, r Resource, namespace string, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	req, timeout, err := c.request(r, namespace, &opts)
	if err != nil {
		return nil, err
	}
	return req.Timeout(timeout).Watch(ctx)
}

// ServerResourcesForGroupVersion returns the resources groupVersion serves
// (GET /api/v1 or /apis/GROUP/VERSION); a group version not served is a
// NotFound error, as from client-go's discovery client.
func (c *Client) ServerResourcesForGroupVersion(groupVersion string) (*metav1.APIResourceList, error) {
	gv, err := schema.ParseGroupVersion(groupVersion)
	if err != nil {
		return nil, err
	}
	path := "/apis/" + gv.String()
	if gv.Group == "" {
		path = "/api/" + gv.Version
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	raw, err := c.groups[corev1.SchemeGroupVersion].Get().AbsPath(path).SetHeader("Accept", "application/json").Do(ctx).Raw()
	if err != nil {
		return nil, err
	}
	list := &metav1.APIResourceList{}
	if err := json.Unmarshal(raw, list); err != nil {
		return nil, fmt.Errorf("discovery of %s: %w", groupVersion, err)
	}
	if list.GroupVersion == "" {
		list.GroupVersion = groupVersion
	}
	return list, nil
}

// NewInformer returns a shared informer of r in namespace ("" for all),
// requests tweaked by tweak (nil: none) first (a label or field selector),
// as client-go's filtered informers do.
func NewInformer(c Interface, r Resource, namespace string, resync time.Duration, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	return InformerFor(c, r.newObject(), resync,
		func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			if tweak != nil {
				tweak(&o)
			}
			return c.List(ctx, r, namespace, o)
		},
		func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			if tweak != nil {
				tweak(&o)
			}
			return c.Watch(ctx, r, namespace, o)
		})
}

// InformerFor returns a shared informer of example's type over list and
// watch (any client's: kubeapi's, the metadata or the dynamic client),
// with no indexer: the exporter's informers add the ones they read. A
// client whose watches send no initial events says so
// (IsWatchListSemanticsUnSupported, as client-go's fake clientset does),
// and the reflector then lists before it watches.
func InformerFor(client any, example runtime.Object, resync time.Duration,
	list func(context.Context, metav1.ListOptions) (runtime.Object, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.SharedIndexInformer {
	lw := &cache.ListWatch{ListWithContextFunc: list, WatchFuncWithContext: watchFn}
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client), example,
		cache.SharedIndexInformerOptions{ResyncPeriod: resync, Indexers: cache.Indexers{}})
}

// Informers are started together, as client-go's informer factories start
// theirs.
type Informers []cache.SharedIndexInformer

// Start runs every informer until stop closes.
func (s Informers) Start(stop <-chan struct{}) {
	for _, inf := range s {
		go inf.Run(stop)
	}
}

// ListPods lists pods in namespace ("" for all).
func ListPods(ctx context.Context, c Interface, namespace string, opts metav1.ListOptions) (*corev1.PodList, error) {
	o, err := c.List(ctx, Pods, namespace, opts)
	if err != nil {
		return nil, err
	}
	return o.(*corev1.PodList), nil
}

// ListNodes lists nodes.
func ListNodes(ctx context.Context, c Interface, opts metav1.ListOptions) (*corev1.NodeList, error) {
	o, err := c.List(ctx, Nodes, "", opts)
	if err != nil {
		return nil, err
	}
	return o.(*corev1.NodeList), nil
}
