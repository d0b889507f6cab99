// This file holds the postgres_cdc source's replication stream (source_postgres_cdc.go is the
// kind): a goroutine that owns the replication connection, receives the stream and reports the
// source's progress to the server, and the source's loop, which turns transactions into messages.

package stages

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
)

// cdcProgress is what the source has done with the stream, from which the reader computes the
// position it confirms to the server: never past what Redis has.
type cdcProgress struct {
	mu sync.Mutex
	// written is the LSN of the position the runtime recorded in Redis with the source's messages,
	// polled from it (Emitter.Resume).
	written pglogrepl.LSN
	// emitted is the end LSN of the last transaction whose messages were all emitted.
	emitted pglogrepl.LSN
	// handled is the end LSN of the last transaction the source is done with: emitted, or with
	// nothing to emit (other tables' changes). handledSeq counts the stream's messages handled.
	handled    pglogrepl.LSN
	handledSeq uint64
	inTx       bool
	// idle is the server's WAL end that a keepalive reported once idleSeq messages had been sent to
	// the source: when it has handled them, outside a transaction, nothing before idle is left.
	idle    pglogrepl.LSN
	idleSeq uint64
}

// confirm is the position to report to the server as flushed: what Redis has, and, once Redis has
// everything emitted, what the source is done with.
func (p *cdcProgress) confirm() pglogrepl.LSN {
	p.mu.Lock()
	defer p.mu.Unlock()
	c := p.written
	if p.written >= p.emitted {
		c = max(c, p.handled)
		if !p.inTx && p.handledSeq >= p.idleSeq {
			c = max(c, p.idle)
		}
	}
	return c
}

// stream streams the slot's changes from start until an error or ctx's end.
func (s *cdcSource) stream(ctx context.Context, repl *pgconn.PgConn, out Emitter, run *cdcRun, start pglogrepl.LSN, tables []cdcTable) (bool, error) {
	err := pglogrepl.StartReplication(ctx, repl, s.slot, start, pglogrepl.StartReplicationOptions{
		Mode:       pglogrepl.LogicalReplication,
		PluginArgs: []string{"proto_version '1'", "publication_names '" + s.publication + "'"},
	})
	if err != nil {
		return false, fmt.Errorf("starting replication from %s: %w", start, err)
	}
	s.log.Info("postgres_cdc: streaming changes", "from", start.String())
	prog := &cdcProgress{emitted: start, handled: start}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan pglogrepl.Message, 256)
	readErr := make(chan error, 1)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); readErr <- s.receive(rctx, repl, ch, prog) }()
	go func() { defer wg.Done(); s.pollWritten(rctx, out, prog) }()
	defer wg.Wait()
	defer cancel()

	byName := map[string]cdcTable{}
	for _, t := range tables {
		byName[t.name] = t
	}
	h := cdcHandler{s: s, out: out, run: run, prog: prog, tables: byName, tm: pgtype.NewMap(), relations: map[uint32]*cdcRelation{}}
	for {
		select {
		case <-ctx.Done():
			return h.progressed, ctx.Err()
		case err := <-readErr:
			return h.progressed, err
		case m := <-ch:
			if err := h.handle(ctx, m); err != nil {
				return h.progressed, err
			}
		}
	}
}

// receive owns the replication connection: it receives the stream, hands its messages to ch, and
// reports the source's progress every status interval and when the server asks, also while the
// source is held back (Redis away, a full topic), so that the server keeps the connection.
func (s *cdcSource) receive(ctx context.Context, repl *pgconn.PgConn, ch chan<- pglogrepl.Message, prog *cdcProgress) error {
	next := time.Now()
	var pending pglogrepl.Message
	var sent uint64
	for {
		if !time.Now().Before(next) {
			if err := pglogrepl.SendStandbyStatusUpdate(ctx, repl, pglogrepl.StandbyStatusUpdate{WALWritePosition: prog.confirm()}); err != nil {
				return fmt.Errorf("reporting progress: %w", err)
			}
			next = time.Now().Add(s.status)
		}
		if pending != nil {
			t := time.NewTimer(time.Until(next))
			select {
			case ch <- pending:
				pending = nil
				sent++
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return ctx.Err()
			}
			t.Stop()
			continue
		}
		dctx, cancel := context.WithDeadline(ctx, next)
		raw, err := repl.ReceiveMessage(dctx)
		cancel()
		if err != nil {
			if pgconn.Timeout(err) && ctx.Err() == nil {
				continue
			}
			return fmt.Errorf("receiving changes: %w", err)
		}
		switch msg := raw.(type) {
		case *pgproto3.ErrorResponse:
			return pgconn.ErrorResponseToPgError(msg)
		case *pgproto3.CopyData:
			if len(msg.Data) == 0 {
				continue
			}
			switch msg.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				k, err := pglogrepl.ParsePrimaryKeepaliveMessage(msg.Data[1:])
				if err != nil {
					return err
				}
				prog.mu.Lock()
				prog.idle, prog.idleSeq = max(prog.idle, k.ServerWALEnd), sent
				prog.mu.Unlock()
				if k.ReplyRequested {
					next = time.Now()
				}
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(msg.Data[1:])
				if err != nil {
					return err
				}
				if pending, err = pglogrepl.Parse(x.WALData); err != nil {
					return fmt.Errorf("decoding the stream: %w", err)
				}
			}
		case *pgproto3.NoticeResponse:
		default:
			return fmt.Errorf("the replication stream ended (%T)", raw)
		}
	}
}

