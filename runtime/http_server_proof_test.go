package runtime_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/flowrun/flowrun/internal/redistest"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestHTTPServerSourceSurvivesKills is the http_server source's proof: 20 clients post events in
// requests of 1 to 100 lines (1 to 500 and 100,000 events with -soak) to a flowrun process that is
// SIGKILLed twice and started again, retrying every request that was refused or cut off with its
// idempotency key. With effectively-once delivery every event arrives exactly once. Hostile
// requests meanwhile get their status and write nothing.
func TestHTTPServerSourceSurvivesKills(t *testing.T) {
	events, most := 4000, 100
	if *soakFlag {
		events, most = 100000, 500
	}
	const clients = 20
	srv := redistest.Start(t)
	c := openURLs(t, srv.URL())
	addr := freeAddr(t)
	prefix := fmt.Sprintf("hsproof-%d", prefixes.Add(1))
	path := filepath.Join(t.TempDir(), "pipeline.hcl")
	writeFile(t, path, fmt.Sprintf(`
pipeline "hsproof" {
  key_prefix = %q
  delivery   = "effectively_once"
}
topic "events" {
  partitions = 4
  key        = msg.c
}
source "hooks" {
  kind       = "http_server"
  output     = topic.events
  address    = %q
  path       = "/events"
  auth_token = "t0ken"
}
sink "out" {
  kind  = "file"
  input = topic.events
  path  = %q
}
`, prefix, addr, filepath.Join(t.TempDir(), "out.jsonl")))
	start := func() *process {
		p := startProcess(t, "run", path, "--redis", srv.URL())
		waitFor(t, "the source to listen", func() bool { return strings.Contains(p.log.String(), "taking messages over HTTP") })
		return p
	}
	proc := start()
	url := "http://" + addr + "/events"
	client := &http.Client{Timeout: time.Minute}
	defer client.CloseIdleConnections()

	var answered atomic.Int64
	var wg sync.WaitGroup
	per := events / clients
	for cl := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(cl), 7))
			for r, next := 0, 0; next < per; r++ {
				n := min(1+rng.IntN(most), per-next)
				var body bytes.Buffer
				for i := next; i < next+n; i++ {
					fmt.Fprintf(&body, `{"c":"c%d","i":%d}`+"\n", cl, i)
				}
				key := fmt.Sprintf("c%d-r%d", cl, r)
				for {
					req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body.Bytes()))
					req.Header.Set("Content-Type", "application/x-ndjson")
					req.Header.Set("Authorization", "Bearer t0ken")
					req.Header.Set("Idempotency-Key", key)
					resp, err := client.Do(req)
					if err == nil {
						_, _ = io.Copy(io.Discard, resp.Body)
						_ = resp.Body.Close()
						if resp.StatusCode == http.StatusAccepted {
							break
						}
						if resp.StatusCode != http.StatusServiceUnavailable && resp.StatusCode != http.StatusTooManyRequests {
							t.Errorf("client %d: request %s answered %d", cl, key, resp.StatusCode)
							return
						}
					}
					time.Sleep(20 * time.Millisecond) // refused or cut off: again, with the same key
				}
				next += n
				answered.Add(int64(n))
			}
		}()
	}

	hostile := hostileRequests(t, url)
	for _, part := range []int64{3, 2} { // SIGKILL at a third and at a half of the events
		waitFor(t, "the clients to get on", func() bool { return answered.Load() >= int64(events)/part })
		proc.kill(t)
		proc = start()
	}
	wg.Wait()
	if rss := peakRSS(proc); rss != "" {
		t.Logf("the last process's peak RSS: %s", rss)
	}
	if err := proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := waitProcess(t, proc); err != nil {
		t.Fatalf("the last process did not stop cleanly: %v\n%s", err, proc.log.String())
	}
	hostile()

	// Every event is in the topic exactly once.
	seen := map[string]int{}
	for _, stream := range (redis.Keys{Prefix: prefix}).Streams("events", 4) {
		after := "0"
		for {
			recs, err := c.Read(context.Background(), stream, after, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) == 0 {
				break
			}
			for _, r := range recs {
				m := jsonObject(t, string(r.Payload))
				seen[fmt.Sprintf("%v/%v", m["c"], m["i"])]++
				after = r.ID
			}
		}
	}
	missing, twice := 0, 0
	for cl := range clients {
		for i := range per {
			switch seen[fmt.Sprintf("c%d/%d", cl, i)] {
			case 0:
				missing++
			case 1:
			default:
				twice++
			}
		}
	}
	if missing+twice > 0 || len(seen) != clients*per {
		t.Errorf("of %d events, %d are missing and %d are in the topic more than once (%d distinct in all)", clients*per, missing, twice, len(seen))
	}
}

// hostileRequests sends requests that must be refused, while the proof runs, and returns a function
// that checks what they got. Connections cut by a kill are sent again.
func hostileRequests(t *testing.T, url string) (check func()) {
	deep := strings.Repeat(`{"a":`, 10000) + "1" + strings.Repeat("}", 10000)
	cases := []struct {
		name, body, auth string
		length           int64
		want             int
	}{
		{"10,000-deep JSON", deep, "Bearer t0ken", 0, http.StatusBadRequest},
		{"invalid UTF-8", "{\"c\":\"hostile\",\"i\":\"\xff\xfe\"}", "Bearer t0ken", 0, http.StatusBadRequest},
		{"a 2 GB Content-Length", `{"c":"hostile"}`, "Bearer t0ken", 2 << 30, http.StatusRequestEntityTooLarge},
		{"no token", `{"c":"hostile","i":0}`, "", 0, http.StatusUnauthorized},
	}
	got := make([]int, len(cases))
	var wg sync.WaitGroup
	for i, hc := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(hc.body))
				if hc.length > 0 {
					pr, pw := io.Pipe()
					go func() { _, _ = pw.Write([]byte(hc.body)); time.Sleep(time.Second); _ = pw.Close() }()
					req, _ = http.NewRequest(http.MethodPost, url, pr)
					req.ContentLength = hc.length
				}
				req.Header.Set("Content-Type", "application/json")
				if hc.auth != "" {
					req.Header.Set("Authorization", hc.auth)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				_ = resp.Body.Close()
				if got[i] = resp.StatusCode; got[i] != http.StatusServiceUnavailable {
					return
				}
			}
		}()
	}
	// A slow client: it sends half its headers and holds the connection.
	slow, err := net.Dial("tcp", strings.TrimPrefix(strings.TrimSuffix(url, "/events"), "http://"))
	if err == nil {
		_, _ = slow.Write([]byte("POST /events HTTP/1.1\r\nHost: x\r\n"))
	}
	return func() {
		wg.Wait()
		for i, hc := range cases {
			if got[i] != hc.want {
				t.Errorf("%s: answered %d, want %d", hc.name, got[i], hc.want)
			}
		}
		if slow != nil {
			_ = slow.Close()
		}
		http.DefaultClient.CloseIdleConnections()
	}
}

// peakRSS returns a process's peak resident set size as /proc says it, "" where it cannot.
func peakRSS(p *process) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:"))
		}
	}
	return ""
}
