package sim

import (
	"context"
	"errors"
	"testing"
)

func TestGPUSourceFollowsJobBehaviour(t *testing.T) {
	s := Default()
	ctx := context.Background()
	all, err := NewGPUSource(s, "").Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, n := range s.Nodes {
		total += len(n.GPUs)
	}
	if len(all) != total {
		t.Fatalf("%d samples for %d GPUs", len(all), total)
	}
	byUUID := map[string]int{}
	for i, x := range all {
		byUUID[x.UUID] = i
	}
	for _, j := range s.Jobs {
		for _, p := range j.Pods {
			for _, u := range p.GPUs {
				x := all[byUUID[u]]
				if x.Node != p.Node || x.Util != j.Behaviour.GPUUtil || x.SMActive != j.Behaviour.SMActive {
					t.Errorf("%s/%s GPU %s = %+v; want node %s and the job's behaviour", j.Namespace, j.Name, u, x, p.Node)
				}
			}
		}
	}
	// The symptoms the alerts look for.
	job := func(name string) Behaviour {
		for _, j := range s.Jobs {
			if j.Name == name {
				return j.Behaviour
			}
		}
		t.Fatalf("no job %s", name)
		return Behaviour{}
	}
	if b := job("llm-blocked"); b.GPUUtil > 0.05 {
		t.Errorf("blocked job's GPUs at %v, want near 0", b.GPUUtil)
	}
	if b := job("bert-slow"); b.GPUUtil < 0.8 || b.SMActive > 0.3 {
		t.Errorf("slow job: GPU_UTIL %v, SM %v; want high and low", b.GPUUtil, b.SMActive)
	}
	if b := job("resnet-healthy"); b.GPUUtil < 0.8 || b.SMActive < 0.5 {
		t.Errorf("healthy job: GPU_UTIL %v, SM %v; want busy", b.GPUUtil, b.SMActive)
	}

	one, err := NewGPUSource(s, "gpu-a1").Read(ctx)
	if err != nil || len(one) != len(s.NodeByName("gpu-a1").GPUs) {
		t.Fatalf("gpu-a1: %d samples, %v", len(one), err)
	}
	for _, x := range one {
		if x.Node != "gpu-a1" {
			t.Errorf("sample of %s from the gpu-a1 source", x.Node)
		}
	}
	if cpu, _ := NewGPUSource(s, "cpu-a1").Read(ctx); len(cpu) != 0 {
		t.Errorf("a CPU node reads %d GPUs", len(cpu))
	}

	src := NewGPUSource(s, "gpu-a1")
	src.SetDown(true)
	if _, err := src.Read(ctx); !errors.Is(err, ErrGPUSourceDown) {
		t.Errorf("down source: %v", err)
	}
	src.SetDown(false)
	if _, err := src.Read(ctx); err != nil {
		t.Errorf("source back up: %v", err)
	}
}
