package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"

	"github.com/voxmux/voxmux/health"
)

func gpusCmd() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "gpus",
		Short: "List this host's GPUs as voxmux sees them (NVML): memory, utilization, temperature, health",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return listGPUs(cmd.OutOrStdout(), cmd.ErrOrStderr(), health.NewNVML(nvml.New()), asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON array instead of a table")
	return cmd
}

// listGPUs prints lib's GPUs. A host without NVML is not an error, so scripts can run this
// anywhere: the table says so, and --json prints an empty array and says so on errOut.
func listGPUs(out, errOut io.Writer, lib health.NVML, asJSON bool) error {
	m, err := health.NewMonitor(lib, health.MonitorConfig{}, nil)
	if errors.Is(err, health.ErrNoNVML) {
		if asJSON {
			fmt.Fprintln(out, "[]")
			out = errOut
		}
		fmt.Fprintln(out, err) // "no NVIDIA driver/NVML on this host: <why>"
		return nil
	}
	if err != nil {
		return fmt.Errorf("read GPUs: %w", err)
	}
	defer m.Close()
	gpus := m.Snapshot()
	if asJSON {
		if gpus == nil {
			gpus = []health.GPUStatus{}
		}
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(gpus)
	}
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "INDEX\tUUID\tNAME\tMEMORY\tUTIL\tTEMP\tHEALTH")
	for _, g := range gpus {
		h := "healthy"
		if !g.Healthy {
			h = "unhealthy: " + g.Reason
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%d / %d MiB\t%d%%\t%d°C\t%s\n", g.Index, g.UUID, g.Name,
			g.MemoryUsedBytes>>20, g.MemoryTotalBytes>>20, g.UtilizationPercent, g.TemperatureC, h)
	}
	if len(gpus) == 0 {
		fmt.Fprintln(w, "(NVML sees no GPU)")
	}
	return w.Flush()
}
