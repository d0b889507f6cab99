// Package web serves a running pipeline over HTTP for the people and programs that watch it:
// health and readiness probes, the metrics endpoint, /api/graph (the plan's graph with what each
// node and edge is doing now) and the live page that draws it (index.html, app.js and style.css in
// this directory, embedded in the binary). Package cmd wires it to flowrun run's --http flag.
//
//   - web.go: NewHandler, its routes and the page's static files.
//   - graph.go: the /api/graph document, the graph's shape combined with a runtime Snapshot.
//   - layout.go: where the page draws each node and edge, in bands of layers that fit a landscape
//     screen. The nodes, edges and labels come from flow's Plan.Graph, the same view that flowrun
//     graph renders as DOT and Mermaid.
//
// It only reads: it works from the runtime's public Snapshot, Ready, Plan and History, changes
// nothing in the pipeline or in Redis, and knows nothing of workers, leases or transport types.
package web

import (
	"embed"
	"net/http"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/runtime"
)

// Pipeline is what the handler reads of a running pipeline; *runtime.Runtime is one. One that also
// has a History method (as *runtime.Runtime has) gives the page its sparklines.
type Pipeline interface {
	// Plan is the compiled pipeline being run.
	Plan() *flow.Plan
	// Snapshot is what the pipeline is doing now.
	Snapshot() runtime.Snapshot
	// Ready says what keeps the pipeline from being ready, or nil when it is.
	Ready() error
}

// NewHandler serves a running pipeline's health, readiness, metrics and a live page of its graph:
//
//   - /healthz answers 200 "ok" as long as the process serves requests;
//   - /readyz answers 200 once Ready reports nothing wrong, and 503 with the reason until then;
//   - /metrics is served by metrics (a Prometheus handler, say); when metrics is nil it answers 404;
//   - /api/graph is the plan (as Plan.Describe gives it, sensitive values redacted) with what each
//     node and edge is doing now, and where to draw each node;
//   - / is a page that draws the graph from /api/graph every second, fitted to the window, with a
//     card per node below it (on a phone, the cards alone).
//
// The handler only reads: it changes nothing in the pipeline or in Redis. Counters and rates are this
// process's; lag, pending entries and dead-letter lengths are read from Redis and so cover every
// process running the pipeline.
func NewHandler(rt Pipeline, metrics http.Handler) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeText(w, http.StatusOK, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := rt.Ready(); err != nil {
			writeText(w, http.StatusServiceUnavailable, "not ready: "+rt.Plan().Redact(err.Error()))
			return
		}
		writeText(w, http.StatusOK, "ready")
	})
	if metrics != nil {
		mux.Handle("/metrics", metrics)
	} else {
		mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
			writeText(w, http.StatusNotFound, "metrics are not enabled in this process")
		})
	}
	mux.Handle("GET /api/graph", newGraphHandler(rt))
	mux.Handle("/", pageHandler())
	return mux
}

// writeText answers with one line of plain text.
func writeText(w http.ResponseWriter, status int, line string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(line + "\n"))
}

// The page: index.html, app.js and style.css, served as they are. They load nothing from elsewhere,
// and the Content-Security-Policy keeps it that way.

//go:embed index.html app.js style.css
var pageFiles embed.FS

func pageHandler() http.Handler {
	static := http.FileServerFS(pageFiles)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeText(w, http.StatusMethodNotAllowed, "method not allowed")
			return
		}
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "+
			"img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		static.ServeHTTP(w, r)
	})
}
