package engine

import "errors"

// ErrClosed is what a request gets from an engine that shut down before its audio was complete,
// in every family.
var ErrClosed = errors.New("engine is shut down")
