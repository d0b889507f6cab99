package redis

import (
	"context"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
)

func TestHeartbeatCountsLiveMembers(t *testing.T) {
	for _, b := range []backend{serverBackend(), clusterBackend(), miniredisBackend()} {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			c := b.open(t)
			key := Keys{Prefix: "members-test-" + b.name}.Members()
			if n, err := c.Heartbeat(ctx, key, "a", time.Minute); err != nil || n != 1 {
				t.Fatalf("first heartbeat: %d, %v", n, err)
			}
			if n, err := c.Heartbeat(ctx, key, "b", time.Minute); err != nil || n != 2 {
				t.Fatalf("second member: %d, %v", n, err)
			}
			// A member whose membership lapsed is forgotten by the next heartbeat.
			lapsed := goredis.Z{Score: float64(time.Now().Add(-time.Second).UnixMilli()), Member: "dead"}
			if err := c.Universal().ZAdd(ctx, key, lapsed).Err(); err != nil {
				t.Fatal(err)
			}
			if n, err := c.Heartbeat(ctx, key, "a", time.Minute); err != nil || n != 2 {
				t.Fatalf("with a lapsed member: %d, %v", n, err)
			}
			if err := c.Leave(ctx, key, "b"); err != nil {
				t.Fatal(err)
			}
			if n, err := c.Heartbeat(ctx, key, "a", time.Minute); err != nil || n != 1 {
				t.Fatalf("after b left: %d, %v", n, err)
			}
		})
	}
}
