package runtime_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/internal/redistest"
	"github.com/flowrun/flowrun/runtime"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// setUser runs ACL SETUSER on the server.
func setUser(t *testing.T, srv *redistest.Server, user string, rules ...string) {
	t.Helper()
	args := []any{"ACL", "SETUSER", user}
	for _, r := range rules {
		args = append(args, r)
	}
	if err := srv.Client(t).Do(context.Background(), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER %s: %v", user, err)
	}
}

func newRuntime(t *testing.T, admin *redis.Client, plan *flow.Plan, opts runtime.Options) *runtime.Runtime {
	t.Helper()
	opts.Redis = admin
	rt, err := runtime.New(plan, opts)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// ruleOf returns the rules of the ACL SETUSER command that grants what plan's run checks.
func ruleOf(t *testing.T, admin *redis.Client, plan *flow.Plan, opts runtime.Options) []string {
	t.Helper()
	return strings.Fields(runtime.AccessRule(newRuntime(t, admin, plan, opts)))[3:]
}

// exactRules returns ACL rules that allow each command of checks on its keys and nowhere else: a
// selector per set of keys that commands are checked on together, holding those commands. Keyless
// commands and what connecting sends are allowed at the root. The checks name one representative
// of the markers of effectively-once outputs (which carry the IDs of the inputs) and of the keys of
// offloaded payloads (which carry tokens): the selector covers all of that output's markers and
// payloads.
func exactRules(checks []redis.AccessCheck) []string {
	rules := []string{"+hello", "+client|setname", "+ping", "+info", "+client|id", "+client|unblock"}
	var order []string
	selectors := map[string][]string{}
	for _, c := range checks {
		rule := "+" + strings.ToLower(strings.Join(c.Args[:c.Words], "|"))
		if len(c.Keys) == 0 {
			rules = append(rules, rule)
			continue
		}
		var keys []string
		for _, k := range c.Keys {
			if i := strings.Index(k, ":dedup:"); i >= 0 {
				k = k[:i] + ":dedup:*"
			}
			if i := strings.Index(k, ":payload:"); i >= 0 {
				k = k[:i] + ":payload:*" // offloaded payloads' keys end in a token of their own
			}
			keys = append(keys, "~"+k)
		}
		id := strings.Join(keys, " ")
		if _, ok := selectors[id]; !ok {
			order = append(order, id)
		}
		selectors[id] = append(selectors[id], rule)
	}
	for _, id := range order {
		rules = append(rules, "("+id+" "+strings.Join(selectors[id], " ")+")")
	}
	return rules
}

// linesFile writes the file source's input: three lines.
func linesFile(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "lines.jsonl")
	writeFile(t, path, "{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n")
	return path
}

