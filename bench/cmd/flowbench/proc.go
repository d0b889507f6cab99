package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ, 100 on Linux).
const clockTick = 10 * time.Millisecond

// child is a system under test running as its own process, so that its CPU time and memory are
// its own: flowrun, the raw go-redis hops, the Watermill flows, the publishers.
type child struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	stdout  bytes.Buffer
	done    chan struct{}
	waitErr error
	peakKB  atomic.Int64 // the highest VmHWM seen while it ran (watchPeak)
}

// startChild starts a process whose standard error goes to logPath. Its environment is ours
// without FLOWRUN_* and OTEL_* (so that nothing of the developer's shell leaks into a run), plus
// extraEnv. It is killed if the harness dies.
func startChild(name, logPath string, extraEnv []string, bin string, args ...string) (*child, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	c := &child{name: name, logPath: logPath, done: make(chan struct{})}
	c.cmd = exec.Command(bin, args...)
	c.cmd.Stdout = &c.stdout
	c.cmd.Stderr = logFile
	c.cmd.Env = append(cleanEnv(), extraEnv...)
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go c.watchPeak()
	go func() {
		c.waitErr = c.cmd.Wait()
		_ = logFile.Close()
		close(c.done)
	}()
	return c, nil
}

// watchPeak samples the process's VmHWM every 5 ms until it ends. Its rusage cannot say the peak:
// Go starts a child with vfork semantics, sharing our memory until the exec, and Linux keeps the
// larger of that memory's high-water mark and the child's own as the child's ru_maxrss, so every
// child would weigh at least what the harness weighs (the 215-241 MB of every job once measured).
// VmHWM is the high-water mark of the child's own memory since its exec; a sample misses only what
// it grows in its last 5 ms.
func (c *child) watchPeak() {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, peak, err := c.memKB(); err == nil && peak > c.peakKB.Load() {
			c.peakKB.Store(peak)
		}
		select {
		case <-c.done:
			return
		case <-tick.C:
		}
	}
}

func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "FLOWRUN_") || strings.HasPrefix(kv, "OTEL_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// exited reports whether the process has ended.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// cpu returns the user+system CPU time the process has used so far, all threads included.
func (c *child) cpu() (time.Duration, error) { return procCPU(c.cmd.Process.Pid) }

// procCPU returns the user+system CPU time process pid has used so far.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseStatCPU(string(b))
}

// parseStatCPU reads utime and stime (fields 14 and 15) of a /proc/PID/stat line. The command
// name (field 2) may hold spaces and parentheses, so fields are counted after its last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("malformed /proc stat")
	}
	f := strings.Fields(stat[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, errors.New("malformed /proc stat")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, errors.New("malformed /proc stat")
	}
	return time.Duration(utime+stime) * clockTick, nil
}

// memKB returns VmRSS and VmHWM (the peak resident set) of the process, in KiB.
func (c *child) memKB() (rss, peak int64, err error) {
	return procMemKB(strconv.Itoa(c.cmd.Process.Pid))
}

// procMemKB returns VmRSS and VmHWM of /proc/PID (or /proc/self), in KiB.
func procMemKB(pid string) (rss, peak int64, err error) {
	b, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "VmRSS":
			dst = &rss
		case "VmHWM":
			dst = &peak
		default:
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err == nil {
			*dst = n
		}
	}
	return rss, peak, nil
}

// pause stops the process (SIGSTOP) and waits until it is stopped.
func (c *child) pause() error {
	if err := c.signal(syscall.SIGSTOP); err != nil {
		return err
	}
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.cmd.Process.Pid))
		if err != nil {
			return err
		}
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && strings.HasPrefix(string(b[i+1:]), " T") {
			return nil
		}
	}
	return fmt.Errorf("%s did not stop on SIGSTOP", c.name)
}

// signal sends sig to the process.
func (c *child) signal(sig syscall.Signal) error { return c.cmd.Process.Signal(sig) }

// stop sends SIGTERM and waits up to timeout for the process to exit, then kills it. It returns
// the exit error of a process that did not exit with status 0 (a kill counts as a failure).
func (c *child) stop(timeout time.Duration) error {
	if !c.exited() {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		_ = c.cmd.Process.Signal(syscall.SIGCONT) // in case it was left stopped
	}
	select {
	case <-c.done:
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("%s did not stop within %s after SIGTERM", c.name, timeout)
	}
	if c.waitErr != nil {
		return fmt.Errorf("%s: %v; %s", c.name, c.waitErr, c.logTail())
	}
	return nil
}

// wait waits for the process to exit on its own.
func (c *child) wait(timeout time.Duration) error {
	select {
	case <-c.done:
	case <-time.After(timeout):
		_ = c.cmd.Process.Kill()
		<-c.done
		return fmt.Errorf("%s did not finish within %s", c.name, timeout)
	}
	if c.waitErr != nil {
		return fmt.Errorf("%s: %v; %s", c.name, c.waitErr, c.logTail())
	}
	return nil
}

// maxRSSKB returns the peak resident set of a process that has exited, as watchPeak saw it.
func (c *child) maxRSSKB() int64 {
	return c.peakKB.Load()
}

// logTail returns the end of the process's standard error, for error messages.
func (c *child) logTail() string {
	b, err := os.ReadFile(c.logPath)
	if err != nil || len(b) == 0 {
		return "(no output; log " + c.logPath + ")"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	return "log " + c.logPath + ":\n    " + strings.Join(lines, "\n    ")
}
