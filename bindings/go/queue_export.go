package distlock

// The C callback of QueuePosition (lock_ext.go): cgo-exported, so this file's preamble has
// declarations only.

/*
#include <stdint.h>
#include <stdlib.h>
#include "distlock/distlock.h"
*/
import "C"

import (
	"runtime/cgo"
	"unsafe"
)

//export distlockGoQueuePosition
func distlockGoQueuePosition(position C.size_t, ahead *C.distlock_waiter, user unsafe.Pointer) {
	fn := cgo.Handle(*(*C.uintptr_t)(user)).Value().(func(int, Waiter))
	w := Waiter{Position: uint64(ahead.position), Owner: C.GoString(ahead.owner)}
	if ahead.holder_info != nil {
		s := C.GoString(ahead.holder_info)
		w.HolderInfo = &s
	}
	if ahead.waiting_since_unix_ms >= 0 {
		v := int64(ahead.waiting_since_unix_ms)
		w.WaitingSinceUnixMs = &v
	}
	fn(int(position), w)
}
