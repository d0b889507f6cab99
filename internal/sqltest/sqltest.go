// Package sqltest gives tests databases of their own on the machine's PostgreSQL (127.0.0.1:5432,
// user postgres, trust) and MariaDB or MySQL (127.0.0.1:3306, root without a password): each test
// creates a database of a unique name, flowrun_test_sql_<random>, and drops it when it ends; it
// touches nothing else. Where a server is not there, its tests are skipped, unless
// FLOWRUN_REQUIRE_TOOLS is set (as in CI), when they fail. FLOWRUN_TEST_POSTGRES and
// FLOWRUN_TEST_MYSQL name other servers (a DSN without a database).
package sqltest

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver
)

// DB is a database of a test's own.
type DB struct {
	Driver string // "postgres" or "mysql", as the sql sink's driver attribute says
	Name   string // the database's name
	// Addr is the server's host:port; DSN connects to the database through it, and DSNVia
	// through another address (a proxy).
	Addr string
	SQL  *sql.DB
}

// DSN is the connection string of the database, for the sql sink.
func (d *DB) DSN() string { return d.DSNVia(d.Addr) }

// DSNVia is the connection string of the database at another address (a proxy in front of it).
func (d *DB) DSNVia(addr string) string {
	host, port, _ := net.SplitHostPort(addr)
	if d.Driver == "postgres" {
		return fmt.Sprintf("postgres://postgres@%s:%s/%s?sslmode=disable&connect_timeout=5", host, port, d.Name)
	}
	return fmt.Sprintf("root@tcp(%s:%s)/%s?timeout=5s", host, port, d.Name)
}

// Exec runs statements, failing the test on an error.
func (d *DB) Exec(t testing.TB, statements ...string) {
	t.Helper()
	for _, s := range statements {
		if _, err := d.SQL.Exec(s); err != nil {
			t.Fatalf("%s: %s: %v", d.Driver, s, err)
		}
	}
}

// Count runs a query that returns one number.
func (d *DB) Count(t testing.TB, query string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := d.SQL.QueryRow(query, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %s: %v", d.Driver, query, err)
	}
	return n
}

// server is one of the machine's database servers.
type server struct {
	driver string
	addr   string
	admin  func(addr string) string // the DSN of the admin database
}

var servers = []server{
	{"postgres", envOr("FLOWRUN_TEST_POSTGRES", "127.0.0.1:5432"), func(addr string) string {
		return "postgres://postgres@" + addr + "/postgres?sslmode=disable&connect_timeout=5"
	}},
	{"mysql", envOr("FLOWRUN_TEST_MYSQL", "127.0.0.1:3306"), func(addr string) string {
		return "root@tcp(" + addr + ")/?timeout=5s"
	}},
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func driverName(driver string) string {
	if driver == "postgres" {
		return "pgx"
	}
	return "mysql"
}

// Each runs test once per database server, as a subtest named after its driver, with a new
// database that the subtest drops when it ends.
func Each(t *testing.T, test func(t *testing.T, db *DB)) {
	for _, s := range servers {
		t.Run(s.driver, func(t *testing.T) { test(t, New(t, s.driver)) })
	}
}

// New creates a database of the test's own on the server of driver ("postgres" or "mysql").
func New(t testing.TB, driver string) *DB {
	t.Helper()
	var s server
	for _, c := range servers {
		if c.driver == driver {
			s = c
		}
	}
	admin, err := sql.Open(driverName(driver), s.admin(s.addr))
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err = admin.PingContext(ctx)
		cancel()
	}
	if err != nil {
		if os.Getenv("FLOWRUN_REQUIRE_TOOLS") != "" {
			t.Fatalf("the %s server at %s: %v", driver, s.addr, err)
		}
		t.Skipf("no %s server at %s: %v", driver, s.addr, err)
	}
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "flowrun_test_sql_" + hex.EncodeToString(b)
	if _, err := admin.Exec("CREATE DATABASE " + name); err != nil {
		t.Fatalf("%s: creating database %s: %v", driver, name, err)
	}
	db := &DB{Driver: driver, Name: name, Addr: s.addr}
	db.SQL, err = sql.Open(driverName(driver), db.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = db.SQL.Close()
		drop := "DROP DATABASE IF EXISTS " + name
		if driver == "postgres" {
			drop += " WITH (FORCE)" // connections a killed process left
		}
		if _, err := admin.Exec(drop); err != nil {
			t.Errorf("%s: dropping database %s: %v", driver, name, err)
		}
		_ = admin.Close()
	})
	return db
}

// MySQLError reports whether err is a MySQL error with that number.
func MySQLError(err error, number uint16) bool {
	me, ok := err.(*mysql.MySQLError)
	return ok && me.Number == number
}

// Proxy is a TCP proxy on a free loopback port in front of a server. Cut resets every connection
// through it, and each new one as soon as it is made (counted by Refused), until Restore: to the
// client, the server is gone.
type Proxy struct {
	target  string
	ln      net.Listener
	mu      sync.Mutex
	down    bool
	refused int
	conns   map[net.Conn]bool
}

// NewProxy starts a proxy in front of target; it stops when the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p := &Proxy{target: target, conns: map[net.Conn]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.ln = ln
	go p.serve()
	t.Cleanup(func() {
		_ = ln.Close()
		p.Cut()
	})
	return p
}

// Addr is the proxy's address.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.pipe(c)
	}
}

// reset closes a connection with a TCP reset, as a server that died does.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

func (p *Proxy) pipe(c net.Conn) {
	p.mu.Lock()
	if p.down {
		p.refused++
		p.mu.Unlock()
		reset(c)
		return
	}
	p.mu.Unlock()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		reset(c)
		return
	}
	p.mu.Lock()
	if p.down {
		p.refused++
		p.mu.Unlock()
		reset(c)
		reset(s)
		return
	}
	p.conns[c], p.conns[s] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(s, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, s); done <- struct{}{} }()
	<-done
	reset(c)
	reset(s)
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, s)
	p.mu.Unlock()
}

// Cut resets every connection through the proxy, and every new one until Restore.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
	for c := range p.conns {
		reset(c)
	}
}

// Restore lets connections through again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
}

// Refused is how many connections the proxy has reset as they were made while cut.
func (p *Proxy) Refused() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.refused
}

// Quote quotes an identifier for the driver.
func Quote(driver, name string) string {
	if driver == "postgres" {
		return `"` + strings.ReplaceAll(name, `"`, `""`) + `"`
	}
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}
