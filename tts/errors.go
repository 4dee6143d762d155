package tts

// ErrorKind tells the router what to do with a failed request.
type ErrorKind int

const (
	ErrInternal ErrorKind = iota // the instance failed; another instance may succeed
	ErrInvalid                   // the request itself is bad; retrying will not help
	ErrBusy                      // the instance is at its max_inflight
	ErrNotReady                  // the instance cannot serve (not loaded, shutting down)
)

// Error is an instance failure of a known kind.
type Error struct {
	Kind ErrorKind
	Msg  string
	// Param is the request field an ErrInvalid error is about, in the API's words ("voice");
	// empty is the text. The router's 400 names it as the error's param.
	Param string
}

func (e *Error) Error() string { return e.Msg }

// Invalid is an ErrInvalid error: the request itself is bad.
func Invalid(msg string) *Error { return &Error{Kind: ErrInvalid, Msg: msg} }

// InvalidVoice is an ErrInvalid error about the request's voice (its Voice or Prompt).
func InvalidVoice(msg string) *Error { return &Error{Kind: ErrInvalid, Msg: msg, Param: "voice"} }

// ErrEmptyText is returned for text that has nothing to speak.
var ErrEmptyText error = Invalid("text is empty")
