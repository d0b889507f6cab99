package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// The connectors of issue 24, measured as the other flows are, in the same interleaved rounds:
//
//   - HTTP in: clients post the harness's messages to flowrun's http_server source, which answers
//     202 once they are in Redis, and to Benthos's http_server input with a redis_streams output,
//     which answers once its output has written them. Requests of one message (requests/s) and of
//     100 JSON lines (messages/s; Benthos splits the lines with an unarchive processor).
//   - SQL out: a stream filled beforehand, written into a PostgreSQL table by flowrun's sql sink and
//     by Benthos's sql_insert output (rows/s), on the machine's PostgreSQL in a database of the
//     harness's own (flowbench_<pid>, dropped at the end).
//   - CDC: changes of a table captured by flowrun's postgres_cdc source (changes/s), on a private
//     PostgreSQL with wal_level = logical (connectors_cdc.go). Benthos v4.27 has no such input.
//
// The msg/s column of the report is then requests, messages, rows or changes per second, as the
// scenario's name says; a flowrun row's ratio is over the Benthos row of the same round.

// The kinds of these scenarios (scenario.kind).
const (
	kindHTTPIn kind = iota + 200
	kindSQLOut
	kindCDC
)

const (
	phaseConn    = 'c' // the messages of these scenarios (see payload.go)
	httpClients  = 8   // concurrent clients, each with a keep-alive connection
	httpPath     = "/in"
	sqlTable     = "bench_rows"
	benthosSQLIn = benthosStreamNS + ":{sqlin}"
)

// pgAdmin is the machine's PostgreSQL (127.0.0.1:5432, user postgres, trust), as the tests use it.
var pgAdmin = envOr("FLOWBENCH_POSTGRES", "127.0.0.1:5432")

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

var connectorScenarios = []scenario{
	{name: "HTTP-IN single", kind: kindHTTPIn, impl: implFlowrun, lines: 1, vs: "Benthos HTTP-IN single", pipeline: "http-in"},
	{name: "Benthos HTTP-IN single", kind: kindHTTPIn, impl: implBenthos, lines: 1},
	{name: "HTTP-IN lines", kind: kindHTTPIn, impl: implFlowrun, lines: 100, vs: "Benthos HTTP-IN lines", pipeline: "http-in"},
	{name: "Benthos HTTP-IN lines", kind: kindHTTPIn, impl: implBenthos, lines: 100},
	{name: "SQL-OUT rows", kind: kindSQLOut, impl: implFlowrun, stages: 1, vs: "Benthos SQL-OUT tuned", pipeline: "sql-out"},
	{name: "SQL-OUT rows eo", kind: kindSQLOut, impl: implFlowrun, stages: 1, vs: "SQL-OUT rows", pipeline: "sql-out-eo"},
	{name: "Benthos SQL-OUT default", kind: kindSQLOut, impl: implBenthos, stages: 1, fewer: true},
	{name: "Benthos SQL-OUT tuned", kind: kindSQLOut, impl: implBenthos, stages: 1, tuned: true},
	{name: "CDC changes", kind: kindCDC, impl: implFlowrun, stages: 1, pipeline: "cdc"},
}

func init() {
	scenarios = append(scenarios, connectorScenarios...)
	benchPipelines = append(benchPipelines,
		benchPipeline{name: "http-in", src: httpInHCL},
		benchPipeline{name: "sql-out", src: sqlOutHCL},
		// Effectively-once: the sink's ledger in the same transaction as the rows.
		benchPipeline{name: "sql-out-eo", src: strings.Replace(sqlOutHCL, `key_prefix = "fb"`, `key_prefix = "fb"
  delivery   = "effectively_once"`, 1)},
		benchPipeline{name: "cdc", src: cdcHCL},
	)
}

// The flowrun pipelines, whose addresses and DSNs come as variables (flowrun run --var).
const httpInHCL = `# Written by flowbench: the http_server source into a topic.
pipeline "bench" {
  key_prefix = "fb"
}
variable "address" { default = "127.0.0.1:8080" } # the harness sets a free port
source "in" {
  kind     = "http_server"
  output   = topic.in
  address  = var.address
  path     = "/in"
  framing  = "auto"
  max_body = "16MiB"
}
topic "in" { partitions = 1 }
`