// pollWritten reads, every status interval, the position that the runtime recorded with the
// source's messages in Redis: what the reader may confirm.
func (s *cdcSource) pollWritten(ctx context.Context, out Emitter, prog *cdcProgress) {
	tick := time.NewTicker(s.status)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, s.status)
		raw, found, err := out.Resume(pctx)
		cancel()
		if err == nil && found {
			var pos cdcPosition
			if json.Unmarshal([]byte(raw), &pos) == nil && pos.Slot == s.slot {
				if lsn, err := pglogrepl.ParseLSN(pos.LSN); err == nil {
					prog.mu.Lock()
					prog.written = max(prog.written, lsn)
					prog.mu.Unlock()
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// cdcHandler turns the stream's messages into the source's messages.
type cdcHandler struct {
	s          *cdcSource
	out        Emitter
	run        *cdcRun
	prog       *cdcProgress
	tables     map[string]cdcTable
	tm         *pgtype.Map
	relations  map[uint32]*cdcRelation // nil value: a relation the source does not capture
	progressed bool

	// The transaction being read.
	lsn     pglogrepl.LSN // its commit LSN
	at      time.Time
	index   int // the index of its next message
	changes []cdcChange
	// held is its last message so far, emitted when the next one comes (without a position) or
	// at the commit (with the position after the transaction), so that a restart resumes at a
	// transaction's boundary.
	held   *cdcChange
	heldAt int
}

func (h *cdcHandler) handle(ctx context.Context, msg pglogrepl.Message) error {
	var err error
	switch m := msg.(type) {
	case *pglogrepl.RelationMessage:
		name := m.Namespace + "." + m.RelationName
		t, ok := h.tables[name]
		if !ok {
			h.relations[m.RelationID] = nil
			break
		}
		cols := make([]cdcColumn, len(m.Columns))
		for i, c := range m.Columns {
			cols[i] = cdcColumn{name: c.Name, oid: c.DataType}
		}
		h.relations[m.RelationID] = newCDCRelation(name, cols, t.key)
	case *pglogrepl.BeginMessage:
		h.lsn, h.at, h.index, h.held = m.FinalLSN, m.CommitTime, 0, nil
		h.prog.mu.Lock()
		h.prog.inTx = true
		h.prog.mu.Unlock()
	case *pglogrepl.InsertMessage:
		err = h.change(ctx, m.RelationID, m)
	case *pglogrepl.UpdateMessage:
		err = h.change(ctx, m.RelationID, m)
	case *pglogrepl.DeleteMessage:
		err = h.change(ctx, m.RelationID, m)
	case *pglogrepl.TruncateMessage:
		h.s.log.Warn("postgres_cdc: a TRUNCATE is not captured (the source's publication publishes inserts, updates and deletes)")
	case *pglogrepl.CommitMessage:
		end := m.TransactionEndLSN
		if h.held != nil {
			pos := cdcPosition{Slot: h.s.slot, LSN: end.String()}
			if err := h.emit(ctx, h.held, h.heldAt, pos.String()); err != nil {
				return err
			}
			h.held = nil
			h.run.pos = &pos
			h.run.skipN = 0
			h.prog.mu.Lock()
			h.prog.emitted = max(h.prog.emitted, end)
			h.prog.mu.Unlock()
		}
		h.prog.mu.Lock()
		h.prog.handled, h.prog.inTx = max(h.prog.handled, end), false
		h.prog.mu.Unlock()
	}
	h.prog.mu.Lock()
	h.prog.handledSeq++
	h.prog.mu.Unlock()
	return err
}

// change makes the messages of a row's change and emits them, each once the next is known.
func (h *cdcHandler) change(ctx context.Context, rel uint32, msg pglogrepl.Message) error {
	r, known := h.relations[rel]
	if !known {
		return fmt.Errorf("a change to relation %d before its relation message", rel)
	}
	if r == nil {
		return nil
	}
	var err error
	if h.changes, err = cdcChanges(h.tm, r, msg, h.changes[:0]); err != nil {
		return cdcConfigError{err.Error()}
	}
	for i := range h.changes {
		index := h.index
		h.index++
		if h.lsn == h.run.skipLSN && index < h.run.skipN {
			continue // emitted by an earlier session
		}
		if h.held != nil {
			if err := h.emit(ctx, h.held, h.heldAt, ""); err != nil {
				return err
			}
			h.run.skipLSN, h.run.skipN = h.lsn, h.heldAt+1
		}
		c := h.changes[i]
		h.held, h.heldAt = &c, index
	}
	return nil
}

// emit emits a message of the transaction, with its ID: the transaction's commit LSN and the
// message's index in it.
func (h *cdcHandler) emit(ctx context.Context, c *cdcChange, index int, position string) error {
	m, err := c.message(h.lsn, h.at)
	if err != nil {
		return cdcConfigError{err.Error()}
	}
	id := strconv.FormatUint(uint64(h.lsn), 16) + "." + strconv.Itoa(index)
	if err := h.out.Emit(ctx, m, Origin{ID: id, Position: position}); err != nil {
		if errors.Is(err, context.Canceled) && ctx.Err() != nil {
			return err
		}
		return cdcEmitError{err}
	}
	h.run.emitted, h.progressed = true, true
	return nil
}