// A user allowed exactly what the start-up check checks, each command on its keys and nowhere
// else, runs the whole pipeline with no refusal in the server's ACL log: the check covers every
// command the run sends, on every key. A command or a key that the runtime starts to use and the
// check does not know fails here.
func TestTheAccessCheckCoversTheRun(t *testing.T) {
	srv := redistest.Start(t)
	admin := openURLs(t, srv.URL())
	ctx := context.Background()
	for _, delivery := range []string{"at_least_once", "effectively_once"} {
		t.Run(delivery, func(t *testing.T) {
			extIn, extOut := "ext-in:"+t.Name(), "ext-out:"+t.Name()
			for i := range 5 {
				if err := admin.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: extIn,
					Values: []any{"payload", `{"key":"e","seq":` + itoa(int64(100+i)) + `}`}}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			run := t.Name() + itoa(prefixes.Add(1)) // test.twice fails each run's messages afresh
			// The at-least-once run offloads every payload (offload_over 16B): its writes, reads,
			// dead letters and trims send what they send for offloaded payloads. The other keeps
			// payloads in their entries.
			offload := map[string]string{"at_least_once": "16B", "effectively_once": "64KiB"}[delivery]
			plan := buildTestdata(t, "access.hcl", "delivery="+delivery, "run="+run, "ext_in="+extIn, "ext_out="+extOut,
				"lines="+linesFile(t), "offload_over="+offload)
			// Trimming often, so that it has something to trim while the messages go through.
			opts := runtime.Options{RetryInPlaceUpTo: time.Millisecond, TrimInterval: 5 * time.Millisecond}
			user := "exact-" + delivery
			checks := runtime.AccessChecks(newRuntime(t, admin, plan, opts))
			setUser(t, srv, user, append([]string{"reset", "on", ">pw"}, exactRules(checks)...)...)
			if err := admin.Universal().Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
				t.Fatal(err)
			}
			j := runJob(t, openURLs(t, "redis://"+user+":pw@"+srv.Addr()), plan, opts)
			if log := refusals(t, admin); len(log) > 0 {
				t.Fatalf("refused during the run: %v", log)
			}
			if n := j.node(t, "echo"); n.Out != 3 {
				t.Errorf("echo: %+v, want the 3 lines of the file", n)
			}
			if n := j.node(t, "out"); n.In != 25 {
				t.Errorf("out: %+v, want 25 messages", n)
			}
			if n := j.node(t, "twice"); n.Retries == 0 {
				t.Errorf("twice retried nothing: %+v", n)
			}
			if n := j.node(t, "strict"); n.DeadLettered != 25 {
				t.Errorf("strict: %+v, want 25 dead letters", n)
			}
			// Keys k0, k1, k2 and e: the 21 others are duplicates, written to topic dupes.
			if n := j.node(t, "once"); n.Out != 25 || n.Duplicates != 21 {
				t.Errorf("once: %+v, want 25 out, 21 of them duplicates", n)
			}
			if n := j.node(t, "dupes_out"); n.In != 21 {
				t.Errorf("dupes_out: %+v, want the 21 duplicates", n)
			}
			if n, err := admin.Universal().XLen(ctx, extOut).Result(); err != nil || n != 25 {
				t.Errorf("%s holds %d entries (%v), want 25", extOut, n, err)
			}
		})
	}
}

// refusals returns the server's ACL log but for CONFIG GET, which the run may be refused: it only
// tells whether Redis may evict the state of stateful stages, and a run without it warns of nothing.
func refusals(t *testing.T, admin *redis.Client) []any {
	t.Helper()
	log, err := admin.Universal().Do(context.Background(), "ACL", "LOG").Slice()
	if err != nil {
		t.Fatal(err)
	}
	var refused []any
	for _, e := range log {
		if !strings.Contains(fmt.Sprint(e), "config|get") {
			refused = append(refused, e)
		}
	}
	return refused
}

// A user that may not do what the pipeline needs ends the run at start, before anything is read or
// written: no consumer group, no lease, no membership, the external stream untouched.
func TestRunFailsAtStartWithoutPermissions(t *testing.T) {
	srv := redistest.Start(t)
	admin := openURLs(t, srv.URL())
	ctx := context.Background()
	extIn, extOut := "ext-in:"+t.Name(), "ext-out:"+t.Name()
	if err := admin.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: extIn, Values: []any{"payload", `{"seq":1}`}}).Err(); err != nil {
		t.Fatal(err)
	}
	plan := buildTestdata(t, "access.hcl", "delivery=at_least_once", "run="+t.Name(), "ext_in="+extIn, "ext_out="+extOut,
		"lines="+linesFile(t))
	rule := ruleOf(t, admin, plan, runtime.Options{})
	without := func(drop string) []string {
		var out []string
		for _, r := range rule {
			if r != drop {
				out = append(out, r)
			}
		}
		return out
	}
	for _, tc := range []struct {
		user  string
		rules []string
		want  []string
	}{
		{"other-keys", []string{"~other:*", "+@all"}, []string{`"other-keys"`, "may not access the key " + plan.KeyPrefix + ":", "~" + plan.KeyPrefix + ":*"}},
		{"no-autoclaim", without("+xautoclaim"), []string{`"no-autoclaim"`, "may not run XAUTOCLAIM", "+xautoclaim"}},
		{"no-scripting", append(without("+eval"), "-@scripting"), []string{"may not run EVAL", "+eval +evalsha"}},
		{"no-external-stream", without("~" + extIn), []string{"may not access the key " + extIn, "source ext", "~" + extIn}},
	} {
		t.Run(tc.user, func(t *testing.T) {
			setUser(t, srv, tc.user, append([]string{"reset", "on", ">pw"}, tc.rules...)...)
			var log syncBuffer
			// The deadline only keeps a broken check from hanging the test: the run would retry.
			runCtx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			summary, err := runtime.Run(runCtx, plan, runtime.Options{
				Redis: openURLs(t, "redis://"+tc.user+":pw@"+srv.Addr()), UntilDrained: true, Logger: newLogger(&log),
				Stdin: strings.NewReader(""), Stdout: &log,
			})
			var ae *redis.AccessError
			if !errors.As(err, &ae) || summary != nil {
				t.Fatalf("want an *redis.AccessError and no summary, got %v, %v\n%s", err, summary, log.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error lacks %q: %v", w, err)
				}
			}
			if n, err := admin.Universal().Keys(ctx, plan.KeyPrefix+":*").Result(); err != nil || len(n) > 0 {
				t.Errorf("the run wrote keys: %v %v", n, err)
			}
			groups, err := admin.Universal().XInfoGroups(ctx, extIn).Result()
			if err != nil || len(groups) > 0 {
				t.Errorf("the external stream has groups %v (%v)", groups, err)
			}
			if n, _ := admin.Universal().Exists(ctx, extOut).Result(); n != 0 {
				t.Errorf("the run wrote %s", extOut)
			}
		})
	}
}

