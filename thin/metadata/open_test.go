package metadata

import (
	"bytes"
	"context"
	"errors"
	"math/rand"
	"strings"
	"testing"

	"github.com/dmfuse/dmfuse/persistent/block"
	"github.com/dmfuse/dmfuse/persistent/btree"
)

// writeCounter fails the test on any write or flush.
type noWriteDev struct {
	*memDev
	t testing.TB
}

func (d noWriteDev) WriteAt(context.Context, []byte, int64) (int, error) {
	d.t.Error("Open wrote to a device it refused")
	return 0, errors.New("no writes")
}

func (d noWriteDev) Flush(context.Context) error {
	d.t.Error("Open flushed a device it refused")
	return errors.New("no flushes")
}

// sampleImage is a committed pool of a few devices and snapshots.
func sampleImage(t testing.TB, blocks int) *memDev {
	t.Helper()
	dev := newMemDev(blocks)
	p := mustOpen(t, dev, Options{Format: true, DataBlockSize: 128, DataBlocks: 5000})
	rng := rand.New(rand.NewSource(5))
	m := model{}
	var next uint32
	randomOps(t, rng, p, m, 40, &next)
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	p.Close()
	return dev
}

func blockOf(d *memDev, b uint64) []byte { return d.data[b*block.Size : (b+1)*block.Size] }

func reseal(d *memDev, b uint64, v *block.Validator) { v.Prepare(blockOf(d, b), b) }

func TestOpenRefuses(t *testing.T) {
	img := sampleImage(t, 512)
	sb := unpackSuperblock(blockOf(img, 0))
	cases := []struct {
		name   string
		damage func(d *memDev) *memDev
		want   string
	}{
		{"zeroed without Format", func(d *memDev) *memDev { return newMemDev(64) }, "first 4 KiB are zero"},
		{"too small to format", func(d *memDev) *memDev { return newMemDev(4) }, "too small"},
		{"other format", func(d *memDev) *memDev {
			copy(blockOf(d, 0), bytes.Repeat([]byte("XFSB"), 1024))
			return d
		}, "not thin-pool metadata"},
		{"superblock checksum", func(d *memDev) *memDev {
			blockOf(d, 0)[100] ^= 1
			return d
		}, "checksum"},
		{"superblock location", func(d *memDev) *memDev {
			le.PutUint64(blockOf(d, 0)[8:], 3)
			return d
		}, "says it is block 3"},
		{"truncated device", func(d *memDev) *memDev {
			return &memDev{data: d.data[:100*block.Size]}
		}, "space map of 512 blocks"},
		{"mapping root checksum", func(d *memDev) *memDev {
			blockOf(d, sb.mappingRoot)[200] ^= 0x40
			return d
		}, "checksum"},
		{"mapping root out of range", func(d *memDev) *memDev {
			le.PutUint64(blockOf(d, 0)[320:], 100000)
			reseal(d, 0, block.Superblock)
			return d
		}, "out of range"},
		{"details leaf value size", func(d *memDev) *memDev {
			le.PutUint32(blockOf(d, sb.detailsRoot)[24:], 8)
			le.PutUint32(blockOf(d, sb.detailsRoot)[20:], 252)
			reseal(d, sb.detailsRoot, btree.Validator)
			return d
		}, "value size"},
		{"metadata index checksum", func(d *memDev) *memDev {
			blockOf(d, sb.metaSM.BitmapRoot)[40] ^= 1
			return d
		}, "checksum"},
		{"metadata bitmap out of range", func(d *memDev) *memDev {
			le.PutUint64(blockOf(d, sb.metaSM.BitmapRoot)[16:], 9999)
			reseal(d, sb.metaSM.BitmapRoot, block.Index)
			return d
		}, "out of range"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := c.damage(img.clone())
			before := append([]byte(nil), d.data...)
			_, err := Open(noWriteDev{d, t}, Options{DataBlockSize: 128, DataBlocks: 100, Format: strings.HasSuffix(c.name, "to format")})
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open: %v, want ErrCorrupt", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("Open: %q does not say %q", err, c.want)
			}
			if !bytes.Equal(before, d.data) {
				t.Error("the refused device changed")
			}
		})
	}
	if _, err := Open(img.clone(), Options{DataBlockSize: 256}); err == nil || !strings.Contains(err.Error(), "data block size") {
		t.Errorf("Open with another block size: %v", err)
	}
}

// FuzzOpenDamaged replaces one block of a valid pool with the input,
// sealed with a valid checksum of the kind the input's first byte picks
// (or left unsealed), and opens and reads the pool: every failure must be
// an error wrapping ErrCorrupt, never a panic or a hang.
func FuzzOpenDamaged(f *testing.F) {
	img := sampleImage(f, 256)
	sb := unpackSuperblock(blockOf(img, 0))
	for _, b := range []uint64{0, sb.mappingRoot, sb.detailsRoot, sb.metaSM.BitmapRoot, sb.metaSM.RefCountRoot,
		sb.dataSM.BitmapRoot, sb.dataSM.RefCountRoot} {
		for kind := byte(0); kind < 5; kind++ {
			seed := append([]byte{kind, byte(b)}, blockOf(img, b)[:64]...)
			f.Add(seed)
		}
	}
	validators := []*block.Validator{block.Superblock, btree.Validator, block.Bitmap, block.Index}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 2 {
			return
		}
		d := img.clone()
		loc := uint64(in[1]) % (uint64(len(d.data)) / block.Size)
		blk := blockOf(d, loc)
		copy(blk, in[2:])
		if k := int(in[0]); k < len(validators) {
			reseal(d, loc, validators[k])
		}
		p, err := Open(d, Options{DataBlockSize: 128, CacheBlocks: 16})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) && !strings.Contains(err.Error(), "features") &&
				!strings.Contains(err.Error(), "data block size") {
				t.Fatalf("Open: %v does not wrap ErrCorrupt", err)
			}
			return
		}
		defer p.Close()
		for id := uint32(0); id < 8; id++ {
			th, err := p.OpenThin(id)
			if err != nil {
				continue
			}
			th.FindMappedRange(0, 5000)
			th.HighestMapped()
			for v := uint64(0); v < 3000; v += 97 {
				th.Find(v)
			}
			th.Close()
		}
		// A transaction over damaged metadata may fail; it must not
		// panic.
		if p.CreateThin(100) == nil {
			if b, err := p.AllocDataBlock(); err == nil {
				if th, err := p.OpenThin(100); err == nil {
					th.Insert(1, b)
					th.Close()
				}
			}
			p.Commit()
		}
	})
}
