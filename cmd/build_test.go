package cmd

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/flowrun/flowrun/internal/redistest"
)

// flowrun build, run from an empty directory with no network (GOPROXY=off), makes a binary with a
// local copy of examples/plugins/acme compiled in, and that binary validates, tests and runs the
// pipeline that uses acme's function and sink kind, which this flowrun rejects. One go build of
// flowrun: 3 to 5 s with a warm build cache, 2m10s with an empty GOCACHE on a shared 2-core
// machine; the test takes about 15 s warm. The build that fails reuses the compiled packages.
func TestBuildWithALocalPlugin(t *testing.T) {
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	// Offline, flowrun build can use only what the module cache holds: on a fresh machine that
	// lacks the modules that only other platforms' builds import (cobra's mousetrap, for Windows),
	// which the generated module's go mod tidy needs. flowrun's own go mod tidy needs a superset of
	// them: run it first, with the network, changing nothing (-diff).
	prime := exec.Command("go", "mod", "tidy", "-diff")
	prime.Dir = repo
	if out, err := prime.CombinedOutput(); err != nil {
		t.Fatalf("go mod tidy -diff in %s, to fill the module cache: %v\n%s", repo, err, out)
	}
	t.Setenv("GOPROXY", "off")
	t.Setenv("GOFLAGS", "-mod=mod")
	pipeline := filepath.Join(repo, "examples", "plugins", "pipeline")
	// The plugin as its author has it: a module of its own, outside flowrun's.
	acme := filepath.Join(t.TempDir(), "acme")
	copyGoFiles(t, filepath.Join(repo, "examples", "plugins", "acme"), acme)
	writeFile(t, filepath.Join(acme, "go.mod"), "module example.com/acme\n\ngo 1.25.0\n")
	t.Chdir(t.TempDir())

	if code, out, errOut := run(t, "validate", pipeline); code != ExitInvalid || !strings.Contains(out+errOut, `"acme.score"`) {
		t.Fatalf("validate without acme: exit %d, want 2\n%s%s", code, out, errOut)
	}
	// The binary made says the version and commit of the flowrun that made it (-ldflags -X).
	defer func(v, c string) { Version, Commit = v, c }(Version, Commit)
	Version, Commit = "v0.0.0-buildtest", "cafe0000cafe0000cafe0000cafe0000cafe0000"
	start := time.Now()
	code, out, errOut := run(t, "build", "--with", "example.com/acme="+acme, "--flowrun", repo)
	if code != ExitOK || !strings.Contains(out, "wrote flowrun") || !strings.Contains(errOut, "go build") {
		t.Fatalf("build: exit %d\n%s%s", code, out, errOut)
	}
	t.Logf("flowrun build took %v", time.Since(start).Round(time.Millisecond))
	bin, err := filepath.Abs("flowrun") // the default -o
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "version").CombinedOutput(); err != nil || !strings.Contains(string(out), "[acme.score acme.velocity]") ||
		!strings.HasPrefix(string(out), "flowrun v0.0.0-buildtest\ncommit: cafe0000cafe0000cafe0000cafe0000cafe0000\n") {
		t.Fatalf("built flowrun version: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "validate", pipeline).CombinedOutput(); err != nil || !strings.Contains(string(out), "is valid") {
		t.Fatalf("built flowrun validate: %v\n%s", err, out)
	}
	if out, err := exec.Command(bin, "test", pipeline).CombinedOutput(); err != nil || !strings.Contains(string(out), " 0 failed") {
		t.Fatalf("built flowrun test: %v\n%s", err, out)
	}
	// A run on a real Redis: acme.score fails order 5 for good (exit 3), and the acme_csv sink
	// writes the four risky orders after its header row.
	srv := redistest.Start(t)
	sheet := filepath.Join(t.TempDir(), "risky.csv")
	runOut, err := exec.Command(bin, "run", pipeline, "--until-drained", "--redis", srv.URL(),
		"--var", "output="+filepath.Join(t.TempDir(), "risky.jsonl"), "--var", "sheet="+sheet,
		"--var", "bursts="+filepath.Join(t.TempDir(), "bursts.jsonl")).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
		t.Fatalf("built flowrun run: %v, want exit 3\n%s", err, runOut)
	}
	if csv, err := os.ReadFile(sheet); err != nil || !strings.HasPrefix(string(csv), "id,customer,risk\n") || strings.Count(string(csv), "\n") != 5 {
		t.Fatalf("the acme_csv sheet (%v):\n%s", err, csv)
	}

	// A package that does not compile: the compiler's error, located by the file's absolute path
	// (the go command ran in the temporary module, to which it names the file relative).
	writeFile(t, filepath.Join(acme, "broken", "broken.go"), "package broken\n\nvar n int = \"three\"\n")
	code, _, errOut = run(t, "build", "--with", "example.com/acme/broken="+acme, "--flowrun", repo, "-o", "broken")
	if code != ExitError || !strings.Contains(errOut, "go build failed") || !strings.Contains(errOut, "\n"+filepath.Join(acme, "broken", "broken.go")+":3:13: cannot use") {
		t.Fatalf("build of a package that does not compile: exit %d\n%s", code, errOut)
	}
}

// flowrun build's mistakes that need no go build: each is said before any build starts.
func TestBuildRefusesBadInput(t *testing.T) {
	repo, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	plain := t.TempDir() // a directory with no go.mod
	acme := t.TempDir()
	writeFile(t, filepath.Join(acme, "go.mod"), "module example.com/acme\n\ngo 1.25.0\n")
	t.Chdir(t.TempDir())
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"build", "--flowrun", repo}, ExitInvalid, "give one or more --with"},
		{[]string{"build", "--with", "example.com/acme@", "--flowrun", repo}, ExitInvalid, `--with "example.com/acme@": no version after '@'`},
		{[]string{"build", "--with", "Not A Path", "--flowrun", repo}, ExitInvalid, `--with "Not A Path": malformed import path`},
		{[]string{"build", "--with", "example.com/acme=" + acme, "--flowrun", repo, "-o", acme}, ExitInvalid, "-o " + acme + ": is a directory"},
		{[]string{"build", "--with", "example.com/x=" + plain, "--flowrun", repo}, ExitInvalid, "--with example.com/x=" + plain + ": not a Go module: " + plain + " has no go.mod"},
		{[]string{"build", "--with", "example.com/other=" + acme, "--flowrun", repo}, ExitInvalid, "the module there is example.com/acme, which does not contain package example.com/other"},
		{[]string{"build", "--with", "example.com/acme=" + acme, "--flowrun", plain}, ExitInvalid, "the flowrun checkout " + plain + ": not a Go module"},
	} {
		if code, out, errOut := run(t, c.args...); code != c.code || !strings.Contains(errOut, c.want) {
			t.Errorf("%s: exit %d, want %d and %q\n%s%s", strings.Join(c.args, " "), code, c.code, c.want, out, errOut)
		}
	}
	t.Setenv("PATH", t.TempDir())
	if code, _, errOut := run(t, "build", "--with", "example.com/acme="+acme, "--flowrun", repo); code != ExitError || !strings.Contains(errOut, "needs the Go toolchain: no go command on PATH") {
		t.Fatalf("build with no go on PATH: exit %d\n%s", code, errOut)
	}
	if entries, _ := os.ReadDir("."); len(entries) != 0 {
		t.Fatalf("a refused build wrote %v", entries)
	}
}

func copyGoFiles(t *testing.T, from, to string) {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(from, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s (%v)", from, err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(to, filepath.Base(f)), string(data))
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
