package redis

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/flowrun/flowrun/internal/redistest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(redistest.M(m)) }
