// This file holds how the sql sink turns a message into a row: each column's expression evaluated,
// and the JSON value converted for the column's kind (a whole number for an integer, a time for a
// timestamp, ...), or refused for good. It is apart because it changes with the types the sink
// converts, not with the database or the delivery.

package stages

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/flowrun/flowrun/flow/expr"
)

// values evaluates a message's columns and converts them for the database.
func (s *sqlSink) values(m *Message) ([]any, error) {
	if err := m.Decode(); err != nil {
		return nil, err
	}
	env := expr.Env{Msg: m.Value}
	out := make([]any, len(s.fields))
	for i, f := range s.fields {
		v, err := f.Expr.Eval(&env)
		if err != nil {
			return nil, evalError(fmt.Errorf("column %s: %w", f.Name, err))
		}
		var col sqlColumn
		if i < len(s.columns) {
			col = s.columns[i]
		}
		if out[i], err = convertColumn(col, v.Interface()); err != nil {
			return nil, Permanent(fmt.Errorf("table %s, column %s (%s): %w", s.display, f.Name, col.typ, err))
		}
	}
	return out, nil
}

// convertColumn converts a JSON value for a column of the given kind.
func convertColumn(col sqlColumn, v any) (any, error) {
	if v == nil {
		return nil, nil
	}
	switch col.kind {
	case colInt:
		n, err := wholeNumber(v)
		if err != nil {
			return nil, err
		}
		if lo, hi, ok := intRange(col.typ); ok && (n < lo || n > hi) {
			return nil, fmt.Errorf("%d is out of the column's range [%d, %d]", n, lo, hi)
		}
		return n, nil
	case colDecimal:
		switch x := v.(type) {
		case json.Number:
			return string(x), nil
		case float64:
			return strconv.FormatFloat(x, 'f', -1, 64), nil
		case string:
			if _, err := strconv.ParseFloat(strings.TrimSpace(x), 64); err != nil {
				return nil, fmt.Errorf("%q is not a number", x)
			}
			return strings.TrimSpace(x), nil
		}
		return nil, fmt.Errorf("%s is not a number", describeJSON(v))
	case colFloat:
		switch x := v.(type) {
		case json.Number:
			return x.Float64()
		case float64:
			return x, nil
		case string:
			f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
			if err != nil {
				return nil, fmt.Errorf("%q is not a number", x)
			}
			return f, nil
		}
		return nil, fmt.Errorf("%s is not a number", describeJSON(v))
	case colBool:
		switch x := v.(type) {
		case bool:
			return x, nil
		case string:
			if b, err := strconv.ParseBool(x); err == nil {
				return b, nil
			}
		}
		return nil, fmt.Errorf("%s is not a boolean", describeJSON(v))
	case colTime:
		return timeValue(v)
	case colJSON:
		b, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		return string(b), nil
	case colBytes:
		if x, ok := v.(string); ok {
			return []byte(x), nil
		}
		return json.Marshal(v)
	case colText:
		text, err := textOf(v)
		if err != nil {
			return nil, err
		}
		if col.maxLen > 0 && int64(len([]rune(text))) > col.maxLen {
			return nil, fmt.Errorf("%d characters do not fit in %d", len([]rune(text)), col.maxLen)
		}
		return text, nil
	}
	switch v.(type) {
	case string, bool:
		return v, nil
	}
	return textOf(v)
}

// textOf is a JSON value as text: a string as it is, anything else as JSON.
func textOf(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case json.Number:
		return string(x), nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case bool:
		return strconv.FormatBool(x), nil
	}
	b, err := json.Marshal(v)
	return string(b), err
}

// wholeNumber reads an integer column's value: a whole number, or a string that holds one.
func wholeNumber(v any) (int64, error) {
	var text string
	switch x := v.(type) {
	case json.Number:
		text = string(x)
	case float64:
		if x != math.Trunc(x) || math.IsInf(x, 0) || x > math.MaxInt64 || x < math.MinInt64 {
			return 0, fmt.Errorf("%v is not a whole number", x)
		}
		return int64(x), nil
	case string:
		text = strings.TrimSpace(x)
	case bool:
		if x {
			return 1, nil
		}
		return 0, nil
	default:
		return 0, fmt.Errorf("%s is not a number", describeJSON(v))
	}
	if n, err := strconv.ParseInt(text, 10, 64); err == nil {
		return n, nil
	}
	f, err := strconv.ParseFloat(text, 64)
	if err != nil || f != math.Trunc(f) || f > math.MaxInt64 || f < math.MinInt64 {
		return 0, fmt.Errorf("%s is not a whole number", strconv.Quote(text))
	}
	return int64(f), nil
}

// intRange is the range of an integer type by its name.
func intRange(typ string) (lo, hi int64, ok bool) {
	switch strings.ToLower(typ) {
	case "smallint":
		return math.MinInt16, math.MaxInt16, true
	case "integer", "int":
		return math.MinInt32, math.MaxInt32, true
	case "tinyint":
		return math.MinInt8, math.MaxInt8, true
	case "mediumint":
		return -1 << 23, 1<<23 - 1, true
	}
	return 0, 0, false
}

// timeValue reads a timestamp: an RFC 3339 string, a date (2006-01-02), or Unix milliseconds.
func timeValue(v any) (any, error) {
	switch x := v.(type) {
	case string:
		if t, err := time.Parse(time.RFC3339Nano, x); err == nil {
			return t.UTC(), nil
		}
		if t, err := time.Parse(time.DateOnly, x); err == nil {
			return t, nil
		}
		return nil, fmt.Errorf("%q is not an RFC 3339 time (2006-01-02T15:04:05Z) or a date", x)
	case json.Number, float64:
		n, err := wholeNumber(x)
		if err != nil {
			return nil, fmt.Errorf("%v is not a time in Unix milliseconds", x)
		}
		return time.UnixMilli(n).UTC(), nil
	}
	return nil, fmt.Errorf("%s is not a time", describeJSON(v))
}

func describeJSON(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	case bool:
		return fmt.Sprint(v)
	}
	s, _ := textOf(v)
	return strconv.Quote(s)
}
