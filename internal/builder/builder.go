// Package builder makes a flowrun binary with extra Go packages compiled in, for `flowrun build`
// (as xcaddy does for Caddy): it writes a main module in a temporary directory whose main.go
// blank-imports each package and calls cmd.Main, requires flowrun at a version or replaces it with
// a local checkout, replaces each module given with a local path, and runs `go mod tidy` and
// `go build` there.
//
// It is internal: plugin authors use the command, not this API, which may change with it.
package builder

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strings"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
)

// FlowrunModule is the module path of flowrun itself, which every built binary requires.
const FlowrunModule = "github.com/flowrun/flowrun"

// EnvSource names a local flowrun checkout to build with, when --flowrun does not.
const EnvSource = "FLOWRUN_SOURCE"

// localVersion is the version a module replaced with a local directory is required at: the
// replacement applies to every version, and this one says that no published version is meant.
const localVersion = "v0.0.0-00010101000000-000000000000"

// Package is one --with: a Go package to compile in (its init registers kinds and functions), from
// the module at Version, or from the module in the local directory Dir.
type Package struct {
	Path    string // the import path, a module's root package or a package inside it
	Version string // a module version or query (v1.2.3, a commit, latest); empty: what go mod tidy picks
	Dir     string // a local module's directory; empty unless the spec had =PATH
}

// ParseWith parses a --with value: MODULE, MODULE@VERSION or MODULE=PATH.
func ParseWith(spec string) (Package, error) {
	p := Package{Path: spec}
	if path, dir, ok := strings.Cut(spec, "="); ok {
		if dir == "" {
			return Package{}, fmt.Errorf("--with %q: no path after '='", spec)
		}
		p.Path, p.Dir = path, dir
	} else if path, version, ok := strings.Cut(spec, "@"); ok {
		if version == "" {
			return Package{}, fmt.Errorf("--with %q: no version after '@'", spec)
		}
		p.Path, p.Version = path, version
	}
	if err := module.CheckImportPath(p.Path); err != nil {
		return Package{}, fmt.Errorf("--with %q: %v (want MODULE, MODULE@VERSION or MODULE=PATH)", spec, err)
	}
	return p, nil
}

// Flowrun says which flowrun the binary is built with: the checkout in Dir, or else the module at
// Version.
type Flowrun struct {
	Dir     string
	Version string
}

// RunningFlowrun returns the flowrun that the running binary was built from: the local checkout
// named by EnvSource, else the flowrun module's version (or commit) in the binary's build
// information. It fails when neither is known, as for a binary built by `go build` from a checkout
// with VCS stamping off: --flowrun PATH then names the checkout.
func RunningFlowrun() (Flowrun, error) {
	if dir := os.Getenv(EnvSource); dir != "" {
		return Flowrun{Dir: dir}, nil
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return Flowrun{}, errors.New("this binary has no build information to take flowrun's version from")
	}
	mod := &info.Main
	if mod.Path != FlowrunModule { // a built binary: flowrun is one of its dependencies
		mod = nil
		for _, d := range info.Deps {
			if d.Path == FlowrunModule {
				mod = d
			}
		}
	}
	if mod != nil && mod.Replace != nil && filepath.IsAbs(mod.Replace.Path) {
		if _, err := os.Stat(filepath.Join(mod.Replace.Path, "go.mod")); err == nil {
			return Flowrun{Dir: mod.Replace.Path}, nil // built by flowrun build with --flowrun
		}
	}
	if mod != nil && mod.Version != "" && mod.Version != "(devel)" {
		return Flowrun{Version: mod.Version}, nil
	}
	if mod == &info.Main {
		var revision, modified string
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if revision != "" && modified != "true" {
			return Flowrun{Version: revision}, nil
		}
	}
	return Flowrun{}, fmt.Errorf("this flowrun was built from a checkout with no version or commit recorded "+
		"(or with uncommitted changes): name the checkout with --flowrun PATH or %s", EnvSource)
}

