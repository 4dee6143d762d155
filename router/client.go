package router

import (
	"net"
	"sync/atomic"
	"syscall"
	"time"
)

// watchClient calls gone when the client closes its connection (or resets it) while the handler
// waits for something else, such as a free instance. fasthttp reads a connection only between
// requests, so nothing else notices a client that leaves mid-request; this peeks at the socket
// (MSG_PEEK) without taking any byte from fasthttp. Bytes of a next, pipelined request end the
// watch without a verdict. stop must be called before the handler returns: it ends the watch and
// clears the read deadline it used (fasthttp sets its own before it reads the next request).
func watchClient(conn net.Conn, gone func()) (stop func()) {
	sc, ok := conn.(syscall.Conn)
	if !ok {
		return func() {} // not a socket (TLS, tests): no watch
	}
	rc, err := sc.SyscallConn()
	if err != nil || conn.SetReadDeadline(time.Time{}) != nil {
		return func() {}
	}
	var stopping atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		var b [1]byte
		closed := false
		err := rc.Read(func(fd uintptr) bool {
			n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			switch {
			case err == syscall.EAGAIN || err == syscall.EINTR:
				return false // nothing yet: wait until the socket is readable
			case err != nil, n == 0:
				closed = true // reset, or an orderly close
			}
			return true
		})
		if err == nil && closed && !stopping.Load() {
			gone()
		}
	}()
	return func() {
		stopping.Store(true)
		_ = conn.SetReadDeadline(time.Unix(1, 0)) // wakes the watcher
		<-done
		_ = conn.SetReadDeadline(time.Time{})
	}
}
