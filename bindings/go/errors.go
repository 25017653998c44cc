package distlock

import (
	"context"
	"errors"
)

// Error is a failure reported by the library: Code is the library's error code (the values of
// distlock::errc, include/distlock/error.hpp; the same as the C API's DISTLOCK_E_*) and Message
// the sentence the C++ API gives. Messages never hold a password.
//
// Compare with errors.Is against the sentinels below: errors.Is(err, distlock.ErrBusy).
type Error struct {
	Code    int
	Message string
}

func (e *Error) Error() string { return e.Message }

// Is reports whether target is a sentinel (or an *Error) with the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// The library's errors, by code. Use them with errors.Is.
var (
	ErrBusy                = &Error{1, "distlock: busy"}
	ErrTimeout             = &Error{2, "distlock: timeout"}
	ErrLost                = &Error{3, "distlock: lost"}
	ErrNotOwner            = &Error{4, "distlock: not owner"}
	ErrBackendUnavailable  = &Error{5, "distlock: backend unavailable"}
	ErrAuthFailed          = &Error{6, "distlock: authentication failed"}
	ErrInvalidArgument     = &Error{7, "distlock: invalid argument"}
	ErrInvalidURL          = &Error{8, "distlock: invalid URL"}
	ErrQuorumUnavailable   = &Error{9, "distlock: quorum unavailable"}
	ErrProtocol            = &Error{10, "distlock: protocol error"}
	ErrNotSupported        = &Error{11, "distlock: not supported"}
	ErrExhausted           = &Error{12, "distlock: exhausted"}
	ErrClockMovedBackwards = &Error{13, "distlock: clock moved backwards"}
	ErrForked              = &Error{14, "distlock: used in a child after fork"}
	ErrCancelled           = &Error{15, "distlock: the wait was cancelled"}
	ErrNoMemory            = &Error{100, "distlock: out of memory"}
	ErrInternal            = &Error{101, "distlock: internal error"}
	// Not from the library:
	ErrClosed   = &Error{1001, "distlock: the client is closed"}
	ErrUnlocked = &Error{1002, "distlock: the lease was unlocked"}
)

// ctxError is a wait ended by its context: errors.Is matches both the context's error
// (context.Canceled or context.DeadlineExceeded) and ErrCancelled.
type ctxError struct {
	ctx   error
	inner *Error
}

func (e *ctxError) Error() string { return e.inner.Message + ": " + e.ctx.Error() }
func (e *ctxError) Unwrap() error { return e.ctx }
func (e *ctxError) Is(target error) bool {
	return errors.Is(e.inner, target) || errors.Is(e.ctx, target)
}

// fromContext turns the library's cancelled error into one that also matches ctx.Err().
func fromContext(ctx context.Context, err error) error {
	var de *Error
	if ctx.Err() != nil && errors.As(err, &de) && de.Code == ErrCancelled.Code {
		return &ctxError{ctx: ctx.Err(), inner: de}
	}
	return err
}
