package e2e

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/zonewatch/zonewatch/internal/ciliumlab"
	"github.com/zonewatch/zonewatch/internal/confine"
	"github.com/zonewatch/zonewatch/internal/testenv"
)

// attackEnv carries the attack's plan (JSON) to the process that plays a
// compromised exporter, a start of this test binary; it acts in init, as
// the lab's pod sandboxes do, before any test runs.
const attackEnv = "ZONEWATCH_DATAPATH_ATTACK"

// noConfineEnv, set to 1, runs the attack without the exporter's
// confinement (what --no-bpf.confine does): the proof that the test fails
// when the confinement is removed.
const noConfineEnv = "ZONEWATCH_DATAPATH_NO_CONFINE"

func init() {
	if plan := os.Getenv(attackEnv); plan != "" {
		os.Exit(attack(plan))
	}
}

// attackPlan is what the compromised exporter goes after: one entry of
// each of Cilium's maps, and where it tries to pin a program.
type attackPlan struct {
	Maps    []attackMap
	PinDir  string
	Confine bool
}

type attackMap struct {
	Role, Path string
	// Key is an entry that exists, Value what the attack writes into it,
	// NewKey one that does not exist (hex).
	Key, Value, NewKey string
}

// datapathNode is the one node of the lab this test starts.
var datapathNode = []ciliumlab.NodeSpec{{Name: "dp-a1", Zone: zoneA}}

