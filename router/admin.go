package router

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
)

// AdminOptions configure the operations API.
type AdminOptions struct {
	Pool  *Pool
	Token string
	// DrainTimeout bounds the drain before a restart.
	DrainTimeout time.Duration
	// Extra adds fields to each group in GET /admin/groups (GPU health, for one).
	Extra  func(g *Group) map[string]any
	Logger *slog.Logger
}

// Admin is the operations API: group status, drain and (rolling) restarts. Every call needs the
// bearer token.
type Admin struct {
	o   AdminOptions
	srv *fasthttp.Server
}

// NewAdmin makes the operations API server.
func NewAdmin(o AdminOptions) *Admin {
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = time.Minute
	}
	a := &Admin{o: o}
	a.srv = &fasthttp.Server{Handler: a.Handler, Name: "voxmux-admin", ReadTimeout: 10 * time.Second, Logger: connLogger{o.Logger}}
	return a
}

// Serve serves the API on ln until Shutdown.
func (a *Admin) Serve(ln net.Listener) error { return a.srv.Serve(ln) }

// Shutdown stops the API server.
func (a *Admin) Shutdown(ctx context.Context) error { return a.srv.ShutdownWithContext(ctx) }

// GroupView is one group in GET /admin/groups.
type GroupView struct {
	Name      string         `json:"name"`
	State     string         `json:"state"`
	Reason    string         `json:"reason,omitempty"`
	GPUs      []int          `json:"gpus"`
	Inflight  int            `json:"inflight"`
	Capacity  int            `json:"capacity"`
	Restarts  int            `json:"restarts"`
	Instances []InstanceView `json:"instances"`
	Extra     map[string]any `json:"health,omitempty"`
}

// InstanceView is one instance in GET /admin/groups.
type InstanceView struct {
	Name          string    `json:"name"`
	State         string    `json:"state"`
	PID           int       `json:"pid"`
	GPUs          []GPUView `json:"gpus"`
	Inflight      int       `json:"inflight"`
	Capacity      int       `json:"capacity"`
	Restarts      int       `json:"restarts"`
	UptimeSeconds float64   `json:"uptime_seconds"`
	LastError     string    `json:"last_error,omitempty"`
}

// GPUView is a GPU as the instance process saw it.
type GPUView struct {
	Index       int    `json:"index"`
	UUID        string `json:"uuid"`
	Name        string `json:"name"`
	MemoryTotal uint64 `json:"memory_total_bytes"`
}

// GroupsView is the body of GET /admin/groups.
type GroupsView struct {
	Groups      []GroupView `json:"groups"`
	QueueLength int         `json:"queue_length"`
	QueueSize   int         `json:"queue_size"`
}

// Groups builds the groups view.
func (a *Admin) Groups() GroupsView { return groupsView(a.o.Pool, a.o.Extra) }

// groupsView describes p's groups; extra adds fields to each (GPU health, for one).
func groupsView(p *Pool, extra func(g *Group) map[string]any) GroupsView {
	v := GroupsView{QueueLength: p.QueueLen(), QueueSize: p.queue.Size, Groups: []GroupView{}}
	for _, g := range p.Groups() {
		gv := GroupView{Name: g.Name, State: string(g.State()), Reason: g.UnhealthyReason(), GPUs: g.GPUs, Inflight: g.Inflight(), Instances: []InstanceView{}}
		if gv.GPUs == nil {
			gv.GPUs = []int{}
		}
		for _, b := range g.Backends {
			iv := InstanceView{Name: b.Name, State: string(b.state()), Inflight: b.Inflight(), Capacity: b.Capacity, GPUs: []GPUView{}}
			if b.Member != nil {
				s := b.Member.Status()
				iv.PID, iv.Restarts, iv.LastError = s.PID, s.Restarts, s.LastError
				if s.State == "ready" {
					iv.UptimeSeconds = time.Since(s.Since).Seconds()
				}
				for _, gpu := range s.GPUs {
					iv.GPUs = append(iv.GPUs, GPUView{Index: gpu.Index, UUID: gpu.UUID, Name: gpu.Name, MemoryTotal: gpu.MemoryTotal})
				}
			}
			gv.Capacity += b.Capacity
			gv.Restarts += iv.Restarts
			gv.Instances = append(gv.Instances, iv)
		}
		if extra != nil {
			gv.Extra = extra(g)
		}
		v.Groups = append(v.Groups, gv)
	}
	return v
}

