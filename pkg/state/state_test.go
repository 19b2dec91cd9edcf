package state

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestRecordsRoundTripAndDeleteIsIdempotent(t *testing.T) {
	s := NewStore(t.TempDir())
	r := Record{ContainerID: "abc.def-1", IfName: "net0", VPC: "blue", Attachment: "web-0", Addresses: []string{"10.20.0.5/24"}, HolderGeneration: 3}
	if err := s.Put(r); err != nil {
		t.Fatal(err)
	}
	got, ok, err := s.Get("abc.def-1", "net0")
	if err != nil || !ok || got.VPC != "blue" || got.HolderGeneration != 3 {
		t.Fatalf("Get = %+v %v %v", got, ok, err)
	}
	if _, ok, _ := s.Get("abc.def-1", "net1"); ok {
		t.Fatal("a record of another interface must not be found")
	}
	list, err := s.List()
	if err != nil || len(list) != 1 {
		t.Fatalf("List = %v %v", list, err)
	}
	for range 2 {
		if err := s.Delete("abc.def-1", "net0"); err != nil {
			t.Fatal(err)
		}
	}
	if list, _ := s.List(); len(list) != 0 {
		t.Fatalf("records left: %v", list)
	}
}

func TestRecordKeysCannotEscapeTheStore(t *testing.T) {
	s := NewStore(t.TempDir())
	for _, bad := range [][2]string{{"../x", "net0"}, {"c", "../../etc"}, {"", "net0"}, {"..", "net0"}} {
		if err := s.Put(Record{ContainerID: bad[0], IfName: bad[1]}); err == nil {
			t.Errorf("Put(%q) accepted", bad)
		}
	}
}

func TestListReportsAnUnreadableRecordButKeepsTheRest(t *testing.T) {
	dir := t.TempDir()
	s := NewStore(dir)
	if err := s.Put(Record{ContainerID: "good", IfName: "net0"}); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(s.Dir, "bad", "net0.json")
	_ = os.MkdirAll(filepath.Dir(bad), 0o700)
	_ = os.WriteFile(bad, []byte("{"), 0o600)
	list, err := s.List()
	if err == nil || len(list) != 1 || list[0].ContainerID != "good" {
		t.Fatalf("List = %v, %v", list, err)
	}
}

func TestInvocationFindsTheRecordsOfOneADDInInterfaceOrder(t *testing.T) {
	s := NewStore(t.TempDir())
	for _, r := range []Record{
		{ContainerID: "c1", IfName: "net10", ChainIfName: "eth0"},
		{ContainerID: "c1", IfName: "net2", ChainIfName: "eth0"},
		{ContainerID: "c1", IfName: "eth0"},
		{ContainerID: "c1", IfName: "net1", ChainIfName: "eth0"},
		{ContainerID: "c1", IfName: "tap7"}, // another ADD of the same container
		{ContainerID: "c2", IfName: "eth0"},
	} {
		if err := s.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	recs, err := s.Invocation("c1", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range recs {
		got = append(got, r.IfName)
	}
	if want := []string{"eth0", "net1", "net2", "net10"}; !slices.Equal(got, want) {
		t.Fatalf("Invocation = %v, want %v", got, want)
	}
	if recs, err := s.Invocation("c3", "eth0"); err != nil || len(recs) != 0 {
		t.Fatalf("no records: %v, %v", recs, err)
	}
	if _, err := s.Invocation("../c1", "eth0"); err == nil {
		t.Fatal("a key outside the store was accepted")
	}
}
