package main

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

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
