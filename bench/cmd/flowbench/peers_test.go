package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestCostPipelinesCompile builds every cell's pipeline: the stages it says, a declared topic
// between each two of an unfused chain, none in a fused one.
func TestCostPipelinesCompile(t *testing.T) {
	dir := t.TempDir()
	for _, c := range costCells(200_000, time.Second) {
		path := filepath.Join(dir, strings.ReplaceAll(c.name(), " ", "-")+".hcl")
		if err := os.WriteFile(path, []byte(c.hcl()), 0o644); err != nil {
			t.Fatal(err)
		}
		plan, _, diags := flow.Build(path, flow.Options{GoFuncs: stages.Names()})
		if diags.HasErrors() {
			t.Fatalf("%s does not compile: %s\n%s", c.name(), diags.Error(), c.hcl())
		}
		if len(plan.Stages) != c.stages {
			t.Errorf("%s has %d stages, want %d", c.name(), len(plan.Stages), c.stages)
		}
		declared := strings.Count(c.hcl(), "\ntopic \"t")
		if want := c.stages - 1; c.fused && declared != 0 || !c.fused && declared != want {
			t.Errorf("%s declares %d topics between its stages", c.name(), declared)
		}
	}
}

// TestCostCells checks the table's shape: every value of every dimension of issue 15, and each
// cell the base but for its own dimension.
func TestCostCells(t *testing.T) {
	var got []string
	for _, c := range costCells(200_000, time.Second) {
		got = append(got, c.dim+"="+c.value)
		d := c
		switch c.dim {
		case "partitions":
			d.partitions = costBase.partitions
		case "stages":
			d.stages, d.fused = costBase.stages, false
		case "payload":
			d.payload = costBase.payload
		case "keys":
			d.keys = costBase.keys
		}
		d.n = 200_000
		b := costBase
		b.dim, b.value, b.n, b.limit = d.dim, d.value, d.n, d.limit
		if d != b {
			t.Errorf("%s differs from the base in more than its own dimension: %+v", c.name(), c)
		}
	}
	want := "partitions=1 partitions=4 partitions=16 partitions=64 stages=1 unfused stages=3 unfused stages=10 unfused " +
		"stages=3 fused stages=10 fused payload=200 B payload=4 KB payload=64 KB keys=10 keys=10k keys=1M"
	if strings.Join(got, " ") != want {
		t.Errorf("cells %s, want %s", strings.Join(got, " "), want)
	}
}

// TestCostPerPartition: the summary of the partitions rows is each row's peak RSS beyond the row of
// one partition, per partition beyond the first, against issue 26's 2 MB.
func TestCostPerPartition(t *testing.T) {
	row := func(partitions int, peakMB int64) costResult {
		return costResult{cell: costCell{dim: "partitions", partitions: partitions}, peakKB: peakMB * 1024}
	}
	tab := costTable{rows: []costResult{row(1, 60), row(4, 100), row(16, 90), row(64, 186)}}
	want := "peak RSS per partition beyond the first (aim <= 2 MB, issue 26): 2.00 MB at 16 partitions, 2.00 MB at 64 partitions; met"
	if got := tab.perPartition(); got != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	tab.rows[3] = row(64, 187)
	if got := tab.perPartition(); !strings.HasSuffix(got, "2.02 MB at 64 partitions; NOT met") {
		t.Errorf("64 partitions at 187 MB: %s", got)
	}
	if got := (costTable{rows: tab.rows[1:]}).perPartition(); got != "" {
		t.Errorf("without the row of one partition: %q", got)
	}
}

