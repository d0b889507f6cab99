package cmd

import (
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/flowrun/flowrun/stages"
)

// Version is the release version, set at build time with
// -ldflags "-X github.com/flowrun/flowrun/cmd.Version=v1.2.3".
var Version = "dev"

func newVersionCommand(stdio IO) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version of flowrun and of the Go stage functions built in",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, args []string) error {
			p := &printer{w: stdio.Out}
			p.printf("flowrun %s\n", Version)
			if info, ok := debug.ReadBuildInfo(); ok {
				p.printf("go: %s\n", info.GoVersion)
				for _, s := range info.Settings {
					if s.Key == "vcs.revision" || s.Key == "vcs.modified" {
						p.printf("%s: %s\n", s.Key, s.Value)
					}
				}
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
