package flow

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Size is an amount of bytes, written in a pipeline as a string with a unit, such as "64MiB".
type Size int64

// sizeUnits are the units a size may use, from the smallest. KiB, MiB and GiB are powers of 1024,
// KB, MB and GB powers of 1000: both are common, and a pipeline says which it means.
var sizeUnits = []struct {
	name string
	size Size
}{
	{"B", 1},
	{"KB", 1000},
	{"KiB", 1 << 10},
	{"MB", 1000 * 1000},
	{"MiB", 1 << 20},
	{"GB", 1000 * 1000 * 1000},
	{"GiB", 1 << 30},
}

// ParseSize reads a size such as "512B", "64KiB", "1.5MiB" or "2GB": a decimal number and a unit
// (B, KB, MB, GB for powers of 1000; KiB, MiB, GiB for powers of 1024), optionally separated by a
// space. As with durations, a number without a unit is an error, and so is a size that is not a
// whole number of bytes or is negative.
func ParseSize(s string) (Size, error) {
	if s == "" {
		return 0, fmt.Errorf(`an empty string is not a size; write one such as "64MiB"`)
	}
	if strings.HasPrefix(s, "-") {
		return 0, fmt.Errorf("%q is negative; sizes are zero or more", s)
	}
	end := 0
	for end < len(s) && (s[end] >= '0' && s[end] <= '9' || s[end] == '.') {
		end++
	}
	if end == 0 {
		return 0, fmt.Errorf(`%q is not a size; write a number and a unit, such as "512KiB", "64MiB" or "1GiB"`, s)
	}
	n, err := strconv.ParseFloat(s[:end], 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size: %q is not a number", s, s[:end])
	}
	unit := strings.TrimPrefix(s[end:], " ")
	if unit == "" {
		return 0, fmt.Errorf(`%q has no unit; write "%sB", "%sKiB" or "%sMiB"`, s, s[:end], s[:end], s[:end])
	}
	size, ok := sizeUnit(unit)
	if !ok {
		hint := ""
		for _, u := range sizeUnits {
			if strings.EqualFold(u.name, unit) || strings.EqualFold(u.name, unit+"B") {
				hint = fmt.Sprintf(" Did you mean %q?", s[:end]+u.name)
				break
			}
		}
		return 0, fmt.Errorf("%q is not a size: unknown unit %q (the units are B, KB, MB and GB for powers of "+
			"1000, KiB, MiB and GiB for powers of 1024).%s", s, unit, hint)
	}
	total := n * float64(size)
	if total >= math.MaxInt64 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	if total != math.Trunc(total) {
		return 0, fmt.Errorf("%q is not a whole number of bytes", s)
	}
	return Size(total), nil
}

func sizeUnit(unit string) (Size, bool) {
	for _, u := range sizeUnits {
		if u.name == unit {
			return u.size, true
		}
	}
	return 0, false
}

// FormatSize prints a size the way a pipeline would write it: in the largest power-of-1024 unit
// that divides it, or of 1000 if only that does ("64MiB", "1500B", "2MB").
func FormatSize(s Size) string {
	if s == 0 {
		return "0B"
	}
	for _, pow := range []int{1024, 1000} {
		for i := len(sizeUnits) - 1; i > 0; i-- {
			u := sizeUnits[i]
			if (pow == 1024) == strings.HasSuffix(u.name, "iB") && s%u.size == 0 {
				return strconv.FormatInt(int64(s/u.size), 10) + u.name
			}
		}
	}
	return strconv.FormatInt(int64(s), 10) + "B"
}
