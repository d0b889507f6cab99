package redis

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/redistest"
)

// accessKeys is a unit of work of a test: a stream with its group, lease and retry set, and an
// output stream with a dedup marker.
type accessKeys struct {
	k                     Keys
	in, out, lease, retry string
	dedup, dlq            string
}

func newAccessKeys(k Keys) accessKeys {
	return accessKeys{
		k: k, in: k.Stream("in", 0), out: k.Stream("out", 1),
		lease: k.Lease("in", 0, "st"), retry: k.Retry("in", 0, "st"),
		dedup: k.Dedup("out", 1, "st", "in", 0, "1-1", 0), dlq: k.DeadLetter("st"),
	}
}

// everything lists every operation of the unit.
func (u accessKeys) everything() *Access {
	a := NewAccess(u.k)
	a.Members("process", a.keys.Members())
	a.Consume("stage st", u.in, "st")
	a.Settle("stage st", u.in, "st", u.retry, u.lease, StateKeys{}, []string{u.dedup}, []string{u.dlq})
	a.Lease("stage st", u.lease)
	a.Retries("stage st", u.retry)
	a.Output("stage st", u.out, u.dedup)
	a.Output("stage st", u.dlq, "")
	a.Produce("source src", u.out)
	a.Offload("source src", u.out)
	a.Fetch("stage st", u.in)
	a.Stats("stage st", u.in)
	a.Len("stage st", u.dlq)
	a.Trim("process", u.out)
	return a
}

// setUser creates (or adds to) an ACL user on the server.
func setUser(t *testing.T, srv *redistest.Server, user string, rules ...string) {
	t.Helper()
	args := []any{"ACL", "SETUSER", user}
	for _, r := range rules {
		args = append(args, r)
	}
	if err := srv.Client(t).Do(ctxT(t), args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER %s %v: %v", user, rules, err)
	}
}

func openAs(t *testing.T, srv *redistest.Server, user string) *Client {
	t.Helper()
	return openURLs(t, "redis://"+user+":pw@"+srv.Addr())
}

func accessError(t *testing.T, err error) *AccessError {
	t.Helper()
	var ae *AccessError
	if !errors.As(err, &ae) {
		t.Fatalf("want an *AccessError, got %v", err)
	}
	return ae
}