// Handler routes an admin request.
func (a *Admin) Handler(ctx *fasthttp.RequestCtx) {
	auth := string(ctx.Request.Header.Peek("Authorization"))
	token, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok || a.o.Token == "" || subtle.ConstantTimeCompare([]byte(token), []byte(a.o.Token)) != 1 {
		ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="voxmux-admin"`)
		writeError(ctx, newError(fasthttp.StatusUnauthorized, "authentication_error", "invalid_token", "the admin API needs Authorization: Bearer <token>"))
		return
	}
	path := strings.TrimSuffix(string(ctx.Path()), "/")
	switch {
	case path == "/admin/groups":
		if !ctx.IsGet() {
			writeError(ctx, newError(fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "use GET"))
			return
		}
		a.json(ctx, 200, a.Groups())
	case path == "/admin/restart":
		if !ctx.IsPost() {
			writeError(ctx, newError(fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "use POST"))
			return
		}
		// The restart stops with its caller: an abandoned call must not go on, and restart groups
		// later, unasked.
		cctx, stop := a.callContext(ctx)
		defer stop()
		var steps []string
		err := a.o.Pool.RollingRestart(cctx, a.o.DrainTimeout, func(group, step string) {
			a.o.Logger.Info("rolling restart", "group", group, "step", step)
			steps = append(steps, group+": "+step)
		})
		a.result(ctx, err, map[string]any{"steps": steps})
	case strings.HasPrefix(path, "/admin/groups/"):
		rest := strings.TrimPrefix(path, "/admin/groups/")
		name, action, _ := strings.Cut(rest, "/")
		g := a.o.Pool.Group(name)
		if g == nil {
			writeError(ctx, newError(fasthttp.StatusNotFound, "invalid_request_error", "group_not_found", "no group named "+name))
			return
		}
		if action == "" && ctx.IsGet() {
			for _, gv := range a.Groups().Groups {
				if gv.Name == name {
					a.json(ctx, 200, gv)
				}
			}
			return
		}
		if !ctx.IsPost() {
			writeError(ctx, newError(fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "use POST"))
			return
		}
		switch action {
		case "drain":
			force := string(ctx.QueryArgs().Peek("force")) == "true"
			cctx, stop := a.callContext(ctx)
			defer stop()
			dctx, cancel := context.WithTimeout(cctx, a.o.DrainTimeout)
			err := g.DrainUnlessLast(dctx, force)
			cancel()
			a.o.Logger.Info("group drained", "group", name, "error", err)
			a.result(ctx, err, nil)
		case "resume":
			g.Resume()
			a.result(ctx, nil, nil)
		case "restart":
			force := string(ctx.QueryArgs().Peek("force")) == "true"
			a.o.Logger.Info("group restart", "group", name, "force", force)
			cctx, stop := a.callContext(ctx)
			defer stop()
			err := g.Restart(cctx, a.o.DrainTimeout, force)
			a.result(ctx, err, nil)
		default:
			writeError(ctx, newError(fasthttp.StatusNotFound, "invalid_request_error", "not_found", "unknown action "+action+" (drain, resume, restart)"))
		}
	default:
		writeError(ctx, newError(fasthttp.StatusNotFound, "invalid_request_error", "not_found", "no route for "+path))
	}
}

// callContext is a context that ends when the caller closes its connection; stop must be called
// before the handler returns.
func (a *Admin) callContext(ctx *fasthttp.RequestCtx) (context.Context, func()) {
	cctx, cancel := context.WithCancel(context.Background())
	stopWatch := watchClient(ctx.Conn(), func() {
		a.o.Logger.Warn("admin caller left; stopping its operation", "path", string(ctx.Path()))
		cancel()
	})
	return cctx, func() { stopWatch(); cancel() }
}

func (a *Admin) result(ctx *fasthttp.RequestCtx, err error, extra map[string]any) {
	body := map[string]any{"ok": err == nil}
	for k, v := range extra {
		body[k] = v
	}
	status := 200
	if err != nil {
		body["error"] = err.Error()
		status = fasthttp.StatusInternalServerError
		switch {
		case errors.Is(err, ErrLastReadyGroup):
			status = fasthttp.StatusConflict
		case errors.Is(err, context.DeadlineExceeded):
			status = fasthttp.StatusGatewayTimeout
		}
	}
	body["groups"] = a.Groups().Groups
	a.json(ctx, status, body)
}

func (a *Admin) json(ctx *fasthttp.RequestCtx, status int, v any) {
	b, _ := json.MarshalIndent(v, "", "  ")
	ctx.SetStatusCode(status)
	ctx.SetContentType("application/json")
	ctx.SetBody(append(b, '\n'))
}
