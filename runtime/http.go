package runtime

import (
	"net/http"
)

// NewHTTPHandler serves a running pipeline's health, readiness and metrics:
//
//   - /healthz answers 200 "ok" as long as the process serves requests;
//   - /readyz answers 200 once Ready reports nothing wrong, and 503 with the reason until then;
//   - /metrics is served by metrics (a Prometheus handler, say); when metrics is nil it answers 404.
//
// The handler only reads: it changes nothing in the pipeline or in Redis.
func NewHTTPHandler(rt *Runtime, metrics http.Handler) http.Handler {
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
