//go:build !linux

package clock

func monotonicBase() int64 { return fallbackBase }
