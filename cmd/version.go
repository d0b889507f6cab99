package cmd

import (
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/stages"
)

// Version and Commit name the build. make build sets them from git:
//
//	-ldflags "-X github.com/flowrun/flowrun/cmd.Version=$(git describe --tags --always --dirty)
//	          -X github.com/flowrun/flowrun/cmd.Commit=$(git rev-parse HEAD)"
//
// Left empty (a plain go build or go install), they are read from what the go command recorded
// in the binary: the module's version and the checkout's commit (see versionOf).
var (
	Version string
	Commit  string
)

// flowrunModule is flowrun's module path, which a binary made by flowrun build has as a dependency.
const flowrunModule = "github.com/flowrun/flowrun"

// versionInfo is what flowrun version says of the binary.
type versionInfo struct {
	Version   string // a tag such as v0.1.0, git describe's v0.1.0-3-g1a2b3c4-dirty, or "dev"
	Commit    string // the full commit hash, or "unknown"
	Modified  bool   // built from a checkout with uncommitted changes, as the go command recorded
	GoVersion string // the Go toolchain that built it, when recorded
}

// currentVersion is this binary's version and commit.
func currentVersion() versionInfo {
	info, _ := debug.ReadBuildInfo()
	return versionOf(Version, Commit, info)
}

// versionOf resolves the version and commit from the values set with -ldflags -X, which win,
// then from the binary's build info (nil when there is none): flowrun's module version (the main
// module's, or the dependency's in a binary made by flowrun build) and the vcs settings that go
// build records in a checkout.
func versionOf(version, commit string, info *debug.BuildInfo) versionInfo {
	b := versionInfo{Version: version, Commit: commit}
	if info != nil {
		b.GoVersion = info.GoVersion
		mod := &info.Main
		if mod.Path != flowrunModule {
			for _, d := range info.Deps {
				if d.Path == flowrunModule {
					mod = d
				}
			}
		}
		if b.Version == "" && mod.Version != "" && mod.Version != "(devel)" {
			b.Version = mod.Version
		}
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				if b.Commit == "" {
					b.Commit = s.Value
				}
			case "vcs.modified":
				b.Modified = s.Value == "true"
			}
		}
	}
	if b.Version == "" {
		b.Version = "dev"
	}
	if b.Commit == "" {
		b.Commit = "unknown"
	}
	return b
}

func newVersionCommand(stdio IO) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version and commit of flowrun and the Go stage functions built in",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, args []string) error {
			b := currentVersion()
			p := &printer{w: stdio.Out}
			p.printf("flowrun %s\n", b.Version)
			if b.Modified {
				p.printf("commit: %s (with uncommitted changes)\n", b.Commit)
			} else {
				p.printf("commit: %s\n", b.Commit)
			}
			if b.GoVersion != "" {
				p.printf("go: %s\n", b.GoVersion)
			}
			if names := stages.Names(); len(names) > 0 {
				p.printf("go stage functions: %v\n", names)
			}
			if p.err != nil {
				return exitError{code: ExitError, message: p.err.Error()}
			}
			return nil
		},
	}
}

// versionLDFlags are the go build -ldflags that give a binary made by flowrun build the version and
// commit of the flowrun that made it (whose module it compiles in).
func versionLDFlags(b versionInfo) string {
	return "-X " + flowrunModule + "/cmd.Version=" + b.Version + " -X " + flowrunModule + "/cmd.Commit=" + b.Commit
}
