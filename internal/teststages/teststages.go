// Package teststages registers Go stage functions for tests that must run the same function in
// the test binary and in the flowrun binaries the tests build and start: a blank import registers
// them in both.
package teststages

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/flowrun/flowrun/stages"
)

func init() { stages.Register("test.call", call, stages.KeepsKey()) }

// call sends the message, as JSON, to the URL in its field url, and does what the answer says:
// 2xx passes the message on; 503 is a transient failure (the service is away); another 5xx a
// failure that the stage's retry policy retries; any other status a permanent failure. An error
// of the request itself (a refused connection, a timeout) is returned as it is.
func call(ctx context.Context, m stages.Message) ([]stages.Message, error) {
	url, _ := m.Value["url"].(string)
	body, err := json.Marshal(m.Value)
	if err != nil {
		return nil, stages.Permanent(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, stages.Permanent(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close() // read to its end: only the status matters
	err = fmt.Errorf("test.call: %s answered %s", url, resp.Status)
	switch {
	case resp.StatusCode/100 == 2:
		return []stages.Message{m}, nil
	case resp.StatusCode == http.StatusServiceUnavailable:
		return nil, stages.Transient(err)
	case resp.StatusCode >= 500:
		return nil, err
	default:
		return nil, stages.Permanent(err)
	}
}
