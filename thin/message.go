package thin

import (
	"context"
	"errors"
	"strings"
	"syscall"

	"github.com/dmfuse/dmfuse/stack"
	"github.com/dmfuse/dmfuse/thin/metadata"
)

// Message takes the pool's messages (pool_message):
//
//	create_thin <dev id>
//	create_snap <dev id> <origin id>
//	delete <dev id>
//	set_transaction_id <current id> <new id>
//	reserve_metadata_snap
//	release_metadata_snap
//
// Names are compared without case. In a read-only or failed pool every
// message fails with EOPNOTSUPP; an unknown name, a wrong argument count
// (the name counted) or a bad device id (decimal, at most 2^24-1) with
// EINVAL; the metadata's refusals with the kernel's errnos (EEXIST for an
// id in use, ENODATA for a missing one, EBUSY for an open device or a
// second metadata snapshot). A message that succeeds commits.
func (pt *PoolTarget) Message(_ context.Context, args []string) (string, error) {
	p := pt.pool
	if p.getMode() >= modeOutOfMetadataSpace {
		return "", &stack.ArgError{Reason: "unable to service pool target messages in READ_ONLY or FAIL mode", Errno: syscall.EOPNOTSUPP}
	}
	if len(args) == 0 {
		return "", stack.Errorf("Empty message received")
	}
	var err error
	switch strings.ToLower(args[0]) {
	case "create_thin":
		err = p.msgCreateThin(args)
	case "create_snap":
		err = p.msgCreateSnap(args)
	case "delete":
		err = p.msgDelete(args)
	case "set_transaction_id":
		err = p.msgSetTransactionID(args)
	case "reserve_metadata_snap":
		err = p.msgReserve(args)
	case "release_metadata_snap":
		err = p.msgRelease(args)
	default:
		err = stack.Errorf("Unrecognised thin pool target message received: %s", args[0])
	}
	if err != nil {
		return "", err
	}
	_ = p.commit()
	return "", nil
}

// checkArgCount is check_arg_count.
func checkArgCount(args []string, n int) error {
	if len(args) != n {
		return stack.Errorf("Message received with %d arguments instead of %d.", len(args), n)
	}
	return nil
}

// ParseDevID reads a thin device id as read_dev_id does: kstrtoull base
// 10, at most 2^24-1.
func ParseDevID(s string) (uint32, bool) {
	v, err := stack.ParseUint64(s)
	if err != nil || v > maxDevID {
		return 0, false
	}
	return uint32(v), true
}

func readDevID(s string) (uint32, error) {
	id, ok := ParseDevID(s)
	if !ok {
		return 0, stack.Errorf("Message received with invalid device id: %s", s)
	}
	return id, nil
}

// msgErr wraps a metadata refusal with the kernel's log line and errno.
func msgErr(what string, err error) error {
	return &stack.ArgError{Reason: what + ": " + err.Error(), Errno: storeErrno(err)}
}

// withMetadata runs a metadata change under the commit lock: a message
// runs between commits, never inside one.
func (p *pool) withMetadata(f func(s metadata.Store) error) error {
	p.commitMu.RLock()
	defer p.commitMu.RUnlock()
	return f(p.store)
}

func (p *pool) msgCreateThin(args []string) error {
	if err := checkArgCount(args, 2); err != nil {
		return err
	}
	id, err := readDevID(args[1])
	if err != nil {
		return err
	}
	if err := p.withMetadata(func(s metadata.Store) error { return s.CreateThin(id) }); err != nil {
		return msgErr("Creation of new thinly-provisioned device with id "+args[1]+" failed.", err)
	}
	return nil
}

func (p *pool) msgCreateSnap(args []string) error {
	if err := checkArgCount(args, 3); err != nil {
		return err
	}
	id, err := readDevID(args[1])
	if err != nil {
		return err
	}
	origin, err := readDevID(args[2])
	if err != nil {
		return err
	}
	if err := p.withMetadata(func(s metadata.Store) error { return s.CreateSnap(id, origin) }); err != nil {
		return msgErr("Creation of new snapshot "+args[1]+" of device "+args[2]+" failed.", err)
	}
	return nil
}

func (p *pool) msgDelete(args []string) error {
	if err := checkArgCount(args, 2); err != nil {
		return err
	}
	id, err := readDevID(args[1])
	if err != nil {
		return err
	}
	if err := p.withMetadata(func(s metadata.Store) error { return s.DeleteThin(id) }); err != nil {
		return msgErr("Deletion of thin device "+args[1]+" failed.", err)
	}
	return nil
}

func (p *pool) msgSetTransactionID(args []string) error {
	if err := checkArgCount(args, 3); err != nil {
		return err
	}
	old, err := stack.ParseUint64(args[1])
	if err != nil {
		return stack.Errorf("set_transaction_id message: Unrecognised id %s.", args[1])
	}
	nw, err := stack.ParseUint64(args[2])
	if err != nil {
		return stack.Errorf("set_transaction_id message: Unrecognised new id %s.", args[2])
	}
	if err := p.withMetadata(func(s metadata.Store) error { return s.SetTransactionID(old, nw) }); err != nil {
		e := &stack.ArgError{Reason: "Failed to change transaction id from " + args[1] + " to " + args[2] + ".", Errno: syscall.EINVAL}
		if !errors.Is(err, metadata.ErrReadOnly) && !errors.Is(err, metadata.ErrCorrupt) {
			return e
		}
		e.Errno = storeErrno(err)
		return e
	}
	return nil
}

func (p *pool) msgReserve(args []string) error {
	if err := checkArgCount(args, 1); err != nil {
		return err
	}
	_ = p.commit()
	if err := p.withMetadata(func(s metadata.Store) error { return s.ReserveMetadataSnap() }); err != nil {
		if errors.Is(err, metadata.ErrBusy) {
			return &stack.ArgError{Reason: "Pool metadata snapshot already exists: release this before taking another.", Errno: syscall.EBUSY}
		}
		return msgErr("reserve_metadata_snap message failed.", err)
	}
	return nil
}

func (p *pool) msgRelease(args []string) error {
	if err := checkArgCount(args, 1); err != nil {
		return err
	}
	if p.store.MetadataSnap() == 0 {
		return stack.Errorf("No pool metadata snapshot found: nothing to release.")
	}
	if err := p.withMetadata(func(s metadata.Store) error { return s.ReleaseMetadataSnap() }); err != nil {
		return msgErr("release_metadata_snap message failed.", err)
	}
	return nil
}
