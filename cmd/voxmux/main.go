// Command voxmux serves text-to-speech models across the GPUs of a host.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/instance/piper"
	"github.com/voxmux/voxmux/instance/staged"
	"github.com/voxmux/voxmux/instance/voxcpm"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

func main() {
	root := &cobra.Command{
		Use:           "voxmux",
		Short:         "Serve text-to-speech models at full speed across the GPUs of a host",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	// The model families this binary serves, in the order they claim a model's path (staged
	// claims every path, so it comes last).
	families := instance.Families{piper.Family{}, voxcpm.Family{}, staged.Family{}}
	root.AddCommand(serveCmd(families), instanceCmd(families), ctlCmd(), gpusCmd(), benchCmd(nil), voicesCmd(), versionCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "voxmux:", err)
		os.Exit(1)
	}
}

func versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run: func(cmd *cobra.Command, _ []string) {
			fmt.Fprintf(cmd.OutOrStdout(), "voxmux %s (plugin protocol %d)\n", version, pluginProtocol)
		},
	}
}
