package dmexec

import "testing"

// TestWithDeviceMapper: the device-mapper line goes in its place among the
// block majors, once, whatever the file holds.
func TestWithDeviceMapper(t *testing.T) {
	const chars = "Character devices:\n  1 mem\n 10 misc\n\n"
	for _, tc := range []struct{ name, block, want string }{
		{"between", "  7 loop\n259 blkext\n", "  7 loop\n240 device-mapper\n259 blkext\n"},
		{"last", "  7 loop\n  8 sd\n", "  7 loop\n  8 sd\n240 device-mapper\n"},
		{"first", "250 x\n254 y\n", "240 device-mapper\n250 x\n254 y\n"},
		{"already there", "  7 loop\n240 device-mapper\n259 blkext\n", "  7 loop\n240 device-mapper\n259 blkext\n"},
	} {
		got := WithDeviceMapper(chars+"Block devices:\n"+tc.block, 240)
		if want := chars + "Block devices:\n" + tc.want; got != want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, want)
		}
	}
	if got := WithDeviceMapper("Character devices:\n  1 mem\n", 241); got != "Character devices:\n  1 mem\n\nBlock devices:\n241 device-mapper\n" {
		t.Errorf("no block section: %q", got)
	}
}
