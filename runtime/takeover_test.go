package runtime_test

import (
	"context"
	"fmt"
	goruntime "runtime"
	"slices"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/flowrun/flowrun/internal/embedded"
	"github.com/flowrun/flowrun/runtime"
	"github.com/flowrun/flowrun/runtime/flowtest"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestSurvivorsTakeOverAsTheLeasesLapse: three processes share a pipeline of 9 units (a stage on 5
// partitions, a sink on 4) on a virtual clock, over an embedded Redis whose time follows it, so
// that leases and memberships lapse in virtual time, and time stands still while the processes
// work. The processes start a third of a step apart, so that their steps never coincide. Then the
// process holding the most units dies: Redis refuses its every command from then on, so that it
// renews nothing and releases nothing, as after SIGKILL.
//
// The survivors must own every unit it held as soon as its last lease and its membership have
// lapsed, in the steps that the lapse itself brings forward: not at their next regular steps, a
// third of a step later or more (the first of which, on the old logic, still counted the dead
// member and took only part of its units). That is what keeps a takeover near one lease TTL. The
// clock moves from one timer to the next only when every process is idle, so "as soon as" is the
// first instant the clock stops at after the lapse; the 10ms allowed are the lapse's margin, far
// below the third of a step (333ms) to any regular step.
func TestSurvivorsTakeOverAsTheLeasesLapse(t *testing.T) {
	const ttl = 5 * time.Second
	const step = ttl / 5 // the runtime's step: a fifth of the lease TTL
	ctx := context.Background()
	clock := flowtest.NewClock(flowtest.Epoch)
	server, err := embedded.StartAt(flowtest.Epoch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(server.Close)
	plan := buildSource(t, `
pipeline "takeover" {}
topic "in" {
  partitions = 5
}
topic "mid" {
  partitions = 4
}
stage "a" {
  kind   = "map"
  input  = topic.in
  output = topic.mid
}
sink "c" {
  kind  = "stdout"
  input = topic.mid
}
`)
	keys := redis.Keys{Prefix: plan.KeyPrefix}
	var units []string
	for p := range 5 {
		units = append(units, keys.Lease("in", p, "a"))
	}
	for p := range 4 {
		units = append(units, keys.Lease("mid", p, "c"))
	}
	look := openURLs(t, server.URL()) // the test's own connection: never refused, not clocked

	type process struct {
		id       string
		c        *redis.Client
		activity *runtime.Activity
		run      *bgRun
		killed   *injector
	}
	var procs []*process
	start := func(id string) {
		c := openURLs(t, server.URL()).WithClockedReads()
		p := &process{id: id, c: c, activity: &runtime.Activity{}}
		p.killed = inject(c, errInjected, func(goredis.Cmder) bool { return true })
		p.run = runInBackground(t, plan, runtime.Options{
			Redis: c, Clock: clock, ProcessID: id, LeaseTTL: ttl, Activity: p.activity,
			Block: time.Hour, RetryPoll: time.Hour, PollInterval: time.Hour, SampleInterval: time.Hour, TrimInterval: time.Hour,
		})
		procs = append(procs, p)
	}

	// idle waits until no process is at work, no command is in flight and no timer fired unread,
	// for a few looks in a row (as driveWhenIdle).
	idle := func() {
		var last uint64
		for still := 0; still < 4; {
			goruntime.Gosched()
			time.Sleep(10 * time.Microsecond)
			busy := clock.Undelivered(50 * time.Millisecond)
			for _, p := range procs {
				busy = busy || p.activity.Working() > 0 || p.c.InFlight() > 0
			}
			if changes := clock.Changes(); busy || changes != last {
				last, still = changes, 0
				continue
			}
			still++
		}
	}
	// advanceTo moves the clock on from timer to timer, letting the processes work at each, up to
	// at. Redis's time moves first, so that what a timer wakes finds the leases of its instant.
	advanceTo := func(at time.Time) {
		for {
			idle()
			next, ok := clock.Next()
			if !ok || next.After(at) {
				next = at
			}
			server.SetTime(next)
			clock.AdvanceTo(next)
			idle()
			if !next.Before(at) {
				return
			}
		}
	}
	owners := func() []string {
		out := make([]string, len(units))
		for i, k := range units {
			l, _, held, err := look.LeaseHolder(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if held {
				out[i] = l.Owner
			}
		}
		return out
	}
	holdings := func() map[string]int {
		n := map[string]int{}
		for _, o := range owners() {
			n[o]++
		}
		return n
	}

	for i := range 3 {
		start(fmt.Sprintf("p%d", i+1))
		advanceTo(clock.Now().Add(step / 3))
	}
	// Two lease periods: the newest process has its share, and every process has renewed its
	// leases a few times since.
	advanceTo(clock.Now().Add(2 * ttl))
	shared := holdings()
	if shared[""] != 0 || len(shared) != 3 {
		t.Fatalf("the three processes hold %v of the %d units, want every unit held and each holding some", shared, len(units))
	}

	victim := procs[0]
	for _, p := range procs {
		if shared[p.id] > shared[victim.id] {
			victim = p
		}
	}
	var held []int
	for i, o := range owners() {
		if o == victim.id {
			held = append(held, i)
		}
	}
	victim.killed.arm(1 << 62)
	killed := clock.Now()
	// The lapse: the later of its membership's expiry and its last lease's.
	lapse := killed
	members, err := look.Members(ctx, keys.Members())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range members {
		if m.ID == victim.id && m.Expires.After(lapse) {
			lapse = m.Expires
		}
	}
	for _, u := range held {
		_, left, _, err := look.LeaseHolder(ctx, units[u])
		if err != nil {
			t.Fatal(err)
		}
		lapse = latest(lapse, killed.Add(left))
	}
	if !lapse.After(killed) {
		t.Fatalf("the victim %s holds nothing that lapses: membership %v, units %v", victim.id, members, held)
	}

	survivors := slices.DeleteFunc(slices.Clone(procs), func(p *process) bool { return p == victim })
	ownedBySurvivors := func() bool {
		now := owners()
		for _, u := range held {
			if !slices.ContainsFunc(survivors, func(p *process) bool { return p.id == now[u] }) {
				return false
			}
		}
		return true
	}
	advanceTo(lapse)
	if ownedBySurvivors() {
		t.Fatalf("the survivors own the victim's units before its leases lapsed at %s: %v", lapse.Sub(killed), owners())
	}
	var owned time.Time
	for deadline := lapse.Add(3 * ttl); owned.IsZero() && clock.Now().Before(deadline); {
		next, ok := clock.Next()
		if !ok {
			t.Fatal("no timer armed")
		}
		advanceTo(next)
		if ownedBySurvivors() {
			owned = clock.Now()
		}
	}
	if owned.IsZero() {
		t.Fatalf("the survivors never took the victim's %d units over: owners %v", len(held), owners())
	}
	if late := owned.Sub(lapse); late > 10*time.Millisecond {
		t.Errorf("the survivors owned the victim's %d units %s after they lapsed (at %s of virtual time after the kill), want at the lapse, by the steps it brings forward",
			len(held), late, owned.Sub(killed))
	}
	// Each survivor has its fair share now: the units of each node divided by the two, rounded up.
	final := holdings()
	for _, p := range survivors {
		if final[p.id] < 4 || final[p.id] > 5 {
			t.Errorf("%s holds %d units, want its share of 9 between two: 4 or 5 (%v)", p.id, final[p.id], final)
		}
	}
}

func latest(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
