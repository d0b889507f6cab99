package redis

// FNV-1a 64-bit parameters (http://www.isthe.com/chongo/tech/comp/fnv/).
const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// Partition returns the partition, in [0, partitions), of a message key.
//
// The hash is FNV-1a 64 over the key's bytes (UTF-8 for Go strings), reduced modulo the number
// of partitions as an unsigned 64-bit integer:
//
//	h := 14695981039346656037
//	for each byte b of key: h = (h XOR b) * 1099511628211   (mod 2^64)
//	partition = h mod partitions
//
// This is part of flowrun's data format: it is the same in every process and every version, so
// that messages with one key always land in one partition. Changing it would reorder keys
// across a running pipeline; the tests pin it with fixed vectors. The empty key hashes like any
// other (to 14695981039346656037 mod partitions). It panics if partitions < 1.
func Partition(key string, partitions int) int {
	if partitions < 1 {
		panic("redis: Partition with partitions < 1")
	}
	h := uint64(fnvOffset64)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= fnvPrime64
	}
	return int(h % uint64(partitions))
}
