package telemetry

import "testing"

// TestRootRatio checks which samplers the runtime takes over the sampling of new traces for.
func TestRootRatio(t *testing.T) {
	for _, tc := range []struct {
		sampler, arg string
		ratio        float64
		ok           bool
	}{
		{"parentbased_traceidratio", "0.01", 0.01, true},
		{" parentbased_traceidratio ", " 1 ", 1, true},
		{"parentbased_traceidratio", "0", 0, true},
		{"parentbased_traceidratio", "", 0, false}, // the SDK's default argument: stays with the SDK
		{"parentbased_traceidratio", "1.5", 0, false},
		{"parentbased_traceidratio", "lots", 0, false},
		{"traceidratio", "0.01", 0, false}, // judges every span by its trace ID, parent or not
		{"always_on", "", 0, false},
		{"", "0.5", 0, false},
	} {
		env := map[string]string{"OTEL_TRACES_SAMPLER": tc.sampler, "OTEL_TRACES_SAMPLER_ARG": tc.arg}
		ratio, ok := rootRatio(func(k string) string { return env[k] })
		if ratio != tc.ratio || ok != tc.ok {
			t.Errorf("%q %q: %v %v, want %v %v", tc.sampler, tc.arg, ratio, ok, tc.ratio, tc.ok)
		}
	}
}
