//go:build !linux

package selectors

func monotonicBase() int64 { return fallbackBase }
