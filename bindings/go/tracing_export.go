package distlock

// The C callbacks of a traced client (tracing.go): cgo-exported, so this file's preamble has
// declarations only.

/*
#include <stdint.h>
#include <stdlib.h>
#include "distlock/distlock.h"
*/
import "C"

import (
	"runtime/cgo"
	"time"
	"unsafe"
)

//export distlockGoSpan
func distlockGoSpan(s *C.distlock_span, user unsafe.Pointer) {
	t := cgo.Handle(*(*C.uintptr_t)(user)).Value().(*goTracer)
	span := Span{
		Kind:         SpanKind(s.kind),
		Name:         C.GoString(s.name),
		TraceID:      C.GoString(&s.trace_id[0]),
		SpanID:       C.GoString(&s.span_id[0]),
		ParentSpanID: C.GoString(&s.parent_span_id[0]),
		Traceparent:  C.GoString(&s.traceparent[0]),
		Sampled:      s.sampled != 0,
		Start:        time.Unix(0, int64(s.start_unix_ns)),
		End:          time.Unix(0, int64(s.end_unix_ns)),
		StartMono:    time.Duration(s.start_mono_ns),
		EndMono:      time.Duration(s.end_mono_ns),
		LockName:     C.GoString(s.lock_name),
		HasToken:     s.has_token != 0,
		Token:        uint64(s.token),
		Owner:        C.GoString(s.owner),
		HolderInfo:   C.GoString(s.holder_info),
		Backend:      C.GoString(s.backend),
		Outcome:      C.GoString(s.outcome),
		LossReason:   C.GoString(s.loss_reason),
		Detail:       C.GoString(s.detail),
		BatchSize:    uint32(s.batch_size),
	}
	if s.error_code != 0 {
		span.Err = &Error{Code: int(s.error_code), Message: span.Detail}
	}
	t.enqueue(span)
}

//export distlockGoTracerRelease
func distlockGoTracerRelease(user unsafe.Pointer) {
	h := cgo.Handle(*(*C.uintptr_t)(user))
	h.Value().(*goTracer).close()
	h.Delete()
	C.free(user)
}
