package cmd

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/internal/redistest"
)

// The exit status of flowrun run tells a job's outcome: 0 done, 1 runtime error, 2 invalid pipeline
// or options, 3 done with dead letters.

func TestRunJobExitsZeroWithASummary(t *testing.T) {
	path, _ := testPipeline(t, `
topic "t" { partitions = 2 }
source "gen" {
  kind     = "generate"
  count    = 5
  output   = topic.t
  template = { n = index }
}
sink "out" {
  kind  = "stdout"
  input = topic.t
}
`)
	code, out, errOut := runIn(t, "", "run", path, "--until-drained", "--redis", redistest.Shared(t).URL())
	if code != ExitOK {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	if n := strings.Count(out, "\n"); n != 5 {
		t.Errorf("%d lines on stdout, want 5:\n%s", n, out)
	}
	for _, want := range []string{"source.gen", "sink.out", "elapsed", "0 dead-lettered"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("the summary lacks %q:\n%s", want, errOut)
		}
	}
}

func TestRunJobWithDeadLettersExitsThree(t *testing.T) {
	ledger := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer ledger.Close()
	code, _, errOut := runIn(t, "", "run", filepath.Join(examples, "retries"), "--until-drained",
		"--redis", redistest.Shared(t).URL(), "--var", "ledger_url="+ledger.URL)
	if code != ExitDeadLettered || !strings.Contains(errOut, "3 messages dead-lettered") {
		t.Fatalf("exit %d, want %d\n%s", code, ExitDeadLettered, errOut)
	}
}

func TestRunOnTheEmbeddedRedis(t *testing.T) {
	t.Setenv(EnvRedisURL, "")
	code, out, errOut := runIn(t, "", "run", filepath.Join(examples, "greetings.hcl.json"), "--until-drained")
	if code != ExitOK {
		t.Fatalf("exit %d\n%s", code, errOut)
	}
	if !strings.Contains(errOut, "embedded in-memory Redis") || strings.Count(out, "Hello,") != 4 {
		t.Fatalf("stdout:\n%s\nstderr:\n%s", out, errOut)
	}
}

func TestRunRefusesBadInput(t *testing.T) {
	endless, _ := testPipeline(t, `
topic "t" {}
source "gen" {
  kind     = "generate"
  output   = topic.t
  template = { n = index }
}
sink "out" {
  kind  = "stdout"
  input = topic.t
}
`)
	url := redistest.Shared(t).URL()
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run", endless, "--until-drained", "--redis", url}, ExitInvalid, `source "gen" never ends`},
		{[]string{"run", endless, "--stages", "gen,nope", "--redis", url}, ExitInvalid, `has no source, stage or sink "nope"`},
		{[]string{"run", writePipeline(t, broken), "--redis", url}, ExitInvalid, "partitions must be at least 1"},
		{[]string{"run", endless, "--log-level", "loud", "--redis", url}, ExitInvalid, "invalid --log-level"},
		{[]string{"run", endless, "--redis", "redis://:s3cret@" + closedPort(t)}, ExitError, "connection refused"},
	}
	for _, tc := range cases {
		code, _, errOut := runIn(t, "", tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, want %d with %q\n%s", tc.args, code, tc.code, tc.want, errOut)
		}
		if strings.Contains(errOut, "s3cret") {
			t.Errorf("%v: the password shows:\n%s", tc.args, errOut)
		}
	}
}
