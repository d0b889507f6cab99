package cmd

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/flowrun/flowrun/internal/redistest"
)

// openPTY opens a pseudo-terminal: the program side (a terminal to isTerminal) and the side that
// types into it.
func openPTY(t *testing.T) (tty, typist *os.File) {
	t.Helper()
	typist, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { _ = typist.Close() })
	var unlock, n int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, typist.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
		t.Fatal(e)
	}
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, typist.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
		t.Fatal(e)
	}
	tty, err = os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tty.Close() })
	return tty, typist
}

// Without --yes, on a terminal, reset asks: any answer but yes deletes nothing, yes deletes.
func TestResetAsksOnATerminal(t *testing.T) {
	srv := redistest.Shared(t)
	path, prefix, _ := resetJob(t)
	if code, _, errOut := run(t, "run", "--until-drained", "--redis", srv.URL(), path); code != ExitDeadLettered {
		t.Fatalf("run: exit %d\n%s", code, errOut)
	}
	before := keysUnder(t, []string{srv.URL()}, prefix)

	answer := func(typed string) (int, string) {
		tty, typist := openPTY(t)
		if _, err := typist.WriteString(typed); err != nil {
			t.Fatal(err)
		}
		var out, errOut bytes.Buffer
		code := Execute(testContext(t), []string{"reset", "--redis", srv.URL(), path}, IO{In: tty, Out: &out, Err: &errOut})
		return code, out.String() + errOut.String()
	}
	if code, out := answer("no\n"); code != ExitError || !strings.Contains(out, "Type yes to go on") || !strings.Contains(out, "not reset") {
		t.Fatalf("answered no: exit %d\n%s", code, out)
	}
	if after := keysUnder(t, []string{srv.URL()}, prefix); len(after) != len(before) {
		t.Fatalf("answered no, yet keys went: %d before, %d after", len(before), len(after))
	}
	if code, out := answer("yes\n"); code != ExitOK || !strings.Contains(out, "reset p") {
		t.Fatalf("answered yes: exit %d\n%s", code, out)
	}
	if after := keysUnder(t, []string{srv.URL()}, prefix); len(after) >= len(before) {
		t.Fatalf("answered yes, yet %d of %d keys are left", len(after), len(before))
	}
}
