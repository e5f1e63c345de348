package fault

import (
	"bytes"
	"strings"
	"testing"

	"github.com/dmfuse/dmfuse/stack"
)

// FuzzParse: any table words are parsed or refused with one line naming
// what is wrong, never a panic; what parses prints its rules back as words
// that parse to the same rules.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"seed=3 rule op=read p=5% error=EIO",
		"preset=gp2:size=50 rule name=t op=write sectors=0+64 size=4K-64K tear=512:suffix",
		"iops=100/1000/9s bps=1M stall=1s/100ms/50ms slow=2s/200ms/4 gc=1M/50ms units=4 read=mix(0.9*exp(1ms,5ms),0.1*uniform(1ms,9ms))",
		"atlas=a/1/2048 rule atlas op=fua nth=3 misdirect=-8",
		"rule name=a every=2 after=1 first=4 goto=b count rule state=b cycle=10ms/20ms/1ms window=0-5s corrupt=bits:3",
		"rule op=flush lie rule op=read stale=2 rule op=write latent=3 rule op=discard budget=1M stall=5ms",
		"hdd=100 rule delay=pct(1ms,3ms)",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, spec string) {
		args := stack.SplitArgs(spec)
		c, err := parseConfig(args, 1<<20)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("a refusal of more than one line: %q", err)
			}
			return
		}
		words := ruleWords(c.rules)
		again, err := parseRules(words, 1<<20)
		if err != nil {
			t.Fatalf("%q printed as %q, which does not parse: %v", spec, words, err)
		}
		if got := ruleWords(again); strings.Join(got, " ") != strings.Join(words, " ") {
			t.Fatalf("rules %q print as %q after a round trip", words, got)
		}
	})
}

// FuzzMessage: any message to a device with rules is answered or refused
// without a panic, and a refused one leaves the rules as they were.
func FuzzMessage(f *testing.F) {
	for _, s := range []string{
		"add rule name=x op=read error", "remove a", "rules rule op=write drop", "rules", "state 2", "state",
		"release", "log 3", "counters", "reset", "add rule state=9 error", "remove", "log x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, msg string) {
		d, _ := dev(t, newClock(), "rule name=a op=read nth=2 goto=2 count rule name=b state=2 error", 1<<20)
		before := strings.Join(ruleWords(d.rules.Load().rules), " ")
		if _, err := d.Message(msg); err != nil {
			if after := strings.Join(ruleWords(d.rules.Load().rules), " "); after != before {
				t.Fatalf("refused %q (%v) but the rules changed: %q to %q", msg, err, before, after)
			}
		}
		read(t, d, 0, 4096)
	})
}

// FuzzEvents: ParseEvents reads any text or refuses it; what it reads
// prints back to lines it reads the same.
func FuzzEvents(f *testing.F) {
	f.Add("0 100 read 8 8 r0 error 5\n# comment\n3 900 write 0 1 t tear=512 77\n")
	f.Add("1 2 flush 0 0 x lie 0\n")
	f.Fuzz(func(t *testing.T, text string) {
		evs, err := ParseEvents(strings.NewReader(text))
		if err != nil {
			return
		}
		var b bytes.Buffer
		for _, e := range evs {
			b.WriteString(e.String() + "\n")
		}
		again, err := ParseEvents(&b)
		if err != nil || len(again) != len(evs) {
			t.Fatalf("printed events do not parse back: %v", err)
		}
		for i := range evs {
			if again[i] != evs[i] {
				t.Fatalf("event %d: %+v, then %+v", i, evs[i], again[i])
			}
		}
	})
}
