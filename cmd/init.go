package cmd

import (
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/spf13/cobra"
)

// initFiles are the files flowrun init writes, with {{NAME}} and {{DIR}} filled in.
//
//go:embed initfiles
var initFiles embed.FS

func newInitCommand(stdio IO) *cobra.Command {
	var name string
	c := &cobra.Command{
		Use:   "init DIR",
		Short: "Write a starter pipeline, its test and a README into a directory",
		Long: "init writes a small pipeline into DIR (created if missing): a file source with sample data, a " +
			"filter, an aggregate per customer and minute and a file sink (pipeline.hcl, data/orders.jsonl), " +
			"its test (tests/pipeline.flowtest.hcl) and a README.md that says how to validate, test, run and " +
			"reset it. It refuses to overwrite a file that exists, and writes nothing then.",
		Example: "  flowrun init shop && flowrun test shop",
		Args:    cobra.ExactArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			if name != "" && (nonIdentifier.MatchString(name) || name[0] >= '0' && name[0] <= '9') {
				return exitError{code: ExitInvalid, message: fmt.Sprintf("--name %q: a pipeline's name is a letter or '_' followed by letters, digits or '_'", name)}
			}
			written, err := writeStarter(args[0], name)
			if err != nil {
				return exitError{code: ExitError, message: err.Error()}
			}
			p := &printer{w: stdio.Out}
			for _, w := range written {
				p.printf("wrote %s\n", w)
			}
			p.printf("next: flowrun test %s\n", args[0])
			return p.err
		},
	}
	c.Flags().StringVar(&name, "name", "", "the pipeline's name (default: DIR's base name, made an identifier)")
	return c
}

var nonIdentifier = regexp.MustCompile(`[^A-Za-z0-9_]+`)

// pipelineName makes an HCL identifier of a directory's name: "my shop" is my_shop, "2024" is p_2024.
func pipelineName(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	name := strings.Trim(nonIdentifier.ReplaceAllString(filepath.Base(abs), "_"), "_")
	switch {
	case name == "":
		return "starter"
	case name[0] >= '0' && name[0] <= '9':
		return "p_" + name
	}
	return name
}

var shellSafe = regexp.MustCompile(`^[A-Za-z0-9_./=:-]+$`)

// shellWord quotes a path for a POSIX shell when it needs it, for the commands of the README.
func shellWord(s string) string {
	if shellSafe.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// writeStarter writes the starter files into dir, or none of them when one exists already, and
// returns the paths it wrote.
func writeStarter(dir, name string) ([]string, error) {
	if name == "" {
		name = pipelineName(dir)
	}
	type file struct {
		path string
		data []byte
	}
	var files []file
	err := fs.WalkDir(initFiles, "initfiles", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := initFiles.ReadFile(path)
		if err != nil {
			return err
		}
		text := strings.NewReplacer("{{NAME}}", name, "{{DIR}}", shellWord(dir)).Replace(string(b))
		files = append(files, file{filepath.Join(dir, filepath.FromSlash(strings.TrimPrefix(path, "initfiles/"))), []byte(text)})
		return nil
	})
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if _, err := os.Stat(f.path); err == nil {
			return nil, fmt.Errorf("%s exists; init writes only into a directory without its files, and wrote nothing", f.path)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
	}
	var written []string
	for _, f := range files {
		if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
			return written, err
		}
		if err := os.WriteFile(f.path, f.data, 0o644); err != nil {
			return written, err
		}
		written = append(written, f.path)
	}
	return written, nil
}