func TestCheckAccess(t *testing.T) {
	ctx := ctxT(t)
	srv := redistest.Start(t)
	u := newAccessKeys(testKeys(t))
	checks := u.everything().Checks()
	prefixRule := u.k.Prefix + ":*"

	setUser(t, srv, "all", "on", ">pw", "~"+prefixRule, "+@all")
	if err := openAs(t, srv, "all").CheckAccess(ctx, checks); err != nil {
		t.Fatalf("a user with every permission: %v", err)
	}

	for _, tc := range []struct {
		user    string
		rules   []string
		reason  AccessReason
		command string
		key     string // of an AccessKey failure
		grant   string // in the suggested rule
	}{
		{"other", []string{"~other:*", "+@all"}, AccessKey, "ZADD", u.k.Members(), "~" + prefixRule},
		{"noclaim", []string{"~*", "+@all", "-xautoclaim"}, AccessCommand, "XAUTOCLAIM", "", "+xautoclaim"},
		{"nocreate", []string{"~*", "+@all", "-xgroup|create"}, AccessCommand, "XGROUP CREATE", "", "+xgroup|create"},
		{"readonly", []string{"%R~*", "+@all"}, AccessKey, "ZADD", u.k.Members(), "~" + prefixRule},
		{"nomulti", []string{"~*", "+@all", "-multi"}, AccessCommand, "MULTI", "", "+multi"},
		{"noset", []string{"~*", "+@all", "-set"}, AccessCommand, "SET", "", "+set"},
		// Other keys and a command missing: both are granted at once.
		{"otherandnoclaim", []string{"~other:*", "+@all", "-xautoclaim"}, AccessKey, "ZADD", u.k.Members(), "+xautoclaim"},
		{"nostreams", []string{"~" + prefixRule, "+@all", "-@stream"}, AccessCommand, "XGROUP CREATE", "", "+xack +xadd +xautoclaim"},
		// Without EVAL, the probe itself is refused: it names EVAL.
		{"noeval", []string{"~*", "+@all", "-eval"}, AccessCommand, "EVAL", "", "+eval +evalsha"},
		{"noscripting", []string{"~*", "+@all", "-@scripting"}, AccessCommand, "EVAL", "", "+eval +evalsha"},
	} {
		t.Run(tc.user, func(t *testing.T) {
			setUser(t, srv, tc.user, append([]string{"on", ">pw"}, tc.rules...)...)
			c := openAs(t, srv, tc.user)
			ae := accessError(t, c.CheckAccess(ctx, checks))
			if ae.Reason != tc.reason || ae.Check.Command() != tc.command || ae.User != tc.user ||
				tc.reason == AccessKey && ae.Key != tc.key {
				t.Fatalf("got reason %d, command %s, key %q, user %q; want %d, %s, %q, %q: %v",
					ae.Reason, ae.Check.Command(), ae.Key, ae.User, tc.reason, tc.command, tc.key, tc.user, ae)
			}
			msg := ae.Error()
			for _, want := range []string{`"` + tc.user + `"`, tc.command, tc.key, "ACL SETUSER " + tc.user + " ", tc.grant} {
				if !strings.Contains(msg, want) {
					t.Errorf("the message lacks %q: %s", want, msg)
				}
			}
			if strings.Contains(msg, "\n") {
				t.Errorf("more than one line: %s", msg)
			}
			// The suggested rule, applied to the user as it is, grants everything.
			setUser(t, srv, tc.user, strings.Fields(ae.Rule)[3:]...)
			if err := c.CheckAccess(ctx, checks); err != nil {
				t.Fatalf("after %s: %v", ae.Rule, err)
			}
		})
	}

	// The rule alone is enough for a user that had nothing.
	setUser(t, srv, "fresh", "on", ">pw")
	rule := openAs(t, srv, "all").AccessRule(checks)
	setUser(t, srv, "fresh", strings.Fields(rule)[3:]...)
	if err := openAs(t, srv, "fresh").CheckAccess(ctx, checks); err != nil {
		t.Fatalf("a user with only %s: %v", rule, err)
	}
	// A password alone logs in as the default user.
	if got := openURLs(t, srv.URL()).User(); got != "default" {
		t.Errorf("User() = %q, want default", got)
	}
}

func TestCheckAccessUnknownCommand(t *testing.T) {
	ctx := ctxT(t)
	srv := redistest.Start(t, redistest.WithArgs("--rename-command", "XAUTOCLAIM", ""))
	u := newAccessKeys(testKeys(t))
	ae := accessError(t, openURLs(t, srv.URL()).CheckAccess(ctx, u.everything().Checks()))
	if ae.Reason != AccessUnknownCommand || ae.Check.Command() != "XAUTOCLAIM" ||
		!strings.Contains(ae.Error(), "does not know the command XAUTOCLAIM") || strings.Contains(ae.Error(), "ACL SETUSER") {
		t.Fatalf("got %v", ae)
	}
}

func TestCheckAccessWithoutScripting(t *testing.T) {
	ctx := ctxT(t)
	srv := redistest.Start(t, redistest.WithArgs("--rename-command", "EVAL", ""))
	u := newAccessKeys(testKeys(t))
	ae := accessError(t, openURLs(t, srv.URL()).CheckAccess(ctx, u.everything().Checks()))
	if ae.Reason != AccessUnknownCommand || ae.Check.Command() != "EVAL" {
		t.Fatalf("got %v", ae)
	}
}