func TestCostPayloadAndKeys(t *testing.T) {
	for _, size := range []int{200, 4 << 10, 64 << 10} {
		p := costPayload(nil, 123456, size, costKey(123456, 10))
		if len(p) != size {
			t.Errorf("payload of %d bytes, want %d", len(p), size)
		}
		var v struct {
			Seq    int    `json:"seq"`
			Key    string `json:"key"`
			Amount int    `json:"amount"`
		}
		if err := json.Unmarshal(p, &v); err != nil || v.Seq != 123456 || v.Key == "" || v.Amount < 1000 {
			t.Errorf("payload %.80s: %+v, %v", p, v, err)
		}
	}
	for _, keys := range []int{10, 10_000} {
		seen := map[string]bool{}
		for i := range keys {
			seen[costKey(keys+i, keys)] = true
		}
		if len(seen) != keys {
			t.Errorf("%d consecutive messages have %d distinct keys of %d", keys, len(seen), keys)
		}
	}
}

// TestBenthosConfigs checks the Benthos set-ups: the hops of each shape, the tuned settings only in
// the tuned set-up, and, where bin/benthos is built, that Benthos accepts them (benthos lint).
func TestBenthosConfigs(t *testing.T) {
	five, _ := benthosChainStreams(5)()
	one, _ := benthosChainStreams(1)()
	tunedOnly := []string{"limit: 1000", "auto_replay_nacks: false", "count: 1000", "max_in_flight: 1", "metrics:"}
	bin, _ := filepath.Abs("../../../bin/benthos")
	_, err := os.Stat(bin)
	lint := err == nil
	for _, tuned := range []bool{false, true} {
		for _, streams := range [][]string{five, one} {
			hops, root := benthosConfigs("127.0.0.1:6399", 4195, streams, tuned, "/dev/null")
			if len(hops) != len(streams)-1 {
				t.Fatalf("%d hops for %d streams", len(hops), len(streams))
			}
			filters := 0
			for i, hop := range hops {
				filters += strings.Count(hop, "- mapping:")
				if !strings.Contains(hop, `"`+streams[i]+`"`) || !strings.Contains(hop, `"`+streams[i+1]+`"`) {
					t.Errorf("hop %d does not read %s and write %s:\n%s", i+1, streams[i], streams[i+1], hop)
				}
				for _, s := range tunedOnly {
					if strings.Contains(hop+root, s) != tuned {
						t.Errorf("tuned %v, hop %d: %q present %v", tuned, i+1, s, !tuned)
					}
				}
				if lint {
					path := filepath.Join(t.TempDir(), "c.yaml")
					if err := os.WriteFile(path, []byte(root+hop), 0o644); err != nil {
						t.Fatal(err)
					}
					if out, err := exec.Command(bin, "lint", path).CombinedOutput(); err != nil {
						t.Errorf("benthos lint: %v: %s\n%s", err, out, root+hop)
					}
				}
			}
			if filters != 3 {
				t.Errorf("%d filters over %d hops, want 3", filters, len(hops))
			}
		}
	}
	if !lint {
		t.Log("bin/benthos is not built: the configs were not linted")
	}
}

// TestPartitionedStreams checks the stream argument of several partitions: each message goes to
// the partition flowrun's hash gives its key, and one stream stays one stream.
func TestPartitionedStreams(t *testing.T) {
	parts := partsOf(partitionStreams("in", 4))
	if len(parts) != 4 || parts[0] != fwStream("in") || parts[3] != "fb:{in:3}" {
		t.Fatalf("partitions %v", parts)
	}
	if s := partsOf(fwStream("in")); len(s) != 1 || s[0] != fwStream("in") {
		t.Errorf("one stream became %v", s)
	}
	buf := make([]byte, payloadSize)
	used := map[string]int{}
	for seq := range 1000 {
		putPayload(buf, 1, phaseFlat, seq)
		key := string(buf[keyOffset-1 : keyOffset+keyDigits])
		got := streamFor(parts, buf)
		if want := parts[redis.Partition(key, 4)]; got != want {
			t.Fatalf("key %s went to %s, want %s", key, got, want)
		}
		used[got]++
	}
	if len(used) != 4 {
		t.Errorf("1000 messages used %d of 4 partitions", len(used))
	}
}
