package main

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/voxmux/voxmux/instance"
	"github.com/voxmux/voxmux/plugin"
)

const pluginProtocol = plugin.ProtocolVersion

func instanceCmd(families instance.Families) *cobra.Command {
	return &cobra.Command{
		Use:   "instance",
		Short: "Run an inference instance (started by 'voxmux serve', not by hand)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !plugin.IsLaunchedByRouter(os.Getenv) {
				fmt.Fprintln(os.Stderr, "voxmux instance is started by 'voxmux serve' for each GPU group; it is not meant to be run by hand.\nRun: voxmux serve --config configs/cpu.yaml")
				os.Exit(2)
			}
			level, _ := plugin.ParseLevel(os.Getenv(plugin.LogLevelEnv))
			slog.SetDefault(slog.New(instanceLogHandler(os.Stderr, level)))
			go exitWithParent(os.Getppid())
			svc := instance.NewService(families, os.Getenv)
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

// instanceLogHandler writes JSON lines in hclog's shape, which go-plugin parses from the
// instance's stderr and relays to the router's logger at their level, where they come out in the
// router's format; a line it cannot parse (another time layout, say) would only reach the
// router's debug log. Lines below level (the router's --log-level) are not written at all.
func instanceLogHandler(w io.Writer, level slog.Level) slog.Handler {
	return slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			a = plugin.DurationsAsStrings(groups, a)
			switch a.Key {
			case slog.TimeKey:
				a.Key = "@timestamp"
				a.Value = slog.StringValue(a.Value.Time().Format(hclogTime))
			case slog.LevelKey:
				a.Key = "@level"
				a.Value = slog.StringValue(strings.ToLower(a.Value.String()))
			case slog.MessageKey:
				a.Key = "@message"
			}
			return a
		},
	})
}

// hclogTime is the only timestamp layout go-plugin accepts in a plugin's log line.
const hclogTime = "2006-01-02T15:04:05.000000Z07:00"
