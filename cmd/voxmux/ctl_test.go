package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestCtlSaysWhatIsWrong: ctl names the admin address and admin.listen when nothing answers
// there, or something that is not the admin API does, and the token settings on a 401.
func TestCtlSaysWhatIsWrong(t *testing.T) {
	notAdmin := httptest.NewServer(http.NotFoundHandler()) // e.g. the speech API's port
	defer notAdmin.Close()
	locked := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"unauthorized"}`, http.StatusUnauthorized)
	}))
	defer locked.Close()
	down := freePort(t) // nothing listens there
	for _, c := range []struct {
		name, addr string
		args       []string
		want       []string
	}{
		{"admin off", down, []string{"groups"}, []string{"cannot reach the admin API at http://" + down, "admin.listen", "--admin"}},
		{"admin off, drain", down, []string{"drain", "g0"}, []string{"http://" + down, "admin.listen"}},
		{"not the admin API", notAdmin.URL, []string{"groups"}, []string{notAdmin.URL + " does not serve the admin API", "admin.listen"}},
		{"wrong token", locked.URL, []string{"groups"}, []string{"401", "--token", "VOXMUX_ADMIN_TOKEN", "admin.token"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd := ctlCmd()
			cmd.SetOut(&bytes.Buffer{})
			cmd.SetErr(&bytes.Buffer{})
			cmd.SetArgs(append([]string{"--admin", c.addr, "--token", "x"}, c.args...))
			err := cmd.Execute()
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// ctl gives up on an admin API that never answers after --timeout, with a message that says so.
func TestCtlTimesOut(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // read nothing, answer nothing
		}
	}()
	cmd := ctlCmd()
	cmd.SetArgs([]string{"--admin", ln.Addr().String(), "--timeout", "300ms", "restart"})
	done := make(chan error, 1)
	go func() { done <- cmd.ExecuteContext(context.Background()) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "--timeout") {
			t.Fatalf("error %v, want one naming --timeout", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ctl did not give up")
	}
}
