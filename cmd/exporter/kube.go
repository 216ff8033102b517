package main

import (
	"errors"
	"fmt"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// kubeClient builds a client from a kubeconfig or the in-cluster config,
// and the metadata-only client that resolves job pods' top owners.
func kubeClient(kubeconfig string) (kubernetes.Interface, metadata.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
		}
	} else {
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			return nil, nil, errors.New("not in a cluster and no --kubeconfig given (use --simulate for the built-in simulated cluster)")
		}
		if err != nil {
			return nil, nil, fmt.Errorf("in-cluster config: %w", err)
		}
	}
	cfg.UserAgent = "zonewatch-exporter"
	meta, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("metadata client: %w", err)
	}
	// Protobuf halves the size of pod lists on the wire.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client, err := kubernetes.NewForConfig(cfg)
	return client, meta, err
}
