package cmd

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/flowrun/flowrun/internal/redistest"
)

// TestDeadLettersListShowReplayPurge fails deliveries to a service that is down, then, with the
// service back, replays the dead letters to the sink alone and purges them.
func TestDeadLettersListShowReplayPurge(t *testing.T) {
	var up atomic.Bool
	var delivered atomic.Int64
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !up.Load() {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return
		}
		delivered.Add(1)
	}))
	defer svc.Close()
	path, _ := testPipeline(t, `
variable "url" {}
retry "once" {
  max_attempts = 1
}
topic "in" {
  partitions = 2
  key        = msg.id
}
sink "hook" {
  kind  = "http"
  input = topic.in
  url   = var.url
  retry = retry.once
}
`)
	url := redistest.Shared(t).URL()
	common := []string{path, "--redis", url, "--var", "url=" + svc.URL}
	dlq := func(args ...string) (int, string, string) {
		return runIn(t, "", append(append([]string{"dlq"}, args...), common...)...)
	}

	if code, _, errOut := runIn(t, `{"id":1}`+"\n"+`{"id":2}`+"\n"+`{"id":3}`+"\n", append([]string{"produce"}, append(common, "in")...)...); code != 0 {
		t.Fatalf("produce: exit %d\n%s", code, errOut)
	}
	if code, _, errOut := runIn(t, "", append([]string{"run", "--until-drained"}, common...)...); code != ExitDeadLettered {
		t.Fatalf("first run: exit %d, want %d\n%s", code, ExitDeadLettered, errOut)
	}

	code, out, errOut := dlq("list", "--stage", "hook")
	if code != 0 || !strings.Contains(out, "3 dead letters") || strings.Count(out, "503 Service Unavailable") != 3 {
		t.Fatalf("list: exit %d\n%s%s", code, out, errOut)
	}
	code, out, _ = dlq("list", "--stage", "hook", "--json")
	var list []struct {
		ID       string `json:"id"`
		Envelope struct {
			Attempts int             `json:"attempts"`
			Error    string          `json:"error"`
			Payload  json.RawMessage `json:"payload"`
		} `json:"envelope"`
	}
	if err := json.Unmarshal([]byte(out), &list); code != 0 || err != nil || len(list) != 3 {
		t.Fatalf("list --json: exit %d, %v\n%s", code, err, out)
	}
	code, out, _ = dlq("show", "--stage", "hook", "--id", list[0].ID)
	if code != 0 || !strings.Contains(out, `"attempts": 1`) || !strings.Contains(out, "down for maintenance") {
		t.Fatalf("show: exit %d\n%s", code, out)
	}

	up.Store(true)
	if code, out, errOut := dlq("replay", "--stage", "hook", "--all"); code != 0 || !strings.Contains(out, "replayed 3 dead letters to hook") {
		t.Fatalf("replay: exit %d\n%s%s", code, out, errOut)
	}
	if code, _, errOut := runIn(t, "", append([]string{"run", "--until-drained"}, common...)...); code != 0 {
		t.Fatalf("second run: exit %d\n%s", code, errOut)
	}
	if delivered.Load() != 3 {
		t.Fatalf("%d deliveries after the replay, want 3", delivered.Load())
	}
	var after []struct {
		ReplayedAt string `json:"replayed_at"`
	}
	_, out, _ = dlq("list", "--stage", "hook", "--json")
	if err := json.Unmarshal([]byte(out), &after); err != nil || len(after) != 3 {
		t.Fatalf("list --json after the replay: %v\n%s", err, out)
	}
	for _, d := range after {
		if d.ReplayedAt == "" {
			t.Errorf("a replayed dead letter is not marked: %s", out)
		}
	}
	if code, out, _ := dlq("replay", "--stage", "hook", "--all"); code != 0 || !strings.Contains(out, "replayed 0") {
		t.Fatalf("replay --all replays only what was not replayed yet: exit %d\n%s", code, out)
	}

	if code, out, _ := dlq("purge", "--stage", "hook", "--id", list[0].ID); code != 0 || !strings.Contains(out, "purged 1 dead letter") {
		t.Fatalf("purge --id: exit %d\n%s", code, out)
	}
	if code, out, _ := dlq("purge", "--stage", "hook", "--all"); code != 0 || !strings.Contains(out, "purged 2 dead letters") {
		t.Fatalf("purge --all: exit %d\n%s", code, out)
	}
	if code, out, _ := dlq("list", "--stage", "hook"); code != 0 || !strings.Contains(out, "no dead letters") {
		t.Fatalf("list after purge: exit %d\n%s", code, out)
	}
}