const sqlOutHCL = `# Written by flowbench: a topic of 4 partitions into a PostgreSQL table.
pipeline "bench" {
  key_prefix = "fb"
}
variable "dsn" { default = "postgres://postgres@127.0.0.1:5432/flowbench?sslmode=disable" } # the harness sets its database
topic "in" {
  partitions = 4
  key        = msg.key
}
sink "db" {
  kind    = "sql"
  input   = topic.in
  driver  = "postgres"
  dsn     = var.dsn
  table   = "bench_rows"
  columns = { seq = msg.seq, k = msg.key, amount = msg.amount, at = msg.at }
}
`

// connectorRun dispatches a scenario of this file (see harness.run).
func (h *harness) connectorRun(ctx context.Context, sc scenario) result {
	switch sc.kind {
	case kindHTTPIn:
		return h.runHTTPIn(ctx, sc)
	case kindSQLOut:
		return h.runSQLOut(ctx, sc)
	}
	return h.runCDC(ctx, sc)
}

// cpus reads the CPU time of the child and of redis-server, at the start of a measured phase.
func (h *harness) cpus(c *child) [2]time.Duration {
	cpu, _ := c.cpu()
	rcpu, _ := h.srv.cpu()
	return [2]time.Duration{cpu, rcpu}
}

// measured fills a result from a phase of n items between t0 and t1, with the CPU of the child
// and of redis-server since cpus said cpu0.
func (h *harness) measured(c *child, n int, t0, t1 time.Time, cpu0 [2]time.Duration) result {
	res := result{got: n, elapsed: t1.Sub(t0)}
	if _, peak, err := c.memKB(); err == nil {
		res.peakKB = peak
	}
	res.rate = float64(n) / res.elapsed.Seconds()
	cpu1 := h.cpus(c)
	res.cpu, res.redisCPU = float64(cpu1[0]-cpu0[0])/float64(n), float64(cpu1[1]-cpu0[1])/float64(n)
	return res
}

// runHTTPIn posts warm-up requests, then cfg.flat/lines requests of lines messages each from
// httpClients clients, and checks that the stream holds every message.
func (h *harness) runHTTPIn(ctx context.Context, sc scenario) (res result) {
	lines := sc.lines
	port, err := freePort()
	if err != nil {
		return result{failed: err.Error()}
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	var c *child
	stream := fwStream("in")
	if sc.impl == implBenthos {
		stream = benthosStreamNS + ":{in}"
		logPath := h.logPath(sc)
		c, err = h.startBenthosConfig(sc, logPath, benthosHTTPConfig(h.srv.addr(), port, stream, lines > 1, logPath), false)
	} else {
		c, err = startChild(sc.name, h.logPath(sc), h.flowrunEnv, h.flowrun, "run", h.pipelines[sc.pipeline], "--redis", h.srv.url(), "--var", "address="+addr)
	}
	if err != nil {
		return result{failed: err.Error()}
	}
	defer stopChild(c, &res)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: httpClients}, Timeout: time.Minute}
	url := "http://" + addr + httpPath
	post := func(body []byte) error {
		contentType := "application/json"
		if lines > 1 {
			contentType = "application/x-ndjson"
		}
		resp, err := client.Post(url, contentType, bytes.NewReader(body))
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return fmt.Errorf("%d %s", resp.StatusCode, b)
		}
		return nil
	}
	// The server listens once a request gets an answer.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c.exited() {
			return result{failed: "the process exited: " + c.logTail()}
		}
		if _, err := client.Get(url); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return result{failed: "the server did not listen within 30s: " + c.logTail()}
		}
	}
	var seq atomic.Int64
	body := func() []byte {
		var b bytes.Buffer
		p := make([]byte, payloadSize)
		for i := range lines {
			if i > 0 {
				b.WriteByte('\n')
			}
			putPayload(p, time.Now().UnixNano(), phaseConn, int(seq.Add(1)))
			b.Write(p)
		}
		return b.Bytes()
	}
	send := func(requests int) error {
		var wg sync.WaitGroup
		errs := make(chan error, httpClients)
		var next atomic.Int64
		for range httpClients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(requests) {
					if err := post(body()); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		return <-errs
	}
	warm := max(h.cfg.warm/lines, httpClients)
	if err := send(warm); err != nil {
		return result{failed: "warm-up: " + err.Error()}
	}
	requests := max(h.cfg.flat/4/lines, httpClients)
	cpu0 := h.cpus(c)
	t0 := time.Now()
	if err := send(requests); err != nil {
		return result{failed: err.Error()}
	}
	res = h.measured(c, requests*lines, t0, time.Now(), cpu0)
	if n, err := h.rdb.XLen(ctx, stream).Result(); err != nil || n != int64((warm+requests)*lines) {
		return result{failed: fmt.Sprintf("%s holds %d entries (%v), want %d", stream, n, err, (warm+requests)*lines)}
	}
	res.note("requests of %d message%s: requests/s = msg/s / %d", lines, plural(lines), lines)
	return res
}

