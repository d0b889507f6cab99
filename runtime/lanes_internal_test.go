package runtime

import (
	"fmt"
	"testing"

	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestKeysOfAPartitionSpreadOverItsLanes: the keys of one partition use every lane, whatever the
// numbers of partitions and lanes. (Lanes picked by the partition hash put every key of a partition
// in one lane when the lanes divide the partitions: concurrency 4 on 4 partitions ran one message
// at a time.)
func TestKeysOfAPartitionSpreadOverItsLanes(t *testing.T) {
	for _, partitions := range []int{1, 2, 3, 4, 8, 16} {
		for _, lanes := range []int{2, 4, 8, 16} {
			used := map[int]int{}
			keys := 0
			for k := 0; keys < 100*lanes; k++ {
				key := fmt.Sprintf("customer-%d", k)
				if redis.Partition(key, partitions) != 0 {
					continue
				}
				keys++
				used[laneOf(key, lanes)]++
			}
			for lane := range lanes {
				// 100 keys per lane on average: a lane with fewer than 50 is no accident.
				if used[lane] < 50 {
					t.Errorf("%d partitions, %d lanes: lane %d has %d of the %d keys of partition 0 (%v)",
						partitions, lanes, lane, used[lane], keys, used)
				}
			}
		}
	}
}
