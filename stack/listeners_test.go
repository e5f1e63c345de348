package stack

import (
	"reflect"
	"testing"
)

// TestListeners: OnChange runs in the order listeners subscribed, OnRemove
// in the reverse order and after the device has left the table of names; an
// unsubscribed listener hears nothing more.
func TestListeners(t *testing.T) {
	reg, err := NewRegistry(Zero)
	if err != nil {
		t.Fatal(err)
	}
	m := NewManager(ManagerOptions{Registry: reg})
	defer m.Close()
	var got []string
	listen := func(who string) Listener {
		return Listener{
			OnChange: func(d *Device) { got = append(got, who+" change "+d.Name()) },
			OnRemove: func(d *Device) {
				if m.Lookup(d.Name()) != nil {
					t.Errorf("%s: OnRemove of %s while the name is still taken", who, d.Name())
				}
				got = append(got, who+" remove "+d.Name())
			},
		}
	}
	m.Subscribe(listen("fs"))
	stop := m.Subscribe(listen("export"))
	mustCreate(t, m, "d", "0 8 zero")
	if err := m.Remove("d", Flags{}); err != nil {
		t.Fatal(err)
	}
	want := []string{"fs change d", "export change d", "export remove d", "fs remove d"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("listeners heard %q, want %q", got, want)
	}
	stop()
	got = nil
	mustCreate(t, m, "e", "0 8 zero")
	if want := []string{"fs change e"}; !reflect.DeepEqual(got, want) {
		t.Errorf("after unsubscribing: %q, want %q", got, want)
	}
}
