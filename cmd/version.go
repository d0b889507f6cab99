package cmd

import (
	"fmt"
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
			fmt.Fprintf(stdio.Out, "flowrun %s\n", Version)
			if info, ok := debug.ReadBuildInfo(); ok {
				fmt.Fprintf(stdio.Out, "go: %s\n", info.GoVersion)
				for _, s := range info.Settings {
					if s.Key == "vcs.revision" || s.Key == "vcs.modified" {
						fmt.Fprintf(stdio.Out, "%s: %s\n", s.Key, s.Value)
					}
				}
			}
			if names := stages.Names(); len(names) > 0 {
				fmt.Fprintf(stdio.Out, "go stage functions: %v\n", names)
			}
			return nil
		},
	}
}
