package redis

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImportsNothingElseOfFlowrun keeps transport/redis the leaf of flowrun's packages: of flowrun
// it imports only transport/jsonscan (the payload rule), which imports only the standard library.
func TestImportsNothingElseOfFlowrun(t *testing.T) {
	allowed := map[string]func(path string) bool{
		".": func(path string) bool {
			return !strings.HasPrefix(path, "github.com/flowrun/flowrun") || path == "github.com/flowrun/flowrun/transport/jsonscan"
		},
		"../jsonscan": func(path string) bool { return !strings.Contains(strings.Split(path, "/")[0], ".") },
	}
	for dir, ok := range allowed {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", dir, err)
		}
		for _, name := range files {
			if strings.HasSuffix(name, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), name, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if !ok(path) {
					t.Errorf("%s imports %s", name, path)
				}
			}
		}
	}
}
