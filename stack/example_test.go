package stack_test

import (
	"context"
	"fmt"

	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/stack/stacktest"
)

// ParseTable reads table text as dmsetup does: blank lines and comments are
// skipped, a `#` ends a line, and the parameters are left as one string.
func ExampleParseTable() {
	text := `# a volume of two pieces
0 2048 linear mem0 0

2048 4096 striped 2 8 mem0 2048 mem1 0   # two stripes of 8 sectors
`
	lines, err := stack.ParseTable(text)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, l := range lines {
		fmt.Printf("line %d: %d+%d %s %q\n", l.N, l.Start, l.Len, l.Type, l.Params)
	}
	// Output:
	// line 2: 0+2048 linear "mem0 0"
	// line 4: 2048+4096 striped "2 8 mem0 2048 mem1 0"
}

// Build constructs the targets of parsed lines; the table then prints itself
// in the two forms of `dmsetup table` and `dmsetup status`. Here the device
// arguments are memory devices, resolved by a stacktest.Opener.
func ExampleBuild() {
	lines, err := stack.ParseTable("0 2048 linear mem0 0\n2048 4096 striped 2 8 mem0 2048 mem1 0")
	if err != nil {
		fmt.Println(err)
		return
	}
	reg, err := stack.NewRegistry(stack.Linear, stack.Striped)
	if err != nil {
		fmt.Println(err)
		return
	}
	open := stacktest.Opener{
		"mem0": stacktest.NewMemDevice("mem0", 4096*stack.SectorSize),
		"mem1": stacktest.NewMemDevice("mem1", 2048*stack.SectorSize),
	}
	t, err := stack.Build(lines, stack.BuildOptions{Registry: reg, Context: context.Background(), Open: open.Open})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer t.Close()
	fmt.Printf("%d sectors\n", t.Sectors())
	fmt.Print(t.Format(stack.StatusTable))
	// The INFO form of linear is empty: its line ends in a space.
	fmt.Printf("%q\n", t.Format(stack.StatusInfo))

	// A table that does not hold together fails with the line and the
	// target's reason, in dm's words.
	lines, _ = stack.ParseTable("0 2048 linear mem0 0\n4096 2048 linear mem2 0")
	_, err = stack.Build(lines, stack.BuildOptions{Registry: reg, Context: context.Background(), Open: open.Open})
	fmt.Println(err)
	lines, _ = stack.ParseTable("0 2048 linear mem2 0")
	_, err = stack.Build(lines, stack.BuildOptions{Registry: reg, Context: context.Background(), Open: open.Open})
	fmt.Println(err)
	// Output:
	// 6144 sectors
	// 0 2048 linear mem0 0
	// 2048 4096 striped 2 8 mem0 2048 mem1 0
	// "0 2048 linear \n2048 4096 striped 2 mem0 mem1 1 AA\n"
	// line 2: linear: Gap in table
	// line 1: linear: Device lookup failed: mem2: no such mapped device
}

// SplitArgs splits a parameter string as the kernel does; EscapeArg is its
// inverse for one argument, for device paths with spaces or backslashes.
func ExampleSplitArgs() {
	path := `/srv/disk images/a\b.img`
	params := stack.EscapeArg(path) + " 0"
	fmt.Println(params)
	for _, a := range stack.SplitArgs(params) {
		fmt.Printf("%q\n", a)
	}
	// Output:
	// /srv/disk\ images/a\\b.img 0
	// "/srv/disk images/a\\b.img"
	// "0"
}

// A reload as `dmsetup load` and `dmsetup resume` do it: the new table waits
// in the inactive slot while I/O goes on through the live one, and resume
// swaps it in. Here a volume over a memory device is grown to twice its size.
func ExampleManager_Load() {
	ctx := context.Background()
	reg, err := stack.NewRegistry(stack.Linear, stack.Zero)
	if err != nil {
		fmt.Println(err)
		return
	}
	mem := stacktest.NewMemDevice("mem0", 4096*stack.SectorSize)
	m := stack.NewManager(stack.ManagerOptions{Registry: reg, Context: ctx, Open: stacktest.Opener{"mem0": mem}.Open})
	defer m.Close()

	d, err := m.Create(stack.CreateOptions{Name: "vol", Minor: -1, Table: "0 2048 linear mem0 0"})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := d.WriteAt(ctx, []byte("hello"), 0); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("live:\n%s", d.FormatTable(stack.StatusTable, false))

	if err := m.Load("vol", "0 2048 linear mem0 0\n2048 2048 linear mem0 2048", ""); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("after load, live:\n%sinactive:\n%s", d.FormatTable(stack.StatusTable, false), d.FormatTable(stack.StatusTable, true))
	fmt.Println("size:", d.Size())

	if err := m.Suspend("vol", stack.Flags{}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("suspended:", d.Suspended())
	if err := m.Resume("vol", stack.Flags{}); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("after resume, live:\n%s", d.FormatTable(stack.StatusTable, false))
	fmt.Println("inactive:", d.Info(false).Inactive, "suspended:", d.Suspended(), "size:", d.Size())

	buf := make([]byte, 5)
	if _, err := d.ReadAt(ctx, buf, 0); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("sector 0 still reads %q\n", buf)
	// Output:
	// live:
	// 0 2048 linear mem0 0
	// after load, live:
	// 0 2048 linear mem0 0
	// inactive:
	// 0 2048 linear mem0 0
	// 2048 2048 linear mem0 2048
	// size: 1048576
	// suspended: true
	// after resume, live:
	// 0 2048 linear mem0 0
	// 2048 2048 linear mem0 2048
	// inactive: false suspended: false size: 2097152
	// sector 0 still reads "hello"
}
