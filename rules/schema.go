package rules

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// obj is a JSON object that keeps its keys in the order written.
type obj []kv

type kv struct {
	k string
	v any
}

func (o obj) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, e := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, err := json.Marshal(e.k)
		if err != nil {
			return nil, err
		}
		v, err := json.Marshal(e.v)
		if err != nil {
			return nil, fmt.Errorf("schema of %s: %w", e.k, err)
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// promDurationPattern is a non-empty Prometheus duration ("1h30m", "90s").
const promDurationPattern = `^([0-9]+(ms|[smhdwy]))+$`

// knobSchema is the JSON schema of one knob's value, from its default and
// what Validate accepts.
func knobSchema(key string, def any) any {
	switch key {
	case "selector":
		return obj{{"type", "string"}, {"minLength", 1}, {"pattern", `^[^{}]+$`}}
	case "clusterLabel":
		return obj{{"type", "string"}, {"pattern", `^([a-zA-Z_][a-zA-Z0-9_]*)?$`}}
	case "runbookBaseURL":
		return obj{{"type", "string"}, {"minLength", 1}, {"pattern", "^[^#'\" \n]+$"}}
	case "sourceDownRollupNodes":
		return obj{{"type", "integer"}, {"minimum", 1}}
	case "idleGPUPageMinGPUs":
		return obj{{"type", "integer"}, {"minimum", 0}}
	}
	if strings.HasPrefix(key, "severity.") {
		return obj{{"type", "string"}, {"enum", []string{"critical", "warning", "info"}}}
	}
	if _, ok := def.(string); ok { // the durations
		return obj{{"type", "string"}, {"pattern", promDurationPattern}}
	}
	// helm --set passes a decimal number as a string (2.5 -> "2.5"),
	// which the template prints the same.
	for _, k := range []string{"idleGPUUtilization", "slowdownSMActive", "slowdownTensorActive",
		"slowdownGraphicsEngineActive", "slowdownGPUUtilization", "hubbleLostEventsRatio"} {
		if key == k {
			return obj{{"anyOf", []obj{
				{{"type", "number"}, {"minimum", 0}, {"maximum", 1}},
				{{"type", "string"}, {"pattern", `^(0|0?\.[0-9]+|1|1\.0*)$`}},
			}}}
		}
	}
	return obj{{"anyOf", []obj{
		{{"type", "number"}, {"minimum", 0}},
		{{"type", "string"}, {"pattern", `^([0-9]+|[0-9]*\.[0-9]+)$`}},
	}}}
}

// extraSchema is the schema of additionalRuleLabels or
// additionalRuleAnnotations: names Prometheus accepts, string values, and
// none of the names the rule pack sets itself.
func extraSchema(reserved ...string) obj {
	return obj{
		{"type", "object"},
		{"propertyNames", obj{{"pattern", labelNameRE.String()}, {"not", obj{{"enum", reserved}}}}},
		{"additionalProperties", obj{{"type", "string"}}},
	}
}

// HelmValuesSchema returns the JSON schema of the chart's prometheusRule
// and rules values, for deploy/helm/zonewatch/values.schema.json
// (TestValuesSchemaHasRules keeps them equal).
func HelmValuesSchema() ([]byte, error) {
	cfg := DefaultConfig()
	var props, forProps, sevProps obj
	for _, k := range knobs() {
		s := knobSchema(k.key, k.value(cfg))
		if name, ok := strings.CutPrefix(k.key, "for."); ok {
			forProps = append(forProps, kv{name, s})
			continue
		}
		if name, ok := strings.CutPrefix(k.key, "severity."); ok {
			sevProps = append(sevProps, kv{name, s})
			continue
		}
		props = append(props, kv{k.key, s})
	}
	var disabled obj
	for _, name := range AlertNames() {
		disabled = append(disabled, kv{name, obj{{"type", "boolean"}}})
	}
	closed := func(p obj) obj {
		return obj{{"type", "object"}, {"additionalProperties", false}, {"properties", p}}
	}
	props = append(props,
		kv{"for", closed(forProps)},
		kv{"severity", closed(sevProps)},
		kv{"disabled", closed(disabled)},
		kv{"additionalRuleLabels", extraSchema("severity", "alertname")},
		kv{"additionalRuleAnnotations", extraSchema("summary", "description", "runbook_url")},
	)
	schema := obj{
		{"prometheusRule", closed(obj{
			{"enabled", obj{{"type", "boolean"}}},
			{"labels", obj{{"type", "object"}, {"additionalProperties", obj{{"type", "string"}}}}},
			{"annotations", obj{{"type", "object"}, {"additionalProperties", obj{{"type", "string"}}}}},
		})},
		{"rules", closed(props)},
	}
	raw, err := json.Marshal(schema)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}
