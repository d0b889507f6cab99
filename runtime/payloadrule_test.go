package runtime_test

import (
	"strings"
	"testing"

	"github.com/flowrun/flowrun/internal/jsonscan"
	redis "github.com/flowrun/flowrun/transport/redis"
)

// TestPayloadRulesAgree: what a payload may be (UTF-8, nested at most MaxDepth deep) is written
// twice, once for what comes through Redis (transport/redis, which imports nothing of flowrun's)
// and once for what does not (internal/jsonscan, for package stages). The two must refuse the same
// payloads with the same reasons.
func TestPayloadRulesAgree(t *testing.T) {
	if redis.MaxDepth != jsonscan.MaxDepth {
		t.Fatalf("MaxDepth: transport/redis %d, jsonscan %d", redis.MaxDepth, jsonscan.MaxDepth)
	}
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	for _, p := range []string{
		`{}`, `{"a":"é"}`, "{\"a\":\"\xff\"}", "\xc3", `{"a":"` + strings.Repeat("[", 2000) + `"}`,
		deep(redis.MaxDepth), deep(redis.MaxDepth + 1), `{"a":` + deep(redis.MaxDepth) + `}`,
		`{"a":"\\"` + deep(redis.MaxDepth+1) + `"}`, `{"a":"\\\\"` + deep(redis.MaxDepth+1) + `}`,
		strings.Repeat("{", redis.MaxDepth+5), `"unterminated ` + strings.Repeat("[", 1500),
	} {
		a, b := redis.CheckPayload([]byte(p)), jsonscan.Check([]byte(p))
		if (a == nil) != (b == nil) || (a != nil && a.Error() != b.Error()) {
			t.Errorf("payload %.40q: transport/redis says %v, jsonscan %v", p, a, b)
		}
	}
}
