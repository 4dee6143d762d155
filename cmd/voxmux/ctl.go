package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/voxmux/voxmux/router"
)

func ctlCmd() *cobra.Command {
	var addr, token string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "ctl",
		Short: "Operate a running server through its admin API (groups, drain, restart)",
		// Every call is bounded: a server that does not answer must not hang the operator's shell.
		// Leaving stops the server's side of the call too.
		PersistentPreRun: func(c *cobra.Command, _ []string) {
			if timeout > 0 {
				ctx, cancel := context.WithTimeout(c.Context(), timeout)
				cobra.OnFinalize(cancel)
				c.SetContext(ctx)
			}
		},
	}
	cmd.PersistentFlags().StringVar(&addr, "admin", "http://127.0.0.1:9090", "admin API address")
	cmd.PersistentFlags().StringVar(&token, "token", "", "admin bearer token (default $VOXMUX_ADMIN_TOKEN)")
	cmd.PersistentFlags().DurationVar(&timeout, "timeout", 10*time.Minute, "give up on the server after this long (0: wait forever)")
	client := func() *adminClient {
		if token == "" {
			token = os.Getenv("VOXMUX_ADMIN_TOKEN")
		}
		if !strings.Contains(addr, "://") {
			addr = "http://" + addr
		}
		return &adminClient{base: strings.TrimSuffix(addr, "/"), token: token}
	}
	groups := &cobra.Command{
		Use:   "groups",
		Short: "Show groups, their instances, GPUs and load",
		Args:  cobra.NoArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			var v router.GroupsView
			if err := client().do(c.Context(), "GET", "/admin/groups", &v); err != nil {
				return err
			}
			printGroups(c.OutOrStdout(), v)
			return nil
		},
	}
	var force bool
	action := func(use, short, verb string) *cobra.Command {
		return &cobra.Command{
			Use:   use + " NAME",
			Short: short,
			Args:  cobra.ExactArgs(1),
			RunE: func(c *cobra.Command, args []string) error {
				path := "/admin/groups/" + args[0] + "/" + verb
				if force {
					path += "?force=true"
				}
				return client().withProgress(c.Context(), c.OutOrStdout(), path)
			},
		}
	}
	drain := action("drain", "Stop sending new requests to a group and wait for its in-flight ones", "drain")
	resume := action("resume", "Send requests to a drained group again", "resume")
	restart := &cobra.Command{
		Use:   "restart [NAME]",
		Short: "Restart one group (drain, stop, start, warm up), or all groups one at a time",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(c *cobra.Command, args []string) error {
			path := "/admin/restart"
			if len(args) == 1 {
				path = "/admin/groups/" + args[0] + "/restart"
				if force {
					path += "?force=true"
				}
			}
			return client().withProgress(c.Context(), c.OutOrStdout(), path)
		},
	}
	restart.Flags().BoolVar(&force, "force", false, "restart the group even if it is the last ready one")
	drain.Flags().BoolVar(&force, "force", false, "drain the group even if it is the last ready one")
	cmd.AddCommand(groups, drain, resume, restart)
	return cmd
}

// adminHint says where the admin API's address comes from.
const adminHint = "The admin API is off unless the server's config sets admin.listen (e.g. admin: {listen: 127.0.0.1:9090, token_env: VOXMUX_ADMIN_TOKEN});\n" +
	"is the server running with it, and is --admin its address?"

type adminClient struct {
	base, token string
}

func (a *adminClient) do(ctx context.Context, method, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, a.base+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("admin API %s: no answer to %s %s within --timeout: %w", a.base, method, path, err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("admin API %s: %w", a.base, err)
		}
		return fmt.Errorf("cannot reach the admin API at %s: %w\n"+adminHint, a.base, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	switch {
	case resp.StatusCode == http.StatusUnauthorized:
		return fmt.Errorf("%s %s%s: 401: the admin token is missing or wrong; pass --token or set $VOXMUX_ADMIN_TOKEN to the server's admin.token (or the variable its admin.token_env names)", method, a.base, path)
	case resp.StatusCode == http.StatusNotFound && path == "/admin/groups":
		// Something answers there, but not the admin API: the speech API's port, for one.
		return fmt.Errorf("%s does not serve the admin API (GET /admin/groups: 404)\n"+adminHint, a.base)
	}
	if resp.StatusCode != 200 {
		var e struct {
			Error any `json:"error"`
		}
		if json.Unmarshal(body, &e) == nil && e.Error != nil {
			if m, ok := e.Error.(map[string]any); ok {
				return fmt.Errorf("%s %s: %d: %v", method, path, resp.StatusCode, m["message"])
			}
			return fmt.Errorf("%s %s: %d: %v", method, path, resp.StatusCode, e.Error)
		}
		return fmt.Errorf("%s %s: %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	if out != nil {
		return json.Unmarshal(body, out)
	}
	return nil
}

// withProgress runs a long admin call and prints group state changes while it runs.
func (a *adminClient) withProgress(ctx context.Context, w io.Writer, path string) error {
	done := make(chan error, 1)
	go func() { done <- a.do(ctx, "POST", path, nil) }()
	last := map[string]string{}
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	start := time.Now()
	for {
		select {
		case err := <-done:
			if err != nil {
				return err
			}
			var v router.GroupsView
			if err := a.do(ctx, "GET", "/admin/groups", &v); err == nil {
				printGroups(w, v)
			}
			fmt.Fprintf(w, "done in %s\n", time.Since(start).Round(100*time.Millisecond))
			return nil
		case <-t.C:
			var v router.GroupsView
			if a.do(ctx, "GET", "/admin/groups", &v) != nil {
				continue
			}
			for _, g := range v.Groups {
				if last[g.Name] != g.State {
					fmt.Fprintf(w, "%6.1fs  %-12s %s (in flight %d)\n", time.Since(start).Seconds(), g.Name, g.State, g.Inflight)
					last[g.Name] = g.State
				}
			}
		}
	}
}

func printGroups(w io.Writer, v router.GroupsView) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tSTATE\tINSTANCE\tSTATE\tPID\tGPUS (as the instance saw them)\tIN FLIGHT\tRESTARTS\tUPTIME")
	for _, g := range v.Groups {
		for i, in := range g.Instances {
			gname, gstate := g.Name, g.State
			if g.Reason != "" {
				gstate += " (" + g.Reason + ")"
			}
			if i > 0 {
				gname, gstate = "", ""
			}
			var gpus []string
			for _, gpu := range in.GPUs {
				gpus = append(gpus, fmt.Sprintf("%d:%s", gpu.Index, gpu.UUID))
			}
			if len(gpus) == 0 {
				gpus = []string{"-"}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%d/%d\t%d\t%s\n", gname, gstate, in.Name, in.State, in.PID,
				strings.Join(gpus, ","), in.Inflight, in.Capacity, in.Restarts, (time.Duration(in.UptimeSeconds) * time.Second).String())
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "queue: %d waiting (bound %d)\n", v.QueueLength, v.QueueSize)
}
