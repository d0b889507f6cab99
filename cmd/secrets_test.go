package cmd

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/flowrun/flowrun/internal/redistest"
)

// TestSecretsNeverShow runs a job whose http sink fails with an error that quotes a sensitive
// variable (the service echoes the request's token), on a Redis that needs a password, with debug
// logs in JSON, traces on the console, and then shows the dead letters: neither secret appears
// anywhere. (What a pipeline puts in its messages is data, delivered as it is: a secret written into
// a message is the pipeline's to keep out.)
func TestSecretsNeverShow(t *testing.T) {
	const token, password = "s3cr3t-t0ken-42", "redis-pa55word"
	svc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		http.Error(w, "refused "+r.Header.Get("Authorization")+" for "+r.URL.String()+" "+string(body), http.StatusBadRequest)
	}))
	defer svc.Close()
	srv := redistest.Start(t)
	// A user that needs a password (the default user stays open for the harness).
	if err := srv.Client(t).Do(testContext(t), "ACL", "SETUSER", "flow", "on", ">"+password, "~*", "&*", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	url := strings.Replace(srv.URL(), "redis://", "redis://flow:"+password+"@", 1)
	path, _ := testPipeline(t, `
variable "url" {}
variable "token" {
  sensitive = true
}
topic "in" {}
source "gen" {
  kind     = "generate"
  count    = 3
  output   = topic.in
  template = { n = index }
}
sink "hook" {
  kind    = "http"
  input   = topic.in
  url     = "${var.url}/hook?token=${var.token}"
  headers = { Authorization = "Bearer ${var.token}" }
}
`)
	common := []string{path, "--redis", url, "--var", "url=" + svc.URL}
	t.Setenv("FLOWRUN_VAR_token", token)

	var all strings.Builder
	record := func(code int, out, errOut string) int {
		all.WriteString(out)
		all.WriteString(errOut)
		return code
	}
	if code := record(runIn(t, "", append([]string{"run", "--until-drained", "--log-level", "debug", "--log-format", "json", "--trace", "stdout"}, common...)...)); code != ExitDeadLettered {
		t.Fatalf("run: exit %d\n%s", code, all.String())
	}
	record(runIn(t, "", append([]string{"dlq", "show", "--stage", "hook", "--all"}, common...)...))
	record(runIn(t, "", append([]string{"dlq", "list", "--stage", "hook", "--json"}, common...)...))
	record(runIn(t, "", append([]string{"inspect", "--json"}, common...)...))
	record(runIn(t, "", append([]string{"graph", "--format", "json"}, common[0], "--var", "url=x")...))
	record(runIn(t, "", "run", path, "--redis", strings.Replace(url, srv.Addr(), closedPort(t), 1)))

	out := all.String()
	for _, secret := range []string{token, password} {
		if strings.Contains(out, secret) {
			i := strings.Index(out, secret)
			t.Errorf("%q appears:\n...%s...", secret, out[max(0, i-300):min(len(out), i+100)])
		}
	}
	if !strings.Contains(out, "(sensitive)") || !strings.Contains(out, "400 Bad Request") {
		t.Errorf("the output does not show the redacted failure:\n%s", out)
	}
}
