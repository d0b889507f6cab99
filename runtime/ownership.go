package runtime

import (
	"context"
	"errors"
	"hash/fnv"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/sourcegraph/conc"

	"github.com/flowrun/flowrun/stages"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// Processes running the same pipeline share its units (a stage or sink on one partition) through
// leases. Each process renews a membership on a timer, for the pipeline and for each node it runs,
// and counts the live members of each node; its fair share of a node is the node's units divided by
// the processes that run it, rounded up (so that processes that split the pipeline with --stages
// share each node among those that run it). A process holding more gives units up
// (finishing their batches first); a process holding fewer takes free units. When a process dies its
// leases expire, the others stop counting it, and its units move as soon as they have: each step
// notes when the next other member's membership lapses, and when the leases it wanted and found
// held expire, and a lapse before the next tick brings the next step forward to it (a live process
// renews both several times per lease period, so only a dead or stalled one lapses that soon). So
// the survivors own a dead process's units about one lease period after its last renewal, not a
// step or more later.
//
// A lease is fenced: every ack checks that the lease is still held (transport/redis Commit), so a
// process that lost a lease (it stalled past the TTL, say) stops working on the unit and acks nothing.
//
// Units of nodes with ordering "none" need no owner: every process reads every partition. Sources
// that read an external stream take a lease too, so that one process reads it in order; sources that
// produce (generate, file) take one so that only one process produces.

// ownership runs the units of this process.
type ownership struct {
	r        *runner
	interval time.Duration
	// balanced are the leased units, shared fairly, by node; each node's in this process's
	// preference order. memberKeys are the pipeline's members key, then each of these nodes'.
	balanced   [][]*unit
	memberKeys []string
	sources    []*unit // leased units of sources: taken when free, kept until the end
	free       []*unit // units without leases: always run
	// version counts the changes of the units above (a reload's, setUnits): a step that counted
	// the members of other nodes than those it now holds takes nothing new.
	version int
	// stepNow wakes the loop for a step at once (after a reload, to take the new units' leases).
	stepNow chan struct{}

	workers conc.WaitGroup
	ctx     context.Context // the run's context, which the workers' derive from
	// early is when the next step comes before the next tick: the soonest lapse that the step under
	// way found (lapseAt). Only run's goroutine uses it.
	early time.Time

	mu        sync.Mutex
	leases    int  // balanced units held, as of the last step
	fair      bool // leases is the fair share, as of the last step
	held      map[*unit]*holding
	sourceLes map[string]*heldLease // leases of producing sources, by key
	worked    []*unit               // every unit this process worked on, to tidy its consumer up
}

// holding is a unit this process holds, or is giving up.
type holding struct {
	lease     *redis.Lease
	stop      context.CancelFunc
	done      chan struct{}
	err       error // the worker's result, set before done closes
	releasing bool
}

// heldLease is the lease of a producing source; lost is canceled when it is lost.
type heldLease struct {
	lease redis.Lease
	lost  context.CancelFunc
}

func newOwnership(ctx context.Context, r *runner) *ownership {
	o := &ownership{
		r:         r,
		ctx:       ctx,
		interval:  max(r.opts.LeaseTTL/5, 10*time.Millisecond),
		held:      map[*unit]*holding{},
		sourceLes: map[string]*heldLease{},
		stepNow:   make(chan struct{}, 1),
	}
	o.setUnits(r.units)
	return o
}

// setUnits sorts the units this process runs into balanced, sources and free. Called before the
// run, or with o.mu held.
func (o *ownership) setUnits(units []*unit) {
	r := o.r
	o.version++
	o.balanced, o.sources, o.free = nil, nil, nil
	o.memberKeys = []string{r.keys.Members()}
	byNode := map[*node]int{}
	for _, u := range units {
		switch {
		case u.leaseKey == "":
			o.free = append(o.free, u)
		case u.node.typ == "source":
			o.sources = append(o.sources, u)
		default:
			i, ok := byNode[u.node]
			if !ok {
				i = len(o.balanced)
				byNode[u.node] = i
				o.balanced = append(o.balanced, nil)
				o.memberKeys = append(o.memberKeys, r.keys.NodeMembers(u.node.name))
			}
			o.balanced[i] = append(o.balanced[i], u)
		}
	}
	// Each process prefers a different order of units, so that processes starting together
	// mostly try different leases.
	rank := func(u *unit) uint64 {
		h := fnv.New64a()
		h.Write([]byte(r.opts.ProcessID + "|" + u.leaseKey))
		return h.Sum64()
	}
	for _, units := range o.balanced {
		sort.Slice(units, func(i, j int) bool { return rank(units[i]) < rank(units[j]) })
	}
}

// holdings reports how many leases of partitions this process holds, and whether that is its fair
// share as of the last step.
func (o *ownership) holdings() (int, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.leases, o.fair
}

// run starts the units and keeps the leases until ctx ends; shutdown then finishes the work.
func (o *ownership) run(ctx context.Context) {
	for _, u := range o.free {
		o.startWorker(u, nil)
	}
	ticker := o.r.clock.NewTicker(o.interval)
	defer ticker.Stop()
	for {
		o.early = time.Time{}
		o.step(ctx)
		var early <-chan time.Time
		var timer stages.Timer
		if !o.early.IsZero() {
			timer = o.r.clock.NewTimer(max(o.early.Sub(o.r.clock.Now()), 0))
			early = timer.C()
		}
		select {
		case <-ctx.Done():
		case <-ticker.C():
		case <-o.stepNow:
		case <-early:
		}
		if timer != nil {
			timer.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// lapseMargin is how long after a lapse the step it brings forward runs: Redis expires a key once
// its time is past, and the heartbeat forgets a member once its expiry is past, both to the
// millisecond.
const lapseMargin = time.Millisecond

// lapseAt notes a lapse that the step under way found: another member's membership, or a lease it
// wanted and found held. The next step comes just after the soonest of them, unless the next tick
// comes first.
func (o *ownership) lapseAt(lapse time.Time) {
	at := lapse.Add(lapseMargin)
	if at.Sub(o.r.clock.Now()) < o.interval && (o.early.IsZero() || at.Before(o.early)) {
		o.early = at
	}
}

// step renews what this process holds and moves it towards its fair share.
func (o *ownership) step(ctx context.Context) {
	r := o.r
	ttl := r.opts.LeaseTTL
	o.mu.Lock()
	memberKeys, version := o.memberKeys, o.version
	o.mu.Unlock()
	membership, err := r.rdb.Heartbeat(ctx, memberKeys, r.opts.ProcessID, ttl)
	members := membership.Live
	if err != nil {
		if ctx.Err() == nil && !r.redisFailed("renewing this process's membership", err) {
			return
		}
		members = nil
	} else {
		r.outage.OK()
		if !membership.NextLapse.IsZero() {
			o.lapseAt(membership.NextLapse)
		}
	}

	o.mu.Lock()
	defer o.mu.Unlock()
	o.forgetEnded(ctx)
	o.renewUnits(ctx)
	o.renewSources(ctx)
	if ctx.Err() != nil || members == nil || version != o.version {
		return // without a membership count (of these nodes), keep what is held and take nothing new
	}
	o.takeShares(ctx, members)
}

// forgetEnded forgets the workers that ended on their own: a lost lease, or a fatal error.
// Called with o.mu held.
func (o *ownership) forgetEnded(ctx context.Context) {
	for u, h := range o.held {
		select {
		case <-h.done:
			if !h.releasing {
				delete(o.held, u)
				if !errors.Is(h.err, errLeaseLost) && h.lease != nil {
					_ = o.r.rdb.ReleaseLease(ctx, *h.lease)
				}
			}
		default:
		}
	}
}

// renewUnits renews every partition's lease in one round trip: renewed one after the other, the
// last ones could expire while a slow Redis answers for the first. Called with o.mu held.
func (o *ownership) renewUnits(ctx context.Context) {
	r := o.r
	var renewing []*unit
	var held []redis.Lease
	for u, h := range o.held {
		if h.lease != nil && !h.releasing {
			renewing, held = append(renewing, u), append(held, *h.lease)
		}
	}
	for i, err := range r.rdb.RenewLeases(ctx, held, r.opts.LeaseTTL) {
		u, h := renewing[i], o.held[renewing[i]]
		if errors.Is(err, redis.ErrLeaseLost) {
			r.log.Warn("lease lost; stopping the partition", "node", u.node.name, "stream", u.stream)
			h.stop()
			h.releasing = true // the worker ends; nothing to release
			go func() { <-h.done; o.forget(u) }()
		} else if err != nil && ctx.Err() == nil {
			r.redisFailed(u.node.typ+" "+u.node.name+" renewing its lease on "+u.stream, err)
		}
	}
}

// renewSources renews the producing sources' leases. Called with o.mu held.
func (o *ownership) renewSources(ctx context.Context) {
	r, ttl := o.r, o.r.opts.LeaseTTL
	for key, h := range o.sourceLes {
		if err := r.rdb.RenewLease(ctx, h.lease, ttl); errors.Is(err, redis.ErrLeaseLost) {
			o.retakeSourceLocked(ctx, key, h)
		}
	}
}

// takeShares asks at once for every lease wanted, of the sources and of each node (its fair
// share among the members), and records what is held then. Called with o.mu held.
func (o *ownership) takeShares(ctx context.Context, members []int) {
	wants := []want{{o.sources, len(o.sources)}}
	holdings, shares := make([]int, len(o.balanced)), make([]int, len(o.balanced))
	for i, units := range o.balanced {
		holdings[i], shares[i] = o.balance(units, max(members[i+1], 1))
		wants = append(wants, want{units, shares[i] - holdings[i]})
	}
	taken, allTried := o.acquire(ctx, wants)
	leases, fair := 0, true
	for i := range o.balanced {
		held := holdings[i] + taken[i+1]
		leases += held
		// Short of its share only because other processes hold the rest (4 partitions among 3
		// processes: shares of 2, and one holds 0 or 1) is fair too: it takes units as they
		// are given up. Otherwise a process could never be ready when the processes do not
		// divide the partitions.
		fair = fair && (held >= shares[i] || allTried)
	}
	o.leases, o.fair = leases, fair
}

// balance gives up the units of one node that this process holds beyond its fair share among
// members processes, and returns what it holds then and its share; step takes what is missing.
// Called with o.mu held.
func (o *ownership) balance(units []*unit, members int) (holding, share int) {
	share = (len(units) + members - 1) / members
	for _, u := range units {
		if h, ok := o.held[u]; ok && !h.releasing {
			holding++
		}
	}
	// Give up the least preferred units first, take the most preferred first.
	for i := len(units) - 1; i >= 0 && holding > share; i-- {
		u := units[i]
		if h, ok := o.held[u]; ok && !h.releasing {
			o.release(u, h)
			holding--
		}
	}
	return holding, share
}

// want asks acquire for up to n of units, in their order, that this process does not hold.
type want struct {
	units []*unit
	n     int
}

// acquire takes the units that wants ask for and starts their workers; it returns how many it
// took of each, and whether Redis answered for every unit it tried (so that a want it could not
// meet found every other unit held by another process). Each round asks for every lease still
// wanted in one round trip (a process starting takes all its partitions at once), and the next
// round tries the following units in place of those that other processes hold. Called with o.mu
// held.
func (o *ownership) acquire(ctx context.Context, wants []want) (taken []int, allTried bool) {
	taken = make([]int, len(wants))
	next := make([]int, len(wants))
	for {
		var try []*unit
		var of []int // the want of each unit of try
		for i, w := range wants {
			for picked := 0; next[i] < len(w.units) && taken[i]+picked < w.n; next[i]++ {
				if _, ok := o.held[w.units[next[i]]]; !ok {
					try, of = append(try, w.units[next[i]]), append(of, i)
					picked++
				}
			}
		}
		if len(try) == 0 {
			return taken, true
		}
		keys := make([]string, len(try))
		for i, u := range try {
			keys[i] = u.leaseKey
		}
		results, err := o.r.rdb.AcquireLeases(ctx, keys, o.r.opts.ProcessID, o.r.opts.LeaseTTL)
		if err != nil {
			if ctx.Err() == nil {
				o.r.redisFailed("taking leases", err)
			}
			return taken, false
		}
		failed := false
		for i, res := range results {
			u := try[i]
			if res.Err != nil {
				if !failed && ctx.Err() == nil {
					o.r.redisFailed(u.node.typ+" "+u.node.name+" taking a lease on "+u.stream, res.Err)
				}
				failed = true
				continue
			}
			if !res.Taken && res.TTL >= 0 { // a lease without expiry (-1) is none of the runtime's
				o.lapseAt(o.r.clock.Now().Add(res.TTL))
			}
			if res.Taken {
				o.r.log.Debug("partition taken", "node", u.node.name, "stream", u.stream, "token", res.Lease.Token)
				lease := res.Lease
				o.startWorkerLocked(u, &lease)
				taken[of[i]]++
			}
		}
		if failed {
			return taken, false // Redis is failing: the next step tries again
		}
	}
}

// release gives a unit up: its worker finishes its batch, then the lease is released. Called with
// o.mu held.
func (o *ownership) release(u *unit, h *holding) {
	h.releasing = true
	h.stop()
	o.r.log.Debug("giving a partition up", "node", u.node.name, "stream", u.stream)
	go func() {
		<-h.done
		if !errors.Is(h.err, errLeaseLost) {
			_ = o.r.rdb.ReleaseLease(o.r.hard, *h.lease)
		}
		o.forget(u)
	}()
}

func (o *ownership) forget(u *unit) {
	o.mu.Lock()
	delete(o.held, u)
	o.mu.Unlock()
}

func (o *ownership) startWorker(u *unit, lease *redis.Lease) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.startWorkerLocked(u, lease)
}

// startWorkerLocked runs a unit's worker until its context ends. Called with o.mu held.
func (o *ownership) startWorkerLocked(u *unit, lease *redis.Lease) {
	ctx, stop := context.WithCancel(o.ctx)
	h := &holding{lease: lease, stop: stop, done: make(chan struct{})}
	o.held[u] = h
	o.worked = append(o.worked, u)
	o.r.activity.add(1) // the worker is at work from now until its first command (worker.run)
	o.workers.Go(func() {
		defer close(h.done)
		defer stop()
		h.err = newWorker(o.r, u, lease).run(ctx)
	})
}

// stopUnits stops the workers of units that this process holds, for a reload that stops or
// restarts their nodes: each finishes the batch it has in flight and commits it, then its lease is
// released. It returns once all have stopped.
func (o *ownership) stopUnits(units []*unit) {
	o.mu.Lock()
	// The steps meanwhile must not take these units again: they are no longer among those this
	// process runs.
	ending := map[*unit]bool{}
	for _, u := range units {
		ending[u] = true
	}
	var remaining []*unit
	for _, u := range o.units() {
		if !ending[u] {
			remaining = append(remaining, u)
		}
	}
	o.setUnits(remaining)
	var stopping []*holding
	for _, u := range units {
		if h, ok := o.held[u]; ok {
			if !h.releasing {
				h.releasing = true
				h.stop()
			}
			stopping = append(stopping, h)
		}
	}
	o.mu.Unlock()
	for _, h := range stopping {
		<-h.done
	}
	o.mu.Lock()
	var leases []redis.Lease
	for _, u := range units {
		if h, ok := o.held[u]; ok {
			if h.lease != nil && !errors.Is(h.err, errLeaseLost) {
				leases = append(leases, *h.lease)
			}
			delete(o.held, u)
		}
	}
	o.mu.Unlock()
	if len(leases) > 0 {
		// Released by compare-and-set: one that a giving-up of the same unit released already, or
		// that expired, is left alone.
		_ = o.r.rdb.ReleaseLeases(o.r.hard, leases)
	}
}

// units lists the units this process runs. Called with o.mu held.
func (o *ownership) units() []*unit {
	out := slices.Concat(o.sources, o.free)
	for _, units := range o.balanced {
		out = append(out, units...)
	}
	return out
}

// replaceUnits makes units the units this process runs, after a reload, and starts those of added
// that need no lease; the next step, at once, takes the leases of the others.
func (o *ownership) replaceUnits(units, added []*unit) {
	o.mu.Lock()
	o.setUnits(units)
	for _, u := range added {
		if u.leaseKey == "" {
			o.startWorkerLocked(u, nil)
		}
	}
	o.mu.Unlock()
	select {
	case o.stepNow <- struct{}{}:
	default:
	}
}

// holdSource takes the lease of a producing source, waiting while another process holds it. The
// returned context ends when ctx does or the lease is lost.
func (o *ownership) holdSource(ctx context.Context, key string) (context.Context, bool) {
	t := o.r.clock.NewTicker(o.interval)
	defer t.Stop()
	for {
		lease, ok, err := o.r.rdb.AcquireLease(ctx, key, o.r.opts.ProcessID, o.r.opts.LeaseTTL)
		if err == nil && ok {
			sctx, lost := context.WithCancel(ctx)
			o.mu.Lock()
			o.sourceLes[key] = &heldLease{lease: lease, lost: lost}
			o.mu.Unlock()
			return sctx, true
		}
		if err != nil && ctx.Err() == nil && !o.r.redisFailed("taking the source lease "+key, err) {
			return ctx, false
		}
		select {
		case <-ctx.Done():
			return ctx, false
		case <-t.C():
		}
	}
}

// retakeSource is what a source's writer does when Redis refused its write under lease: the lease
// it wrote under expired. It returns the lease to write under now, false when the source is lost
// (then its context is canceled too).
func (o *ownership) retakeSource(ctx context.Context, key string, refused redis.Lease) (redis.Lease, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	h, ok := o.sourceLes[key]
	if !ok {
		return redis.Lease{}, false
	}
	if h.lease != refused {
		return h.lease, true // the last renewal took it again already
	}
	return o.retakeSourceLocked(ctx, key, h)
}

// retakeSourceLocked takes a source's lease again once it expired (this process stalled past its
// TTL): if nobody holds it now, nobody ran the source since this process last wrote under it
// (a process that takes the lease keeps it while it runs the source), and the source goes on
// where it was. Otherwise the source is lost to another process and stops.
func (o *ownership) retakeSourceLocked(ctx context.Context, key string, h *heldLease) (redis.Lease, bool) {
	r := o.r
	if lease, ok, err := r.rdb.AcquireLease(ctx, key, r.opts.ProcessID, r.opts.LeaseTTL); err == nil && ok {
		r.log.Warn("source lease expired and was taken again", "lease", key)
		h.lease = lease
		return lease, true
	}
	r.log.Warn("source lease lost to another process; stopping the source", "lease", key)
	h.lost()
	delete(o.sourceLes, key)
	return redis.Lease{}, false
}

// dropSource forgets a source's lease after its source stopped because of it, releasing it if it
// is still this process's, so that the lease can be taken again.
func (o *ownership) dropSource(ctx context.Context, key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if h, ok := o.sourceLes[key]; ok {
		h.lost()
		delete(o.sourceLes, key)
		_ = o.r.rdb.ReleaseLease(ctx, h.lease)
	}
}

// sourceLease returns the lease this process holds on a producing source, as of the last renewal.
func (o *ownership) sourceLease(key string) (redis.Lease, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	h, ok := o.sourceLes[key]
	if !ok {
		return redis.Lease{}, false
	}
	return h.lease, true
}

// shutdown waits for every worker to finish its batch, then releases the leases, removes this
// process's idle consumers from the groups, and leaves the membership, so that other processes take
// over at once instead of after the leases expire.
func (o *ownership) shutdown(hard context.Context) {
	o.workers.Wait()
	// The run's context is over; these last calls get a moment of their own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(hard), 5*time.Second)
	defer cancel()
	r := o.r
	o.mu.Lock()
	defer o.mu.Unlock()
	// Each step is one round trip for all the units.
	var leases []redis.Lease
	for u, h := range o.held {
		if h.lease != nil && !errors.Is(h.err, errLeaseLost) {
			leases = append(leases, *h.lease)
		}
		delete(o.held, u)
	}
	for key, h := range o.sourceLes {
		leases = append(leases, h.lease)
		delete(o.sourceLes, key)
	}
	if len(leases) > 0 {
		_ = r.rdb.ReleaseLeases(ctx, leases)
	}
	seen := map[*unit]bool{}
	var groups []redis.GroupRef
	for _, u := range o.worked {
		if !seen[u] {
			seen[u] = true
			groups = append(groups, redis.GroupRef{Stream: u.stream, Group: u.node.group})
		}
	}
	if len(groups) > 0 {
		_ = r.rdb.DeleteIdleConsumers(ctx, groups, r.opts.ProcessID)
	}
	if err := r.rdb.Leave(ctx, o.memberKeys, r.opts.ProcessID); err != nil {
		r.log.Warn("leaving the membership failed; the others take over once it expires", "err", err)
	}
}