func TestCheckAccessOnMiniredis(t *testing.T) {
	c := miniredisBackend().open(t)
	err := c.CheckAccess(ctxT(t), newAccessKeys(testKeys(t)).everything().Checks())
	if !errors.Is(err, ErrAccessUnchecked) {
		t.Fatalf("miniredis: %v, want ErrAccessUnchecked", err)
	}
}

func TestAccessRuleEscapesPatterns(t *testing.T) {
	a := NewAccess(Keys{Prefix: "a*b"})
	a.Produce("source s", "a*b:{t:0}")
	a.Produce("source s", "ext[1]")
	a.Produce("source s", "a*b:{t:1}")
	c := &Client{user: "app one"}
	if got, want := c.AccessRule(a.Checks()), `ACL SETUSER "app one" ~a\*b:* ~ext\[1\] +hello +client|setname +ping +info +client|id +client|unblock +xadd`; got != want {
		t.Errorf("AccessRule = %s\nwant          %s", got, want)
	}
}

// Each Access method lists every command its Client operations send: a user allowed exactly
// those (and nothing else) runs them without a refusal. A command added to an operation but not
// to its Access method fails here.
func TestAccessCoversTheOperations(t *testing.T) {
	ctx := ctxT(t)
	srv := redistest.Start(t)
	admin := openURLs(t, srv.URL())
	u := newAccessKeys(testKeys(t))
	only := func(t *testing.T, name string, add func(a *Access)) *Client {
		t.Helper()
		a := NewAccess(u.k)
		add(a)
		user := "only-" + name
		setUser(t, srv, user, append([]string{"reset", "on", ">pw"}, strings.Fields(admin.AccessRule(a.Checks()))[3:]...)...)
		if err := srv.Client(t).Do(ctx, "ACL", "LOG", "RESET").Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			log, err := srv.Client(t).Do(ctx, "ACL", "LOG").Slice()
			if err != nil || len(log) > 0 {
				t.Errorf("%s: ACL LOG: %v %v", name, log, err)
			}
		})
		return openAs(t, srv, user)
	}
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	entry := Entry{Payload: []byte(`{"n":1}`)}

	t.Run("consume and settle", func(t *testing.T) {
		c := only(t, "consume", func(a *Access) {
			a.Consume("stage st", u.in, "st")
			a.Settle("stage st", u.in, "st", u.retry, u.lease, StateKeys{}, []string{u.dedup}, []string{u.dlq})
			a.Settle("stage plain", u.in, "plain", "", "", StateKeys{}, nil, nil)
			a.Lease("stage st", u.lease)
			a.Retries("stage st", u.retry)
			a.Output("stage st", u.out, u.dedup)
			a.Output("stage st", u.dlq, "")
		})
		must(t, c.EnsureGroupAt(ctx, u.in, "st", "0"))
		must(t, c.EnsureGroupAt(ctx, u.in, "plain", "0"))
		for range 3 {
			must(t, admin.Universal().XAdd(ctx, xaddArgs(u.in, entry)).Err())
		}
		// Entries delivered to another consumer, for Reclaim to take over.
		_, err := c.ReadGroup(ctx, ReadArgs{Stream: u.in, Group: "st", Consumer: "gone", Count: 2, Block: -1})
		must(t, err)
		waitFor(t, "pending entries to be idle", func() bool {
			res, err := c.Reclaim(ctx, ReclaimArgs{Stream: u.in, Group: "st", Consumer: "me", MinIdle: time.Millisecond})
			must(t, err)
			return len(res.Entries) > 0
		})
		b, err := c.ReadGroup(ctx, ReadArgs{Stream: u.in, Group: "st", Consumer: "me", Count: 10, Block: time.Millisecond})
		must(t, err)
		_, err = c.ReadPending(ctx, ReadArgs{Stream: u.in, Group: "st", Consumer: "me", Count: 10}, "")
		must(t, err)
		lease, ok, err := c.AcquireLease(ctx, u.lease, "me", time.Minute)
		must(t, err)
		if !ok {
			t.Fatal("lease not taken")
		}
		must(t, c.RenewLease(ctx, lease, time.Minute))
		retry := Retry{Entry: Entry{ID: "1-1", Payload: []byte(`{}`)}, Attempts: 1, FirstFailure: time.Now(), Due: time.Now()}
		_, err = c.Commit(ctx, CommitArgs{
			Outputs: []Output{{Stream: u.out, Entry: entry, DedupKey: u.dedup}, {Stream: u.dlq, Entry: entry}},
			Stream:  u.in, Group: "st", IDs: b.IDs(), Lease: &lease, RetryKey: u.retry, Retries: []Retry{retry},
		})
		must(t, err)
		due, _, err := c.ClaimRetries(ctx, u.retry, time.Now().Add(time.Second), 10, time.Minute)
		must(t, err)
		if len(due) != 1 {
			t.Fatalf("due retries: %v", due)
		}
		_, _, err = c.NextRetry(ctx, u.retry)
		must(t, err)
		_, err = c.ScheduledRetries(ctx, u.retry)
		must(t, err)
		_, err = c.Commit(ctx, CommitArgs{Stream: u.in, Group: "st", Lease: &lease, RetryKey: u.retry, RetryDone: due})
		must(t, err)
		pb, err := c.ReadGroup(ctx, ReadArgs{Stream: u.in, Group: "plain", Consumer: "me", Count: 10, Block: -1})
		must(t, err)
		must(t, c.Ack(ctx, u.in, "plain", nil, pb.IDs()...))
		_, err = c.DeleteIdleConsumer(ctx, u.in, "st", "gone")
		must(t, err)
		must(t, c.ReleaseLease(ctx, lease))
	})

	t.Run("members", func(t *testing.T) {
		c := only(t, "members", func(a *Access) { a.Members("process", u.k.Members()) })
		_, err := c.Heartbeat(ctx, []string{u.k.Members()}, "me", time.Minute)
		must(t, err)
		must(t, c.Leave(ctx, []string{u.k.Members()}, "me"))
	})

	t.Run("produce", func(t *testing.T) {
		c := only(t, "produce", func(a *Access) { a.Produce("source src", u.out) })
		p, err := c.NewProducer(ProducerOptions{})
		must(t, err)
		must(t, p.Add(ctx, u.out, entry))
		must(t, p.Close(ctx))
	})

	t.Run("stats and trim", func(t *testing.T) {
		s := u.k.Stream("trimmed", 0)
		for range 5 {
			must(t, admin.Universal().XAdd(ctx, xaddArgs(s, entry)).Err())
		}
		must(t, admin.EnsureGroup(ctx, s, "g"))
		_, err := admin.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "c", Count: 2, Block: -1})
		must(t, err)
		c := only(t, "stats", func(a *Access) {
			a.Stats("stage st", s)
			a.Len("stage st", u.dlq)
			a.Trim("process", s)
		})
		_, err = c.StreamStats(ctx, s)
		must(t, err)
		_, err = c.StreamLen(ctx, u.dlq)
		must(t, err)
		_, err = c.Trim(ctx, s, Retention{MaxLen: 1}, time.Now())
		must(t, err)
		_, err = c.Trim(ctx, s, Retention{MaxAge: time.Hour}, time.Now())
		must(t, err)
	})

	t.Run("offload", func(t *testing.T) {
		s := u.k.Stream("big", 0)
		c := only(t, "offload", func(a *Access) {
			a.Consume("stage st", s, "g")
			a.Fetch("stage st", s)
			a.Settle("stage st", s, "g", "", "", StateKeys{}, nil, nil)
			a.Output("stage st", s, "")
			a.Offload("stage st", s)
			a.Produce("source src", s)
			a.Trim("stage st", s)
		}).WithOffloadOver(1 << 10)
		must(t, c.EnsureGroup(ctx, s, "g"))
		big := Entry{Payload: bigPayload("a", 2<<10)}
		_, err := c.Commit(ctx, CommitArgs{Outputs: []Output{{Stream: s, Entry: big}}})
		must(t, err)
		p, err := c.NewProducer(ProducerOptions{})
		must(t, err)
		must(t, p.Add(ctx, s, big))
		must(t, p.Close(ctx))
		b, err := c.ReadGroup(ctx, ReadArgs{Stream: s, Group: "g", Consumer: "me", Block: -1})
		must(t, err)
		if len(b.Entries) != 2 || string(b.Entries[1].Payload) != string(big.Payload) {
			t.Fatalf("read %d entries, %d malformed", len(b.Entries), len(b.Malformed))
		}
		must(t, c.Ack(ctx, s, "g", nil, b.IDs()...))
		_, err = c.Trim(ctx, s, Retention{MaxLen: 1}, time.Now())
		must(t, err)
	})
	// A large changed payload is staged (SET, SETRANGE) and renamed by the commit's script, which
	// checks it first (EXISTS); the settle checks the payload key and the markers with EXISTS too,
	// and a marker found deletes a staging key that is not needed.
	t.Run("staged offload", func(t *testing.T) {
		in, s := u.k.Stream("stagedin", 0), u.k.Stream("staged", 0)
		dedup := u.k.Dedup("staged", 0, "st", "stagedin", 0, "1-1", 0)
		c := only(t, "staged", func(a *Access) {
			a.Consume("stage st", in, "g")
			a.Settle("stage st", in, "g", "", "", StateKeys{}, []string{dedup}, []string{s})
			a.Output("stage st", s, "")
			a.Output("stage st", s, dedup)
			a.Offload("stage st", s)
			a.Fetch("stage st", s)
		}).WithOffloadOver(1 << 10)
		must(t, c.EnsureGroupAt(ctx, in, "g", "0"))
		for range 2 {
			must(t, admin.Universal().XAdd(ctx, xaddArgs(in, entry)).Err())
		}
		b, err := c.ReadGroup(ctx, ReadArgs{Stream: in, Group: "g", Consumer: "me", Count: 2, Block: -1})
		must(t, err)
		if b.Len() != 2 {
			t.Fatalf("read %d entries", b.Len())
		}
		big := bigPayload("staged", 4<<10)
		large := func() Entry { return Entry{Large: largeOf(big, 1000, nil)} }
		_, err = c.Commit(ctx, CommitArgs{Outputs: []Output{{Stream: s, Entry: large()}}, Stream: in, Group: "g", IDs: b.IDs()[:1]})
		must(t, err)
		once := CommitArgs{Outputs: []Output{{Stream: s, Entry: large(), DedupKey: dedup}}, Stream: in, Group: "g", IDs: b.IDs()[1:]}
		_, err = c.Commit(ctx, once)
		must(t, err)
		_, err = c.Commit(ctx, once) // the marker is found: the staging key is deleted
		must(t, err)
		recs, err := admin.Read(ctx, s, "0", 0, 0)
		must(t, err)
		if len(recs) != 2 || !bytes.Equal(recs[0].Payload, big) || !bytes.Equal(recs[1].Payload, big) {
			t.Fatalf("read %d records", len(recs))
		}
	})
}

func xaddArgs(stream string, e Entry) *goredis.XAddArgs {
	values, err := EncodeEntry(e)
	if err != nil {
		panic(err)
	}
	return &goredis.XAddArgs{Stream: stream, Values: values}
}

// On a cluster the check runs on one node, for keys of every slot.
func TestCheckAccessOnACluster(t *testing.T) {
	c := clusterBackend().open(t)
	if err := c.CheckAccess(ctxT(t), newAccessKeys(testKeys(t)).everything().Checks()); err != nil {
		t.Fatal(err)
	}
	if rule := c.AccessRule(nil); !strings.Contains(rule, "+cluster|slots") {
		t.Errorf("the rule of a cluster lacks CLUSTER SLOTS: %s", rule)
	}
}
