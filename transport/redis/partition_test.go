package redis

import (
	"fmt"
	"hash/fnv"
	"testing"
)

// The partition of a key is part of flowrun's data format: these vectors must never change.
var partitionVectors = []struct {
	key  string
	hash uint64
	p    [4]int // partitions for P = 1, 3, 8, 16
}{
	{"", 0xcbf29ce484222325, [4]int{0, 2, 5, 5}},
	{"a", 0xaf63dc4c8601ec8c, [4]int{0, 1, 4, 12}},
	{"customer-42", 0x1e1b8c70eb18f59e, [4]int{0, 2, 6, 14}},
	{"order:1001", 0x5e16746520caee69, [4]int{0, 1, 1, 9}},
	{"héllo", 0xa35ff71f960240e0, [4]int{0, 1, 0, 0}},
	{"🚀", 0xff06d33875097bda, [4]int{0, 2, 2, 10}},
	{"0", 0xaf63ad4c86019caf, [4]int{0, 2, 7, 15}},
	{"user_7", 0xf7a190aa74b9ad40, [4]int{0, 0, 0, 0}},
	{"cust-1", 0x0942973465ea8c64, [4]int{0, 1, 4, 4}},
	{"cust-2", 0x09429a3465ea917d, [4]int{0, 1, 5, 13}},
}

func TestPartitionVectors(t *testing.T) {
	for _, v := range partitionVectors {
		h := fnv.New64a()
		h.Write([]byte(v.key))
		if h.Sum64() != v.hash {
			t.Errorf("FNV-1a 64 of %q = %#x, vector says %#x", v.key, h.Sum64(), v.hash)
		}
		for i, parts := range []int{1, 3, 8, 16} {
			if got := Partition(v.key, parts); got != v.p[i] {
				t.Errorf("Partition(%q, %d) = %d, want %d", v.key, parts, got, v.p[i])
			}
		}
	}
}

func TestPartitionSpreadsKeys(t *testing.T) {
	counts := make([]int, 8)
	for i := range 8000 {
		counts[Partition(fmt.Sprintf("customer-%d", i), 8)]++
	}
	for p, n := range counts {
		if n < 800 || n > 1200 {
			t.Errorf("partition %d got %d of 8000 keys; the hash is badly skewed: %v", p, n, counts)
		}
	}
}

func TestPartitionPanicsBelowOne(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("Partition(k, 0) did not panic")
		}
	}()
	Partition("k", 0)
}

func TestPartitionDoesNotAllocate(t *testing.T) {
	if n := testing.AllocsPerRun(100, func() { Partition("customer-42", 8) }); n != 0 {
		t.Fatalf("Partition allocates %v times", n)
	}
}

func BenchmarkPartition(b *testing.B) {
	for b.Loop() {
		Partition("customer-42", 8)
	}
}
