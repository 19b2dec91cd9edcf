package harness

import "runtime"

// runtimeLockAndExit locks the goroutine to its thread and returns
// without unlocking: Go ends that thread.
func runtimeLockAndExit() { runtime.LockOSThread() }