func TestDeadLetterCommandErrors(t *testing.T) {
	path, _ := testPipeline(t, ordersPipeline)
	url := redistest.Shared(t).URL()
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"dlq", "list", path, "--redis", url}, ExitInvalid, `required flag(s) "stage" not set`},
		{[]string{"dlq", "list", path, "--redis", url, "--stage", "enrch"}, ExitInvalid, `has no source, stage or sink "enrch"`},
		{[]string{"dlq", "replay", path, "--redis", url, "--stage", "enrich"}, ExitInvalid, "--id ID (repeatable) or --all"},
		{[]string{"dlq", "show", path, "--redis", url, "--stage", "enrich", "--id", "1-0"}, ExitError, "has no dead letter 1-0"},
		{[]string{"dlq", "list", path, "--stage", "enrich"}, ExitError, "no Redis configured"},
	}
	t.Setenv(EnvRedisURL, "")
	for _, tc := range cases {
		code, _, errOut := runIn(t, "", tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, want %d with %q\n%s", tc.args, code, tc.code, tc.want, errOut)
		}
	}
}

// replay --set fixes each payload on the way back; a dead letter that the fix fails for stays a
// dead letter, with the reason, and is not replayed.
func TestDeadLettersReplayWithSet(t *testing.T) {
	path, _ := testPipeline(t, `
retry "once" {
  max_attempts = 1
}
topic "in" {
  partitions = 2
  key        = msg.id
}
topic "out" { partitions = 1 }
stage "price" {
  kind   = "map"
  input  = topic.in
  output = topic.out
  retry  = retry.once
  set    = { total = msg.amount * 2 }
}
`)
	t.Setenv(EnvRedisURL, redistest.Shared(t).URL())
	// run runs a command on the pipeline: cmd, then the path, then args.
	run := func(stdin string, cmd []string, args ...string) (int, string, string) {
		return runIn(t, stdin, append(append(cmd, path), args...)...)
	}
	if code, _, errOut := run(`{"id":1,"amount_text":"12"}`+"\n"+`{"id":2,"amount_text":"twelve"}`+"\n", []string{"produce"}, "in"); code != 0 {
		t.Fatalf("produce: exit %d\n%s", code, errOut)
	}
	if code, _, errOut := run("", []string{"run", "--until-drained"}); code != ExitDeadLettered {
		t.Fatalf("first run: exit %d, want %d\n%s", code, ExitDeadLettered, errOut)
	}
	type deadLetter struct {
		ID         string `json:"id"`
		ReplayedAt string `json:"replayed_at"`
		Envelope   struct {
			Payload json.RawMessage `json:"payload"`
		} `json:"envelope"`
	}
	list := func() map[string]deadLetter { // by the message's id
		_, out, _ := run("", []string{"dlq", "list"}, "--stage", "price", "--json")
		var l []deadLetter
		if err := json.Unmarshal([]byte(out), &l); err != nil || len(l) != 2 {
			t.Fatalf("list --json: %v\n%s", err, out)
		}
		byID := map[string]deadLetter{}
		for _, d := range l {
			var p struct{ ID json.Number }
			_ = json.Unmarshal(d.Envelope.Payload, &p)
			byID[p.ID.String()] = d
		}
		return byID
	}
	before := list()

	// Invalid edits are refused before anything is replayed.
	for set, want := range map[string]string{
		"msg.amount == 1":        "does not say which field to set: write msg.FIELD = EXPR",
		"amount = 1":             "does not say which field to set",
		"msg.amount = nosuch(1)": `on --set msg.amount line 1`,
	} {
		if code, _, errOut := run("", []string{"dlq", "replay"}, "--stage", "price", "--all", "--set", set); code != ExitInvalid || !strings.Contains(errOut, want) {
			t.Errorf("--set %q: exit %d, want %d with %q\n%s", set, code, ExitInvalid, want, errOut)
		}
	}

	code, out, errOut := run("", []string{"dlq", "replay"}, "--stage", "price", "--all",
		"--set", "msg.amount = tonumber(msg.amount_text)", "--set", "msg.fixed.by = \"replay\"")
	if code != ExitError || !strings.Contains(out, "replayed 1 dead letter to price") ||
		!strings.Contains(errOut, before["2"].ID+": not replayed: --set msg.amount = tonumber(msg.amount_text): ") {
		t.Fatalf("replay --set: exit %d\n%s%s", code, out, errOut)
	}
	after := list()
	if after["1"].ReplayedAt == "" || after["2"].ReplayedAt != "" {
		t.Fatalf("replayed marks: 1 %q, 2 %q; want only 1 marked", after["1"].ReplayedAt, after["2"].ReplayedAt)
	}
	if string(after["1"].Envelope.Payload) != string(before["1"].Envelope.Payload) {
		t.Fatalf("the dead letter's payload changed: %s, was %s", after["1"].Envelope.Payload, before["1"].Envelope.Payload)
	}

	if code, _, errOut := run("", []string{"run", "--until-drained"}); code != ExitOK {
		t.Fatalf("second run: exit %d\n%s", code, errOut)
	}
	_, out, _ = run("", []string{"tail"}, "out")
	lines := parseTail(t, out)
	if len(lines) != 1 {
		t.Fatalf("out holds %d messages, want the fixed one:\n%s", len(lines), out)
	}
	var got map[string]any
	if err := json.Unmarshal(lines[0].Payload, &got); err != nil || got["total"] != 24.0 || got["amount"] != 12.0 ||
		got["amount_text"] != "12" || got["fixed"].(map[string]any)["by"] != "replay" {
		t.Fatalf("the replayed message: %s", lines[0].Payload)
	}
}
