package schedlab

import (
	"context"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ListItems lists the nodes that nodeSelector selects ("" for all) and the
// pods of namespace ns ("" for all) as the items of kubectl's
// "get -o json" lists: each with its apiVersion and kind, which the API's
// list responses leave out of their items.
func ListItems(ctx context.Context, c kubernetes.Interface, nodeSelector, ns string) (nodes, pods []any, err error) {
	nl, err := c.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: nodeSelector})
	if err != nil {
		return nil, nil, err
	}
	pl, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, nil, err
	}
	for i := range nl.Items {
		n := nl.Items[i]
		n.APIVersion, n.Kind = "v1", "Node"
		nodes = append(nodes, n)
	}
	for i := range pl.Items {
		p := pl.Items[i]
		p.APIVersion, p.Kind = "v1", "Pod"
		pods = append(pods, p)
	}
	return nodes, pods, nil
}
