package redis

import "strings"

// slotCount is the number of hash slots of a Redis Cluster.
const slotCount = 16384

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0, no reflection), the checksum Redis
// Cluster uses for key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// HashSlot returns the Redis Cluster slot of a key: CRC16 of the key's hash tag (the text
// between the first '{' and the next '}', when that text is non-empty) or of the whole key,
// modulo 16384. Keys with equal slots can be used together in one script or transaction.
func HashSlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key) % slotCount)
}