// stopChild stops a scenario's process at its end, failing the result if it did not stop well.
func stopChild(c *child, res *result) {
	if err := c.stop(30 * time.Second); err != nil && res.failed == "" {
		res.failed = "stopping: " + err.Error()
	}
}

// benthosHTTPConfig is Benthos's http_server input on the service's HTTP server, with every setting
// at its default, into a redis_streams output; an unarchive processor splits a body of JSON lines
// into its messages.
func benthosHTTPConfig(redisAddr string, port int, stream string, lines bool, logPath string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "http:\n  address: 127.0.0.1:%d\n", port)
	fmt.Fprintf(&b, "logger:\n  level: WARN\n  file:\n    path: %q\n", logPath)
	fmt.Fprintf(&b, "input:\n  http_server:\n    path: %s\n    allowed_verbs: [ POST ]\n", httpPath)
	if lines {
		b.WriteString("  processors:\n    - unarchive:\n        format: lines\n")
	}
	fmt.Fprintf(&b, "output:\n  redis_streams:\n    url: redis://%s\n    stream: %q\n    body_key: payload\n", redisAddr, stream)
	return b.String()
}

// startBenthosConfig starts Benthos on one config, which logs to logPath (its standard error too).
func (h *harness) startBenthosConfig(sc scenario, logPath, config string, tuned bool) (*child, error) {
	bin, why := benthosPath()
	if why != "" {
		return nil, fmt.Errorf("%s", why)
	}
	dir, err := os.MkdirTemp(h.tmp, "benthos-")
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "benthos.yaml")
	if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
		return nil, err
	}
	var env []string
	if tuned {
		env = append(env, "GOGC=400")
	}
	return startChild(sc.name, logPath, env, bin, "-c", path)
}

// sqlDatabase is the harness's database on the machine's PostgreSQL, created at first use.
func (h *harness) sqlDatabase(ctx context.Context) (string, error) {
	if h.sqlDB != "" {
		return h.sqlDB, nil
	}
	admin, err := pgx.Connect(ctx, "postgres://postgres@"+pgAdmin+"/postgres?sslmode=disable&connect_timeout=5")
	if err != nil {
		return "", fmt.Errorf("the machine's PostgreSQL at %s: %w", pgAdmin, err)
	}
	defer func() { _ = admin.Close(ctx) }()
	name := fmt.Sprintf("flowbench_%d", os.Getpid())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", err
	}
	h.sqlDB = name
	h.cleanups = append(h.cleanups, func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if admin, err := pgx.Connect(ctx, "postgres://postgres@"+pgAdmin+"/postgres?sslmode=disable&connect_timeout=5"); err == nil {
			_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
			_ = admin.Close(ctx)
		}
	})
	return name, nil
}

