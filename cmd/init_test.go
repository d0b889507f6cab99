package cmd

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// flowrun init writes a pipeline that validate accepts, whose test passes, and a README that says
// how to run it; a second init into the same directory refuses and writes nothing.
func TestInitWritesAPipelineThatPassesItsTest(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "my shop")
	code, out, errOut := run(t, "init", dir)
	if code != ExitOK || !strings.Contains(out, "pipeline.hcl") || !strings.Contains(out, "pipeline.flowtest.hcl") {
		t.Fatalf("init: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := run(t, "validate", dir); code != ExitOK || !strings.Contains(out, `pipeline "my_shop" is valid`) || !strings.Contains(out, "1 test file") {
		t.Fatalf("validate: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := run(t, "test", dir); code != ExitOK || !strings.Contains(out, "1 passed, 0 failed") {
		t.Fatalf("test: exit %d\n%s%s", code, out, errOut)
	}
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil || !strings.Contains(string(readme), "flowrun run --until-drained '"+dir+"'") || !strings.Contains(string(readme), "# my_shop") {
		t.Fatalf("README.md (%v):\n%s", err, readme)
	}

	// The README's run command, as written, on the embedded Redis.
	totals := filepath.Join(t.TempDir(), "totals.jsonl")
	if code, _, errOut := run(t, "run", "--until-drained", dir, "--var", "output="+totals); code != ExitOK {
		t.Fatalf("run: exit %d\n%s", code, errOut)
	}
	if b, err := os.ReadFile(totals); err != nil || strings.Count(string(b), "\n") != 4 {
		t.Fatalf("run wrote (%v):\n%s", err, b)
	}

	if err := os.WriteFile(filepath.Join(dir, "pipeline.hcl"), []byte("# mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, "README.md")); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := run(t, "init", dir); code != ExitError || !strings.Contains(errOut, " exists; init writes only into a directory without its files, and wrote nothing") {
		t.Fatalf("init over existing files: exit %d\n%s", code, errOut)
	}
	if _, err := os.Stat(filepath.Join(dir, "README.md")); err == nil {
		t.Fatal("init refused, yet wrote README.md")
	}
	if code, _, errOut := run(t, "init", t.TempDir(), "--name", "9 lives"); code != ExitInvalid || !strings.Contains(errOut, "--name") {
		t.Fatalf("init --name with a bad name: exit %d\n%s", code, errOut)
	}
}