// A user whose permissions are taken away while the run goes on: the run ends naming the refused
// command, instead of retrying it forever, having written nothing of the batch and acked nothing.
// The ways a commit's transaction can be refused are tried: its XADD refused; its ack refused (a
// plain XACK, in a stateless commit fenced by WATCH); and, effectively once, its scripts refused.
// The last two leave the XADDs with only EXECABORT to say (the runtime then asks again what the
// start-up check asked). Last, the effectively-once script's XACK refused: Lua undoes nothing, so
// the script checks its commands before its first write (else the output would be written, the
// input left unacked, and a restarted run would write the output again).
func TestPermissionsTakenWhileRunningEndTheRun(t *testing.T) {
	for _, c := range []struct {
		name, delivery, revoke, want string
	}{
		{"xadd", "at_least_once", "-xadd", "xadd"},
		{"xack", "at_least_once", "-xack", "xack"},
		{"scripts", "effectively_once", "-@scripting", "eval"},
		{"xack in a script", "effectively_once", "-xack", "xack"},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Start(t)
			admin := openURLs(t, srv.URL())
			ctx := context.Background()
			plan := buildTestdata(t, "copy.hcl", "delivery="+c.delivery)
			setUser(t, srv, "app", "reset", "on", ">pw", "~*", "+@all")
			var log syncBuffer
			rt, err := runtime.New(plan, runtime.Options{Redis: openURLs(t, "redis://app:pw@"+srv.Addr()), Logger: newLogger(&log),
				Stdout: io.Discard})
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				_, err := rt.Run(deadline(t))
				done <- err
			}()
			keys := redis.Keys{Prefix: plan.KeyPrefix}
			waitFor(t, "the stage to read its input", func() bool {
				st, err := admin.StreamStats(ctx, keys.Stream("in", 0))
				return err == nil && len(st.Groups) == 1
			})
			setUser(t, srv, "app", c.revoke)
			if err := admin.Universal().XAdd(ctx, &goredis.XAddArgs{Stream: keys.Stream("in", 0), Values: []any{"payload", `{"n":1}`}}).Err(); err != nil {
				t.Fatal(err)
			}
			err = <-done
			if err == nil || !strings.Contains(strings.ToLower(err.Error()), c.want) ||
				!strings.Contains(err.Error(), "NOPERM") && !strings.Contains(err.Error(), "may not run") &&
					!strings.Contains(err.Error(), "can't run this command") {
				t.Fatalf("the run ended with %v, want the refused %s named\n%s", err, c.want, log.String())
			}
			if n, err := admin.StreamLen(ctx, keys.Stream("out", 0)); err != nil || n != 0 {
				t.Errorf("the stage wrote %d entries (%v) without permission", n, err)
			}
			if n, err := admin.Universal().XPending(ctx, keys.Stream("in", 0), "work").Result(); err != nil || n.Count != 1 {
				t.Errorf("the input's pending entries: %v, %v; want the one, unacked", n, err)
			}
		})
	}
}
