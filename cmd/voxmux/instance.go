package main

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/plugin"
)

const pluginProtocol = plugin.ProtocolVersion

func instanceCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "instance",
		Short: "Run an inference instance (started by 'voxmux serve', not by hand)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !plugin.IsLaunchedByRouter(os.Getenv) {
				fmt.Fprintln(os.Stderr, "voxmux instance is started by 'voxmux serve' for each GPU group; it is not meant to be run by hand.\nRun: voxmux serve --config configs/cpu.yaml")
				os.Exit(2)
			}
			// go-plugin reads these keys from the instance's stderr and re-logs the lines at their level.
			slog.SetDefault(slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{
				ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
					switch a.Key {
					case slog.TimeKey:
						a.Key = "@timestamp"
					case slog.LevelKey:
						a.Key = "@level"
						a.Value = slog.StringValue(map[string]string{"DEBUG": "debug", "INFO": "info", "WARN": "warn", "ERROR": "error"}[a.Value.String()])
					case slog.MessageKey:
						a.Key = "@message"
					}
					return a
				},
			})))
			go exitWithParent(os.Getppid())
			svc := instance.NewService(os.Getenv)
			defer svc.Close()
			plugin.Serve(svc)
			return nil
		},
	}
}

// exitWithParent ends the instance if the router is gone; Pdeathsig covers most cases, this
// covers the rest (e.g. the router thread that started us exited).
func exitWithParent(ppid int) {
	for range time.Tick(time.Second) {
		if os.Getppid() != ppid {
			slog.Error("router is gone; instance exits")
			os.Exit(3)
		}
	}
}
