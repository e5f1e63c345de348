//go:build !race

package selectors

const raceEnabled = false
