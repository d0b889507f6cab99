package flow

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// durationUnits are the units a duration may use, from the smallest.
var durationUnits = []struct {
	name string
	size time.Duration
}{
	{"ns", time.Nanosecond},
	{"us", time.Microsecond},
	{"µs", time.Microsecond},
	{"ms", time.Millisecond},
	{"s", time.Second},
	{"m", time.Minute},
	{"h", time.Hour},
	{"d", 24 * time.Hour},
}

// ParseDuration reads a duration such as "250ms", "30s", "5m", "1h30m" or "7d": one or more decimal
// numbers, each followed by a unit (ns, us, ms, s, m, h, d). Unlike time.ParseDuration it knows days,
// requires a unit even after zero, and refuses negative durations, which no setting of a pipeline
// means.
func ParseDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, fmt.Errorf("an empty string is not a duration; write one such as \"30s\"")
	}
	if strings.HasPrefix(s, "-") {
		return 0, fmt.Errorf("%q is negative; durations are zero or more", s)
	}
	var total float64
	rest := s
	for rest != "" {
		end := 0
		for end < len(rest) && (rest[end] >= '0' && rest[end] <= '9' || rest[end] == '.') {
			end++
		}
		if end == 0 {
			return 0, fmt.Errorf("%q is not a duration; write a number and a unit, such as \"250ms\", \"30s\", \"5m\" or \"1h\"", s)
		}
		n, err := strconv.ParseFloat(rest[:end], 64)
		if err != nil {
			return 0, fmt.Errorf("%q is not a duration: %q is not a number", s, rest[:end])
		}
		rest = rest[end:]
		unitEnd := 0
		for unitEnd < len(rest) && !(rest[unitEnd] >= '0' && rest[unitEnd] <= '9' || rest[unitEnd] == '.') {
			unitEnd++
		}
		unit := rest[:unitEnd]
		rest = rest[unitEnd:]
		if unit == "" {
			return 0, fmt.Errorf("%q has no unit; write \"%ss\", \"%sms\" or \"%sm\"", s, trimNumber(n), trimNumber(n), trimNumber(n))
		}
		size, ok := unitSize(unit)
		if !ok {
			return 0, fmt.Errorf("%q is not a duration: unknown unit %q (the units are ns, us, ms, s, m, h and d)", s, unit)
		}
		total += n * float64(size)
		if total > math.MaxInt64 {
			return 0, fmt.Errorf("%q is too long: durations end at about 292 years", s)
		}
	}
	return time.Duration(total), nil
}

func unitSize(unit string) (time.Duration, bool) {
	for _, u := range durationUnits {
		if u.name == unit {
			return u.size, true
		}
	}
	return 0, false
}

func trimNumber(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// FormatDuration prints a duration the way a pipeline would write it ("250ms", "1h30m", "2d").
func FormatDuration(d time.Duration) string {
	if d == 0 {
		return "0s"
	}
	var b strings.Builder
	for i := len(durationUnits) - 1; i >= 0; i-- {
		u := durationUnits[i]
		if u.name == "µs" {
			continue // "us" says the same in ASCII
		}
		if n := d / u.size; n > 0 {
			fmt.Fprintf(&b, "%d%s", n, u.name)
			d -= n * u.size
		}
	}
	return b.String()
}