// TestDatapathReadOnly runs what a compromised exporter would try against
// a real Cilium v1.20.2 agent's pinned maps (an endpoint's policy map,
// cilium_ct4_global, cilium_ipcache_v2), as the chart's pod runs: uid 0
// holding CAP_BPF only (the committed DaemonSet's securityContext, applied
// with setpriv: bounding set, no_new_privs), the node's BPF filesystem
// bind-mounted read-only in a mount namespace of its own, and the
// exporter's own start-up (internal/confine: Supervise, then Child in the
// process it starts). The attacker opens each map for writing, updates an
// entry, inserts one, deletes one, loads a program and pins it. Every
// attempt must be refused and the maps (read by the test's own root
// process before and after) unchanged. With ZONEWATCH_DATAPATH_NO_CONFINE=1
// the same attack runs unconfined, and the test fails. It also runs the
// real exporter binary with the chart's args on the node and checks that
// its conntrack and ipcache sources are up while confined.
func TestDatapathReadOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts a Cilium agent")
	}
	inLane(t)
	testenv.CanStartAs(t)
	chart := testenv.ChartSecurityContext(t)
	if chart.UID != 0 || len(chart.Caps) != 1 || !strings.EqualFold(chart.Caps[0], "BPF") || !chart.NoNewPrivs {
		t.Fatalf("the chart's DaemonSet runs as %s, want root holding BPF only with no_new_privs (update this test with the chart)", chart)
	}
	lab, api, _ := startCiliumLabWith(t, ciliumlab.Config{Nodes: datapathNode})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	n := lab.Nodes[0]

	// Two pods and an idle TCP connection between them: an endpoint's
	// policy map, conntrack entries and ipcache entries to go after.
	if err := lab.EnsureNamespace(ctx, "datapath"); err != nil {
		t.Fatal(err)
	}
	var pods []*ciliumlab.Pod
	for _, name := range []string{"server", "client"} {
		p, err := lab.AddPod(ctx, ciliumlab.PodSpec{Namespace: "datapath", Name: name, Node: n.Name, Labels: map[string]string{"app": name}})
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	ln, err := pods[0].Listen(8080)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			accepted <- c
		}
	}()
	conn, err := pods[1].Dial(net.JoinHostPort(pods[0].IP.String(), "8080"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	select {
	case c := <-accepted:
		defer c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the server pod accepted no connection")
	}

	// The agent writes its maps as identities settle (seconds after CNI
	// ADD on a slow machine): attack only once they have, and once the
	// maps stay the same for a while, so that a change is the attack's.
	for _, p := range pods {
		if _, err := p.SettledIdentity(ctx, "app"); err != nil {
			t.Fatal(err)
		}
	}
	globals := "/sys/fs/bpf/tc/globals"
	policyMap := policyMapOf(t, n.Path(globals))
	waitQuiet(t, pods, n.Path(filepath.Join(globals, policyMap)), n.Path(filepath.Join(globals, "cilium_ct4_global")),
		n.Path(filepath.Join(globals, "cilium_ipcache_v2")))
	plan := attackPlan{PinDir: globals, Confine: os.Getenv(noConfineEnv) != "1"}
	before := map[string]mapDump{}
	for _, target := range []struct {
		role string
		name string
		// pick chooses the entry to attack among the map's keys
		pick func(keys []string) string
		// vary is a key byte that changes which entry a key names: inside
		// the prefix of an LPM trie's key (the identity of a policy key,
		// the address of an ipcache key), anywhere in a hash map's.
		vary int
	}{
		{"policy", policyMap, first, 4},
		{"conntrack", "cilium_ct4_global", connEntry(pods[0].IP.As4(), pods[1].IP.As4()), 0},
		{"ipcache", "cilium_ipcache_v2", ipcacheEntry(pods[0].IP.As4()), 11},
	} {
		path := filepath.Join(globals, target.name)
		d := dumpMap(t, n.Path(path))
		key := target.pick(d.keys())
		if key == "" {
			t.Fatalf("%s map %s: no entry to attack among %d", target.role, target.name, len(d))
		}
		before[path] = d
		plan.Maps = append(plan.Maps, attackMap{Role: target.role, Path: path, Key: key, Value: flipped(d[key]), NewKey: absentKey(d, key, target.vary)})
	}
	t.Logf("targets: %+v", plan.Maps)

	// The attacker: nsenter into the node, a mount namespace of its own
	// with the node's bpffs bind-mounted read-only over itself (the
	// chart's readOnly hostPath mount), then the chart's identity.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(plan)
	argv := append([]string{"--mount", "--propagation", "private", "--", "sh", "-c",
		`mount --bind -o ro /sys/fs/bpf /sys/fs/bpf && exec "$@"`, "sh"}, chart.Args(self, "-test.run=^$")...)
	p, err := n.Start("datapath-attack", []string{attackEnv + "=" + string(js)}, "unshare", argv...)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for {
		done, err := p.Exited()
		if done {
			if err != nil {
				t.Errorf("the attacker exited: %v", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the attacker did not finish in 2 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
	out, err := os.ReadFile(p.Log)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the attacker's output:\n%s", out)

	attempts, refused, reads, identified := 0, 0, 0, false
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.SplitN(l, "\t", 4)
		switch {
		case len(f) > 0 && f[0] == "as":
			identified = true
			// uid 0 holding CAP_BPF (39) only, no_new_privs, the bpffs
			// read-only; seccomp mode 2 (filter) when confined.
			want := []string{"uid=0", "CapEff=0000008000000000", "NoNewPrivs=1"}
			if plan.Confine {
				want = append(want, "Seccomp=2")
			}
			have := strings.Fields(l)
			for _, want := range want {
				if !slices.Contains(have, want) {
					t.Errorf("the attacker runs as %q, want %s", l, want)
				}
			}
			if last := have[len(have)-1]; !strings.HasPrefix(last, "bpffs=ro,") {
				t.Errorf("the attacker's /sys/fs/bpf is mounted %q, want read-only", last)
			}
		case len(f) == 4 && f[0] == "attempt":
			attempts++
			if f[2] == "refused" {
				refused++
			} else {
				t.Errorf("not refused: %s %s", f[1], f[3])
			}
		case len(f) >= 2 && f[0] == "read":
			reads++
		}
	}
	if !identified {
		t.Error("the attacker did not say who it runs as")
	}
	if want := 4*len(plan.Maps) + 2; attempts != want {
		t.Errorf("%d attempts reported, want %d", attempts, want)
	}
	if reads != len(plan.Maps) {
		t.Errorf("the attacker read %d of %d maps through the exporter's own opener, want all: the readers would be down", reads, len(plan.Maps))
	}
	changed := 0
	for _, m := range plan.Maps {
		after := dumpMap(t, n.Path(m.Path))
		if diff := before[m.Path].diff(after, m.Role == "conntrack", pods); diff != "" {
			changed++
			t.Errorf("%s map %s changed: %s", m.Role, m.Path, diff)
		}
	}
	fmt.Printf("datapath-write: attempts=%d refused=%d maps_changed=%d\n", attempts, refused, changed)

	t.Run("the confined exporter reads the maps", func(t *testing.T) {
		addrs := startChartExporters(t, lab, api, lab.Nodes, noGPU)
		for _, src := range []string{"conntrack", "ipcache"} {
			up := func() bool {
				return sumExporters(t, addrs, "zonewatch_source_up", map[string]string{"source": src}) == 1
			}
			for end := time.Now().Add(time.Minute); !up() && time.Now().Before(end); {
				time.Sleep(time.Second)
			}
			if !up() {
				t.Errorf("zonewatch_source_up{source=%q} is not 1 on the confined exporter", src)
			}
		}
		log, _ := os.ReadFile(filepath.Join(n.Dir, "exporter.log"))
		if !bytes.Contains(log, []byte("BPF confinement on")) {
			t.Errorf("the exporter did not log its confinement:\n%s", log)
		}
	})
}

// attack is the compromised exporter: it starts as the exporter does
// (confine.Supervise, and confine.Child in the process that starts) unless
// the plan says it is unconfined, reads each map as the readers do, and
// then tries to change them. One line per read and attempt.
func attack(planJSON string) int {
	var plan attackPlan
	if err := json.Unmarshal([]byte(planJSON), &plan); err != nil {
		fmt.Println("bad plan:", err)
		return 2
	}
	load := func(path string) (*ebpf.Map, error) {
		return ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	}
	if plan.Confine {
		op, err := confine.Child()
		if err != nil {
			fmt.Println("confining:", err)
			return 1
		}
		if op == nil {
			code, err := confine.Supervise()
			if err != nil {
				fmt.Println("supervising:", err)
			}
			return code
		}
		load = op.LoadPinnedMap
	}
	fmt.Println(identity())
	report := func(m, what string, err error) {
		if err != nil {
			fmt.Printf("attempt\t%s %s\trefused\t%v\n", m, what, err)
		} else {
			fmt.Printf("attempt\t%s %s\tSUCCEEDED\t-\n", m, what)
		}
	}
	var held *ebpf.Map
	for _, m := range plan.Maps {
		key, _ := hex.DecodeString(m.Key)
		val, _ := hex.DecodeString(m.Value)
		newKey, _ := hex.DecodeString(m.NewKey)
		ro, err := load(m.Path)
		if err != nil {
			fmt.Printf("read\t%s\tFAILED\t%v\n", m.Role, err)
		} else {
			got := make([]byte, ro.ValueSize())
			if err := ro.Lookup(key, got); err != nil {
				fmt.Printf("read\t%s\tFAILED\t%v\n", m.Role, err)
			} else {
				fmt.Printf("read\t%s\tok\n", m.Role)
			}
		}
		// Write through a writable descriptor when the open gives one,
		// else through the read-only one: both are tried, never neither.
		rw, err := ebpf.LoadPinnedMap(m.Path, nil)
		report(m.Role, "open for writing", err)
		w := rw
		if w == nil {
			w = ro
		}
		if w == nil {
			for _, what := range []string{"update", "insert", "delete"} {
				report(m.Role, what, errors.New("no descriptor at all"))
			}
			continue
		}
		report(m.Role, "update", w.Update(key, val, ebpf.UpdateExist))
		report(m.Role, "insert", w.Update(newKey, val, ebpf.UpdateNoExist))
		report(m.Role, "delete", w.Delete(key))
		if held == nil {
			held = w
		}
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SocketFilter, License: "GPL",
		Instructions: asm.Instructions{asm.LoadImm(asm.R0, 0, asm.DWord), asm.Return()}})
	report("program", "load", err)
	pin := filepath.Join(plan.PinDir, "zonewatch_datapath_test")
	switch {
	case prog != nil:
		report("program", "pin", prog.Pin(pin))
	case held != nil:
		report("program", "pin (a map: no program loaded)", held.Pin(pin))
	default:
		report("program", "pin", errors.New("nothing to pin"))
	}
	return 0
}

// identity says who the attacker runs as: "as" and the uid, effective
// capabilities, no_new_privs and seccomp mode from /proc/self/status, and
// the mount options of /sys/fs/bpf from /proc/self/mountinfo.
func identity() string {
	out := []string{"as", "uid=" + strconv.Itoa(os.Getuid())}
	status, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(l, ":")
		if k == "CapEff" || k == "NoNewPrivs" || k == "Seccomp" {
			out = append(out, k+"="+strings.TrimSpace(v))
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	for _, l := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(l); len(f) > 5 && f[4] == "/sys/fs/bpf" {
			out = append(out, "bpffs="+f[5]) // the last mount there is the one seen
		}
	}
	return strings.Join(out, "\t")
}

// waitQuiet returns once two reads of the maps at paths, 2 s apart, are the
// same (for a conntrack map, its entries of pods), and fails the test
// after a minute of changes.
func waitQuiet(t *testing.T, pods []*ciliumlab.Pod, paths ...string) {
	t.Helper()
	var last string
	for end := time.Now().Add(time.Minute); time.Now().Before(end); {
		before := map[string]mapDump{}
		for _, p := range paths {
			before[p] = dumpMap(t, p)
		}
		time.Sleep(2 * time.Second)
		last = ""
		for _, p := range paths {
			if d := before[p].diff(dumpMap(t, p), strings.Contains(p, "_ct"), pods); d != "" {
				last += p + ": " + d + "\n"
			}
		}
		if last == "" {
			return
		}
	}
	t.Fatalf("the agent kept changing its maps for a minute; last:\n%s", last)
}

// mapDump is a map's entries, hex key to value.
type mapDump map[string][]byte

// dumpMap reads a pinned map read-only from the test's own process.
func dumpMap(t *testing.T, path string) mapDump {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(path, &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	defer m.Close()
	d := mapDump{}
	k, v := make([]byte, m.KeySize()), make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(k, v) {
		d[hex.EncodeToString(k)] = slices.Clone(v)
	}
	if err := it.Err(); err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return d
}

func (d mapDump) keys() []string {
	keys := make([]string, 0, len(d))
	for k := range d {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// diff says how after differs from d; empty when it does not. For the
// conntrack map only the entries of the lab's pods count (other entries
// come and go with the agent's own traffic and garbage collection).
func (d mapDump) diff(after mapDump, podsOnly bool, pods []*ciliumlab.Pod) string {
	counts := func(k string) bool {
		if !podsOnly {
			return true
		}
		for _, p := range pods {
			ip := p.IP.As4()
			if strings.Contains(k, hex.EncodeToString(ip[:])) {
				return true
			}
		}
		return false
	}
	var out []string
	for k, v := range d {
		if !counts(k) {
			continue
		}
		switch w, ok := after[k]; {
		case !ok:
			out = append(out, "entry "+k+" is gone")
		case !bytes.Equal(v, w):
			out = append(out, fmt.Sprintf("entry %s: %x -> %x", k, v, w))
		}
	}
	for k := range after {
		if _, ok := d[k]; !ok && counts(k) {
			out = append(out, "new entry "+k)
		}
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

func first(keys []string) string {
	if len(keys) == 0 {
		return ""
	}
	return keys[0]
}

// connEntry picks the TCP conntrack entry of the connection between a and
// b (cilium_ct4_global's key: two addresses, two ports, nexthdr, flags).
func connEntry(a, b [4]byte) func([]string) string {
	return func(keys []string) string {
		for _, k := range keys {
			raw, _ := hex.DecodeString(k)
			if len(raw) != 14 || raw[12] != 6 {
				continue
			}
			x, y := [4]byte(raw[0:4]), [4]byte(raw[4:8])
			if x == a && y == b || x == b && y == a {
				return k
			}
		}
		return ""
	}
}

// ipcacheEntry picks the ipcache entry of address ip (cilium_ipcache_v2's
// key: prefix length u32, cluster u16, pad, family 1 for IPv4, address).
func ipcacheEntry(ip [4]byte) func([]string) string {
	return func(keys []string) string {
		for _, k := range keys {
			raw, _ := hex.DecodeString(k)
			if len(raw) == 24 && raw[7] == 1 && [4]byte(raw[8:12]) == ip {
				return k
			}
		}
		return ""
	}
}

// endpointPolicyMap is the name of an endpoint's policy map.
var endpointPolicyMap = regexp.MustCompile(`^cilium_policy(_v[0-9]+)?_[0-9]+$`)

// policyMapOf names the fullest endpoint policy map pinned in dir.
func policyMapOf(t *testing.T, dir string) string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	best, most := "", 0
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
		if !endpointPolicyMap.MatchString(e.Name()) {
			continue
		}
		if n := len(dumpMap(t, filepath.Join(dir, e.Name()))); n > most {
			best, most = e.Name(), n
		}
	}
	if best == "" {
		t.Fatalf("no endpoint policy map with entries in %s (pins: %v)", dir, names)
	}
	return best
}

// flipped is v with every bit inverted: a value the entry never had.
func flipped(v []byte) string {
	out := make([]byte, len(v))
	for i, b := range v {
		out[i] = ^b
	}
	return hex.EncodeToString(out)
}

// absentKey is key with byte at changed until no entry has it.
func absentKey(d mapDump, key string, at int) string {
	raw, _ := hex.DecodeString(key)
	for i := 1; i < 256; i++ {
		c := slices.Clone(raw)
		c[at] += byte(i)
		if k := hex.EncodeToString(c); d[k] == nil {
			return k
		}
	}
	return ""
}
