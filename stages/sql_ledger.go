// This file holds the sql sink's transaction and its effectively-once ledger: the table where the
// sink records, in the transaction that writes the rows, which input entries it wrote, so that an
// entry delivered again after a crash is skipped. It is apart because it is the sink's safety path,
// which changes (and is reviewed) on its own.

package stages

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
)

// write is one transaction: with the ledger, it locks the rows' units, skips the entries it
// records as written, and records the others with them.
func (s *sqlSink) write(ctx context.Context, rows []*sqlRow) (err error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	units := map[string][][2]int64{} // unit -> the entries of its rows
	for _, r := range rows {
		if r.unit != "" {
			units[r.unit] = append(units[r.unit], [2]int64{r.ms, r.seq})
		}
	}
	for unit := range units {
		if err := s.ensureUnit(ctx, unit); err != nil {
			return err
		}
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return s.classify(err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	written := map[string]map[[2]int64]bool{}
	for _, unit := range slices.Sorted(maps.Keys(units)) { // always in one order: no deadlock
		if _, err := tx.ExecContext(ctx, s.dialect.lockUnit(s.ledger), unit); err != nil {
			return s.classify(err)
		}
		got, err := s.ledgerEntries(ctx, tx, unit, units[unit])
		if err != nil {
			return err
		}
		written[unit] = got
	}
	todo := make([]*sqlRow, 0, len(rows))
	for _, r := range rows {
		r.skip = r.unit != "" && written[r.unit][[2]int64{r.ms, r.seq}]
		if !r.skip {
			todo = append(todo, r)
		}
	}
	if skipped := len(rows) - len(todo); skipped > 0 {
		s.log.Info("entries already written, per the ledger, skipped", "entries", skipped, "table", s.display)
	}
	per := max(1, min(1000, s.dialect.maxParams()/max(1, len(s.fields))))
	for start := 0; start < len(todo); start += per {
		chunk := todo[start:min(len(todo), start+per)]
		args := make([]any, 0, len(chunk)*len(s.fields))
		for _, r := range chunk {
			args = append(args, r.values...)
		}
		if _, err := tx.ExecContext(ctx, s.insertSQL(len(chunk)), args...); err != nil {
			return s.classify(err)
		}
	}
	if err := s.record(ctx, tx, todo); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return s.classify(err)
	}
	return nil
}

// ensureUnit makes the unit's lock row in the ledger, once: every transaction of the unit locks
// it, so that two processes that both think they own a partition (one has lost its lease and does
// not know yet) write its entries one after the other, and the second skips what the first wrote.
func (s *sqlSink) ensureUnit(ctx context.Context, unit string) error {
	s.mu.Lock()
	done := s.units[unit]
	s.mu.Unlock()
	if done {
		return nil
	}
	if _, err := s.db.ExecContext(ctx, s.dialect.insertUnit(s.ledger), unit); err != nil {
		return s.classify(err)
	}
	s.mu.Lock()
	s.units[unit] = true
	s.mu.Unlock()
	return nil
}

// ledgerEntries reads which of a unit's entries the ledger records as written.
func (s *sqlSink) ledgerEntries(ctx context.Context, tx *sql.Tx, unit string, entries [][2]int64) (map[[2]int64]bool, error) {
	got := map[[2]int64]bool{}
	for start := 0; start < len(entries); start += 1000 {
		chunk := entries[start:min(len(entries), start+1000)]
		query, args := s.dialect.readLedger(s.ledger, unit, chunk)
		if err := s.readLedger(ctx, tx, query, args, got); err != nil {
			return nil, err
		}
	}
	return got, nil
}

func (s *sqlSink) readLedger(ctx context.Context, tx *sql.Tx, query string, args []any, got map[[2]int64]bool) error {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return s.classify(err)
	}
	defer func() { _ = rows.Close() }()
	for rows.Next() {
		var ms, seq int64
		if err := rows.Scan(&ms, &seq); err != nil {
			return s.classify(err)
		}
		got[[2]int64{ms, seq}] = true
	}
	return s.classify(rows.Err())
}

// record adds the rows' entries to the ledger, and forgets, once a minute per unit, the entries
// written longer than ledger_retention ago.
func (s *sqlSink) record(ctx context.Context, tx *sql.Tx, rows []*sqlRow) error {
	now := s.clock.Now()
	var args []any
	prune := map[string]bool{}
	flush := func() error {
		if len(args) == 0 {
			return nil
		}
		_, err := tx.ExecContext(ctx, s.dialect.insertLedger(s.ledger, len(args)/4), args...)
		args = args[:0]
		return s.classify(err)
	}
	for _, r := range rows {
		if r.unit == "" {
			continue
		}
		args = append(args, r.unit, r.ms, r.seq, now.UnixMilli())
		prune[r.unit] = true
		if len(args) >= 4*1000 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	for unit := range prune {
		s.mu.Lock()
		due := now.Sub(s.pruned[unit]) >= time.Minute
		if due {
			s.pruned[unit] = now
		}
		s.mu.Unlock()
		if !due {
			continue
		}
		if _, err := tx.ExecContext(ctx, s.dialect.pruneLedger(s.ledger), unit, now.Add(-s.retention).UnixMilli()); err != nil {
			return s.classify(err)
		}
	}
	return nil
}

// unit names a partition of the sink's input in the ledger: longer names are hashed, to fit its key.
func (s *sqlSink) unit(partition int) string {
	u := s.unitPrefix + strconv.Itoa(partition)
	if len(u) > 200 {
		sum := sha256.Sum256([]byte(u))
		u = u[:100] + "#" + hex.EncodeToString(sum[:])
	}
	return u
}

// parseEntryID splits a stream entry ID, ms-seq.
func parseEntryID(id string) (ms, seq int64, ok bool) {
	a, b, found := strings.Cut(id, "-")
	if !found {
		return 0, 0, false
	}
	ms, err1 := strconv.ParseInt(a, 10, 64)
	seq, err2 := strconv.ParseInt(b, 10, 64)
	return ms, seq, err1 == nil && err2 == nil
}
