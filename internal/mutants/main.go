// Command mutants checks that the test suite catches the bugs that would lose, duplicate or
// reorder messages: it applies each mutation of its list, one at a time, to a copy of the tree and
// runs the tests that should catch it. A mutation the tests do not catch (a survivor) means a
// safety path without a test that guards it; the command exits 1 then.
//
// It runs on demand (make mutants), not in CI: each mutation costs a run of its packages' tests.
// The list grows with every issue that adds a safety path. A mutation whose code is no longer
// there (its text is not found exactly once) fails the run too: update it with the code.
//
//	go run ./internal/mutants                # every mutation
//	go run ./internal/mutants -run fence     # those whose name matches
//	go run ./internal/mutants -list          # the list
//	go run ./internal/mutants -check         # only whether each still applies (after moving code)
//	go run ./internal/mutants -tests TestX   # whether the tests TestX alone catch each
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

func main() {
	run := flag.String("run", "", "only the mutations whose name matches this regular expression")
	list := flag.Bool("list", false, "print the mutations and exit")
	race := flag.Bool("race", true, "run the tests with the race detector, as make test does")
	check := flag.Bool("check", false, "only check that every mutation applies and compiles (after moving code), without running tests")
	tests := flag.String("tests", "", "run only the tests whose name matches this regular expression (go test -run), to see whether they alone catch a mutation")
	flag.Parse()
	if *list {
		for _, m := range mutations {
			fmt.Printf("%-28s %s (%s)\n", m.name, m.why, m.file)
		}
		return
	}
	match, err := regexp.Compile(*run)
	if err != nil {
		fatal(err)
	}
	root, err := repoRoot()
	if err != nil {
		fatal(err)
	}
	var survivors, stale []string
	for _, m := range mutations {
		if !match.MatchString(m.name) {
			continue
		}
		start := time.Now()
		res := m.try(root, *race, *check, *tests)
		fmt.Printf("%-28s %-9s %6s  %s\n", m.name, res.verdict, time.Since(start).Round(time.Second), res.detail)
		switch res.verdict {
		case "SURVIVED":
			survivors = append(survivors, m.name)
		case "STALE":
			stale = append(stale, m.name)
		}
	}
	if len(survivors)+len(stale) > 0 {
		fmt.Printf("\n%d survived (%s), %d stale (%s)\n", len(survivors), strings.Join(survivors, ", "),
			len(stale), strings.Join(stale, ", "))
		os.Exit(1)
	}
	if *check {
		fmt.Println("\nevery mutation applies")
		return
	}
	fmt.Println("\nevery mutation was caught")
}

// mutation is a bug the tests must catch: the text find, which occurs exactly once in file,
// becomes replace.
type mutation struct {
	name, why     string
	file          string
	find, replace string
	// packages are the tests that should catch it; default ./...
	packages []string
}

// result is what a mutation's test run came to.
type result struct {
	verdict string // KILLED, SURVIVED or STALE; APPLIES with -check
	detail  string
}

func (m mutation) try(root string, race, checkOnly bool, tests string) result {
	dir, err := os.MkdirTemp("", "flowrun-mutant-")
	if err != nil {
		fatal(err)
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			fmt.Fprintln(os.Stderr, "mutants: leaving the copy of the tree behind:", err)
		}
	}()
	if err := copyTree(root, dir); err != nil {
		fatal(err)
	}
	path := filepath.Join(dir, m.file)
	src, err := os.ReadFile(path)
	if err != nil {
		return result{"STALE", err.Error()}
	}
	if n := bytes.Count(src, []byte(m.find)); n != 1 {
		return result{"STALE", fmt.Sprintf("its code is found %d times in %s, not once", n, m.file)}
	}
	if err := os.WriteFile(path, bytes.Replace(src, []byte(m.find), []byte(m.replace), 1), 0o644); err != nil {
		fatal(err)
	}
	// A mutation that does not compile proves nothing: it is stale too.
	vet := exec.Command("go", "vet", "./"+filepath.Dir(m.file))
	vet.Dir = dir
	if out, err := vet.CombinedOutput(); err != nil {
		return result{"STALE", "the mutated code does not compile: " + firstLine(string(out))}
	}
	if checkOnly {
		return result{"APPLIES", "its code is found once and the mutant compiles"}
	}
	args := []string{"test", "-count=1", "-failfast", "-timeout", "20m"}
	if race {
		args = append(args, "-race")
	}
	if tests != "" {
		args = append(args, "-run", tests)
	}
	pkgs := m.packages
	if len(pkgs) == 0 {
		pkgs = []string{"./..."}
	}
	// One package after the other, the likeliest first: the first that fails settles it.
	for _, pkg := range pkgs {
		cmd := exec.Command("go", append(args, pkg)...)
		cmd.Dir = dir
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err == nil {
			continue
		}
		failed := failedTests(out.String())
		if len(failed) == 0 {
			return result{"KILLED", pkg + ": " + crash(out.String())}
		}
		return result{"KILLED", pkg + ": by " + strings.Join(failed, ", ")}
	}
	return result{"SURVIVED", "go test " + strings.Join(pkgs, " ") + " passed"}
}

var failLine = regexp.MustCompile(`(?m)^--- FAIL: (\S+)`)

// failedTests lists the top-level tests that failed in go test's output.
func failedTests(out string) []string {
	seen := map[string]bool{}
	for _, m := range failLine.FindAllStringSubmatch(out, -1) {
		seen[strings.SplitN(m[1], "/", 2)[0]] = true
	}
	names := make([]string, 0, len(seen))
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

var crashLine = regexp.MustCompile(`(?m)^(panic|fatal error): .*$`)

// crash says how a test binary that reported no failed test ended: a panic, a fatal error (a data
// race or a deadlock), a timeout, or else its last line.
func crash(out string) string {
	if m := crashLine.FindString(out); m != "" {
		return "the tests crashed: " + m
	}
	last := strings.TrimSpace(out)
	if i := strings.LastIndexByte(last, '\n'); i >= 0 {
		last = last[i+1:]
	}
	return "the build or the tests failed: " + last
}

// repoRoot is the top of the git checkout that holds the working directory.
func repoRoot() (string, error) {
	out, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("not in a git checkout: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

// copyTree copies the files git tracks, as they are in the working tree, from root to dir.
func copyTree(root, dir string) error {
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		return err
	}
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if err := copyFile(filepath.Join(root, name), filepath.Join(dir, name)); err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the working tree
			}
			return err
		}
	}
	return nil
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }() // read only: closing loses nothing
	st, err := in.Stat()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, st.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close() // the copy failed already: that is the error to report
		return err
	}
	return out.Close()
}

// firstLine is the first line of s that says something.
func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			return l
		}
	}
	return s
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "mutants:", err)
	os.Exit(2)
}
