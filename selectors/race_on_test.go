//go:build race

package selectors

const raceEnabled = true