// runSQLOut fills the input stream with cfg.warm + cfg.flat/2 messages (cfg.wmFlat/2 for a slow
// set-up), starts the system, and
// times the rows of the flat part from the moment the warm-up's rows are in the table until the
// last row is.
func (h *harness) runSQLOut(ctx context.Context, sc scenario) (res result) {
	db, err := h.sqlDatabase(ctx)
	if err != nil {
		return result{failed: err.Error()}
	}
	dsn := "postgres://postgres@" + pgAdmin + "/" + db + "?sslmode=disable"
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return result{failed: err.Error()}
	}
	defer func() { _ = conn.Close(context.Background()) }()
	// The table, and the ledger of an effectively-once sink, start empty.
	if _, err := conn.Exec(ctx, "DROP TABLE IF EXISTS flowrun_sql_ledger; DROP TABLE IF EXISTS "+sqlTable+"; CREATE TABLE "+sqlTable+
		" (seq text PRIMARY KEY, k text NOT NULL, amount int NOT NULL, at bigint NOT NULL)"); err != nil {
		return result{failed: err.Error()}
	}
	warm, flat := h.cfg.warm, h.cfg.flat/2
	if sc.fewer {
		flat = h.cfg.wmFlat / 2 // a row per INSERT: the rate is clear after fewer
	}
	stream := partitionStreams("in", 4)
	if sc.impl == implBenthos {
		stream = benthosSQLIn
	}
	if err := publishParallel(ctx, h.rdb, stream, formatPlain, phaseConn, warm+flat, 4); err != nil {
		return result{failed: err.Error()}
	}
	var c *child
	if sc.impl == implBenthos {
		logPath := h.logPath(sc)
		c, err = h.startBenthosConfig(sc, logPath, benthosSQLConfig(h.srv.addr(), dsn, sc.tuned, logPath), sc.tuned)
	} else {
		c, err = startChild(sc.name, h.logPath(sc), h.flowrunEnv, h.flowrun, "run", h.pipelines[sc.pipeline], "--redis", h.srv.url(), "--var", "dsn="+dsn)
	}
	if err != nil {
		return result{failed: err.Error()}
	}
	defer stopChild(c, &res)
	rows := func() (int, error) {
		var n int
		err := conn.QueryRow(ctx, "SELECT count(*) FROM "+sqlTable).Scan(&n)
		return n, err
	}
	if err := untilCount(c, rows, "rows", warm, time.Minute); err != nil {
		return result{failed: "warm-up: " + err.Error()}
	}
	cpu0 := h.cpus(c)
	t0 := time.Now()
	if err := untilCount(c, rows, "rows", warm+flat, 5*time.Minute); err != nil {
		return result{failed: err.Error()}
	}
	res = h.measured(c, flat, t0, time.Now(), cpu0)
	if n, err := rows(); err != nil || n != warm+flat {
		return result{failed: fmt.Sprintf("%d rows (%v), want %d", n, err, warm+flat)}
	}
	res.note("rows/s")
	return res
}

// untilCount polls count until it reaches want, while the system's process c runs, for at most
// deadline.
func untilCount(c *child, count func() (int, error), what string, want int, deadline time.Duration) error {
	for end := time.Now().Add(deadline); ; time.Sleep(10 * time.Millisecond) {
		n, err := count()
		if err != nil || n >= want {
			return err
		}
		if c.exited() {
			return fmt.Errorf("the process exited: %s", c.logTail())
		}
		if time.Now().After(end) {
			return fmt.Errorf("%d of %d %s within %s", n, want, what, deadline)
		}
	}
}

// benthosSQLConfig is a redis_streams input into Benthos's sql_insert output. Every setting is at
// its default (the output's max_in_flight is 64, one INSERT per message), or, tuned, as the tuned
// set-ups of benthos.go: batches of 1000 through the pipeline, which sql_insert writes in one
// INSERT of many rows.
func benthosSQLConfig(redisAddr, dsn string, tuned bool, logPath string) string {
	var b strings.Builder
	port, _ := freePort()
	fmt.Fprintf(&b, "http:\n  address: 127.0.0.1:%d\n", port)
	fmt.Fprintf(&b, "logger:\n  level: WARN\n  file:\n    path: %q\n", logPath)
	input := fmt.Sprintf("redis_streams:\n  url: redis://%s\n  streams: [ %q ]\n  consumer_group: bb1\n  body_key: payload\n", redisAddr, benthosSQLIn)
	if tuned {
		input += fmt.Sprintf("  limit: %d\n  auto_replay_nacks: false\n", *benthosBatch)
		input = "broker:\n  inputs:\n    - " + strings.ReplaceAll(strings.TrimSuffix(input, "\n"), "\n", "\n      ") +
			fmt.Sprintf("\n  batching:\n    count: %d\n    period: 10ms\n", *benthosBatch)
		b.WriteString("metrics:\n  none: {}\n")
	}
	b.WriteString("input:\n  " + strings.ReplaceAll(strings.TrimSuffix(input, "\n"), "\n", "\n  ") + "\n")
	fmt.Fprintf(&b, "output:\n  sql_insert:\n    driver: postgres\n    dsn: %q\n    table: %s\n    columns: [ seq, k, amount, at ]\n"+
		"    args_mapping: 'root = [ this.seq, this.key, this.amount, this.at ]'\n", dsn, sqlTable)
	return b.String()
}