// InputError is a mistake in what the build was given (a --with, -o, --flowrun), found before
// the go command runs: the command line is to be fixed, not the environment.
type InputError struct{ msg string }

func (e InputError) Error() string { return e.msg }

func inputErrorf(format string, args ...any) error { return InputError{fmt.Sprintf(format, args...)} }

// Options is one build.
type Options struct {
	Packages []Package
	Flowrun  Flowrun
	Output   string    // the binary to write
	LDFlags  string    // passed to go build -ldflags (the version, for flowrun version)
	Env      []string  // the go command's environment; nil: the process's
	Log      io.Writer // the go commands run, as they start; nil: not said
	KeepWork bool      // leave the temporary module in place (its directory is logged)
}

// Build writes the main module and builds the binary. Its errors say what failed: an InputError
// for a mistake in o; a failure of the go command with the go command's output (the compiler's
// errors).
func Build(ctx context.Context, o Options) error {
	if o.Log == nil {
		o.Log = io.Discard
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		return errors.New("flowrun build needs the Go toolchain: no go command on PATH (install Go from https://go.dev/dl/)")
	}
	if len(o.Packages) == 0 {
		return inputErrorf("no packages to build with: give one or more --with MODULE[@VERSION|=PATH]")
	}
	output, err := filepath.Abs(o.Output)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(output); err == nil && fi.IsDir() {
		return inputErrorf("-o %s: is a directory; name the binary to write", o.Output)
	}
	work, err := os.MkdirTemp("", "flowrun-build-")
	if err != nil {
		return err
	}
	if o.KeepWork {
		_, _ = fmt.Fprintf(o.Log, "the main module is in %s\n", work)
	} else {
		defer func() { _ = os.RemoveAll(work) }() // a temporary directory left behind harms nothing
	}
	if err := writeModule(work, o); err != nil {
		return err
	}
	env := o.Env
	if env == nil {
		env = os.Environ()
	}
	// The module is built alone: a go.work above the temporary directory must not take part.
	env = append(env, "GOWORK=off")
	goCmd := func(args ...string) error {
		_, _ = fmt.Fprintf(o.Log, "go %s\n", strings.Join(args, " "))
		c := exec.CommandContext(ctx, goBin, args...)
		c.Dir, c.Env = work, env
		out, err := c.CombinedOutput()
		if err != nil {
			name := args[0] // build, get, or mod tidy
			if name == "mod" {
				name += " " + args[1]
			}
			return fmt.Errorf("go %s failed (%v):\n%s", name, err, strings.TrimRight(locate(string(out), work), "\n"))
		}
		return nil
	}
	for _, p := range o.Packages {
		if p.Dir == "" && p.Version != "" {
			if err := goCmd("get", p.Path+"@"+p.Version); err != nil {
				return err
			}
		}
	}
	if err := goCmd("mod", "tidy"); err != nil {
		return err
	}
	args := []string{"build", "-mod=mod", "-o", output}
	if o.LDFlags != "" {
		args = append(args, "-ldflags", o.LDFlags)
	}
	return goCmd(append(args, ".")...)
}

