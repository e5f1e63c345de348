package fault

import (
	"hash/fnv"
	"math"
)

// Randomness is counter-based: the n-th draw of a stream is a hash of the
// device's seed, the stream's key and n, so a draw depends on nothing but
// how many draws the stream made before it. Each rule has a stream of its
// own (keyed by its name), so adding a rule changes no other rule's draws,
// and the latency model draws by the device's I/O index.

// mix is SplitMix64's finalizer.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// draw returns the n-th 64-bit draw of stream key under seed; sub tells
// apart the draws one event makes.
func draw(seed, key, n uint64, sub uint64) uint64 {
	return mix(mix(mix(seed^0x9e3779b97f4a7c15)^key) + n*0x9e3779b97f4a7c15 + sub*0xd1b54a32d192ed03)
}

// unit returns a draw as a float in [0, 1).
func unit(x uint64) float64 { return float64(x>>11) * (1.0 / (1 << 53)) }

// normal turns two uniform draws into a standard normal one (Box-Muller).
func normal(a, b uint64) float64 {
	u1 := unit(a)
	if u1 < 1e-300 {
		u1 = 1e-300
	}
	return math.Sqrt(-2*math.Log(u1)) * math.Cos(2*math.Pi*unit(b))
}

// keyOf is a stream key for a name.
func keyOf(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}

// source is a stream whose draws come from a function of their index: a
// distribution samples from one without knowing where the draws come from.
type source func(sub uint64) uint64
