package flow_test

import (
	. "github.com/flowrun/flowrun/flow"
	_ "github.com/flowrun/flowrun/stages"
	"strings"
	"testing"
	"time"
)

func TestParseDuration(t *testing.T) {
	good := map[string]time.Duration{
		"250ms":   250 * time.Millisecond,
		"30s":     30 * time.Second,
		"5m":      5 * time.Minute,
		"1h30m":   90 * time.Minute,
		"7d":      7 * 24 * time.Hour,
		"1.5s":    1500 * time.Millisecond,
		"0s":      0,
		"100us":   100 * time.Microsecond,
		"100µs":   100 * time.Microsecond,
		"10ns":    10,
		"2d12h":   60 * time.Hour,
		"0.5ms":   500 * time.Microsecond,
		"1h0m10s": time.Hour + 10*time.Second,
	}
	for in, want := range good {
		got, err := ParseDuration(in)
		if err != nil || got != want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	bad := map[string]string{
		"":           "empty",
		"30":         `has no unit; write "30s"`,
		"0":          "has no unit",
		"-5s":        "negative",
		"5 seconds":  `unknown unit " seconds"`,
		"5min":       `unknown unit "min"`,
		"s":          "write a number and a unit",
		"1..5s":      "not a number",
		"999999999d": "too long",
	}
	for in, want := range bad {
		_, err := ParseDuration(in)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseDuration(%q) error = %v; want one containing %q", in, err, want)
		}
	}
}

func TestFormatDurationRoundTrips(t *testing.T) {
	for _, d := range []time.Duration{0, time.Nanosecond, 250 * time.Millisecond, 90 * time.Minute, 49 * time.Hour, 3*time.Second + 5*time.Microsecond} {
		s := FormatDuration(d)
		back, err := ParseDuration(s)
		if err != nil || back != d {
			t.Errorf("FormatDuration(%v) = %q, which parses as %v, %v", d, s, back, err)
		}
	}
}

func TestRetryDelay(t *testing.T) {
	p := RetryPolicy{MaxAttempts: 10, Backoff: BackoffExponential, Initial: 100 * time.Millisecond, Max: 5 * time.Second}
	want := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, 1600 * time.Millisecond, 3200 * time.Millisecond, 5 * time.Second}
	for i, w := range want {
		if got := p.Delay(i + 1); got != w {
			t.Errorf("exponential Delay(%d) = %v, want %v", i+1, got, w)
		}
	}
	linear := RetryPolicy{Backoff: BackoffLinear, Initial: time.Second, Max: time.Minute}
	if got := linear.Delay(3); got != 3*time.Second {
		t.Errorf("linear Delay(3) = %v", got)
	}
	constant := RetryPolicy{Backoff: BackoffConstant, Initial: time.Second, Max: time.Minute}
	if got := constant.Delay(50); got != time.Second {
		t.Errorf("constant Delay(50) = %v", got)
	}
	// Saturation: huge attempt numbers never overflow into a negative or tiny delay.
	for _, n := range []int{64, 1000, 1 << 30} {
		if got := p.Delay(n); got != p.Max {
			t.Errorf("Delay(%d) = %v, want the maximum %v", n, got, p.Max)
		}
		unbounded := RetryPolicy{Backoff: BackoffExponential, Initial: time.Hour}
		if got := unbounded.Delay(n); got <= 0 {
			t.Errorf("unbounded Delay(%d) = %v, want a positive saturated delay", n, got)
		}
	}
	if got := p.Delay(0); got != p.Initial {
		t.Errorf("Delay(0) = %v, want the initial delay", got)
	}
}