// writeModule writes go.mod, go.sum and main.go into dir.
func writeModule(dir string, o Options) error {
	f := &modfile.File{}
	if err := f.AddModuleStmt("flowrun-build"); err != nil {
		return err
	}
	if err := f.AddGoStmt("1.25.0"); err != nil {
		return err
	}
	var sums [][]byte // go.sum files of the local modules, so that no checksum is looked up
	replace := func(modPath, modDir string) error {
		if err := f.AddRequire(modPath, localVersion); err != nil {
			return err
		}
		if err := f.AddReplace(modPath, "", modDir, ""); err != nil {
			return err
		}
		if sum, err := os.ReadFile(filepath.Join(modDir, "go.sum")); err == nil {
			sums = append(sums, sum)
		}
		return nil
	}
	switch {
	case o.Flowrun.Dir != "":
		dir, modPath, err := localModule(o.Flowrun.Dir)
		if err != nil {
			return inputErrorf("the flowrun checkout %s: %v", o.Flowrun.Dir, err)
		}
		if modPath != FlowrunModule {
			return inputErrorf("the flowrun checkout %s: its go.mod is module %s, not %s", o.Flowrun.Dir, modPath, FlowrunModule)
		}
		if err := replace(FlowrunModule, dir); err != nil {
			return err
		}
	case o.Flowrun.Version != "":
		if err := f.AddRequire(FlowrunModule, o.Flowrun.Version); err != nil {
			return err
		}
	default:
		return inputErrorf("no flowrun version or checkout to build with")
	}
	replaced := map[string]string{} // module path → directory
	for _, p := range o.Packages {
		if p.Dir == "" {
			continue
		}
		dir, modPath, err := localModule(p.Dir)
		if err != nil {
			return inputErrorf("--with %s=%s: %v", p.Path, p.Dir, err)
		}
		if p.Path != modPath && !strings.HasPrefix(p.Path, modPath+"/") {
			return inputErrorf("--with %s=%s: the module there is %s, which does not contain package %s", p.Path, p.Dir, modPath, p.Path)
		}
		if modPath == FlowrunModule {
			return inputErrorf("--with %s=%s: that is flowrun itself; name a checkout with --flowrun", p.Path, p.Dir)
		}
		if prev, ok := replaced[modPath]; ok {
			if prev != dir {
				return inputErrorf("--with %s=%s: module %s is already taken from %s", p.Path, p.Dir, modPath, prev)
			}
			continue
		}
		replaced[modPath] = dir
		if err := replace(modPath, dir); err != nil {
			return err
		}
	}
	mod, err := f.Format()
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), mod, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "go.sum"), bytes.Join(sums, nil), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "main.go"), mainGo(o.Packages), 0o644)
}

// localModule returns the absolute directory of the module at dir and its module path.
func localModule(dir string) (abs, modPath string, err error) {
	abs, err = filepath.Abs(dir)
	if err != nil {
		return "", "", err
	}
	data, err := os.ReadFile(filepath.Join(abs, "go.mod"))
	if errors.Is(err, os.ErrNotExist) {
		if _, statErr := os.Stat(abs); statErr != nil {
			return "", "", errors.New("no such directory")
		}
		return "", "", fmt.Errorf("not a Go module: %s has no go.mod", abs)
	}
	if err != nil {
		return "", "", err
	}
	modPath = modfile.ModulePath(data)
	if modPath == "" {
		return "", "", fmt.Errorf("%s has no module line", filepath.Join(abs, "go.mod"))
	}
	return abs, modPath, nil
}

// relativeFile is a file that the go command names relative to the directory it ran in.
var relativeFile = regexp.MustCompile(`(?m)^((?:\.\./)+[^:\s]+\.go):`)

// locate makes absolute the files that the go command's output names relative to the temporary
// module (../../home/me/acme/broken.go:3:13), so that they make sense where flowrun build ran.
func locate(out, work string) string {
	return relativeFile.ReplaceAllStringFunc(out, func(m string) string {
		return filepath.Join(work, strings.TrimSuffix(m, ":")) + ":"
	})
}

// mainGo is the built binary's main package.
func mainGo(pkgs []Package) []byte {
	var b bytes.Buffer
	b.WriteString("// Code generated by flowrun build. DO NOT EDIT.\n\n")
	b.WriteString("// Command flowrun is flowrun with these packages' kinds and functions built in.\n")
	b.WriteString("package main\n\nimport (\n\t\"" + FlowrunModule + "/cmd\"\n\n")
	seen := map[string]bool{}
	for _, p := range pkgs {
		if !seen[p.Path] {
			seen[p.Path] = true
			fmt.Fprintf(&b, "\t_ %q\n", p.Path)
		}
	}
	b.WriteString(")\n\nfunc main() { cmd.Main() }\n")
	return b.Bytes()
}
