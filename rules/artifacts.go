package rules

//go:generate go run ./cmd/generate -root ..

// ClusterTestLabel is the cluster label of the multi-cluster variant that the
// promtool tests in rules/tests/ exercise.
const ClusterTestLabel = "cluster"

// File is one generated artifact, its path relative to the repository root.
type File struct {
	Path string
	Data []byte
}

// Artifacts returns every file the generator writes; a test checks that the
// committed copies match.
func Artifacts() ([]File, error) {
	plain, err := Generate(DefaultConfig())
	if err != nil {
		return nil, err
	}
	manifest, err := PrometheusRule(DefaultConfig(), "zonewatch", "monitoring")
	if err != nil {
		return nil, err
	}
	helmTmpl, err := HelmTemplate()
	if err != nil {
		return nil, err
	}
	values, err := HelmValues()
	if err != nil {
		return nil, err
	}
	schema, err := HelmValuesSchema()
	if err != nil {
		return nil, err
	}
	clusterCfg := DefaultConfig()
	clusterCfg.ClusterLabel = ClusterTestLabel
	cluster, err := Generate(clusterCfg)
	if err != nil {
		return nil, err
	}
	return []File{
		{"rules/zonewatch.rules.yml", plain},
		{"rules/prometheusrule.yaml", manifest},
		{"rules/helm-values.yaml", values},
		{"rules/helm-values.schema.json", schema},
		{"rules/tests/zonewatch-cluster.rules.yml", cluster},
		{"deploy/helm/zonewatch/templates/prometheusrule.yaml", helmTmpl},
	}, nil
}
