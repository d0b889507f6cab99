package cmd

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// brokenOutput is a standard output that cannot be written, like a closed pipe or a full disk.
type brokenOutput struct{}

func (brokenOutput) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// TestOutputThatCannotBeWrittenFails: a command whose result cannot be written to standard output
// ends with exit code 1 and says why, instead of exiting 0 with a short output.
func TestOutputThatCannotBeWrittenFails(t *testing.T) {
	for _, args := range [][]string{
		{"version"},
		{"validate", examples + "/fanout"},
		{"test", examples + "/fanout"},
	} {
		var errOut strings.Builder
		code := Execute(context.Background(), args, IO{In: strings.NewReader(""), Out: brokenOutput{}, Err: &errOut})
		if code != ExitError || !strings.Contains(errOut.String(), "no space left on device") {
			t.Errorf("flowrun %s: exit code %d, stderr %q; want %d and the write error", strings.Join(args, " "), code, errOut.String(), ExitError)
		}
	}
}
