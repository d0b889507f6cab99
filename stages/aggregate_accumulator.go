package stages

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"

	"github.com/flowrun/flowrun/flow"
)

// The aggregate functions of the aggregate kind: each is one entry of aggregateFunctions, which says
// how it folds a message's value into a window's running value (add), folds two running values of
// one field together (merge: the sessions that an event joins), and makes the field's result of one
// (value). The language knows the same names, with their arguments (flow.AggregateFuncs); a test
// holds the two lists together.

// accumulator is one aggregate field's running value, as the window's state holds it (JSON): each
// function uses the parts it needs. The JSON names are the state's encoding, which state already
// written in Redis is read with: never rename them.
type accumulator struct {
	N        int64            `json:"n,omitempty"` // values counted (count, avg)
	Sum      float64          `json:"sum,omitempty"`
	Best     any              `json:"best,omitempty"` // min or max so far
	Distinct map[string]bool  `json:"d,omitempty"`
	Counts   map[string]int64 `json:"c,omitempty"` // top_k
	Value    any              `json:"v,omitempty"` // first or last; max_by or min_by
	At       int64            `json:"at,omitempty"`
	Set      bool             `json:"set,omitempty"` // Value (or Best) has been set
	By       any              `json:"by,omitempty"`  // max_by and min_by: the BY of Value
}

// aggregateFunction is what one aggregate function does with an accumulator.
type aggregateFunction struct {
	// add folds in one value: the field's argument on one message, at the message's event time.
	// It never sees a null value unless countsNulls is set.
	add func(a *accumulator, v any, at int64)
	// merge folds in another running value of the same field, as if its values had been added here.
	merge func(a, b *accumulator)
	// value is the field's result.
	value func(a *accumulator, f flow.Aggregate) any
	// countsNulls: add takes null values too. Only count() does, which has no argument and counts
	// every message; the other functions skip nulls.
	countsNulls bool
}

// aggregateFunctions are the aggregate functions by name.
var aggregateFunctions = map[string]aggregateFunction{
	"count": {
		add:         func(a *accumulator, _ any, _ int64) { a.N++ },
		merge:       mergeSums,
		value:       func(a *accumulator, _ flow.Aggregate) any { return a.N },
		countsNulls: true,
	},
	"sum":            {add: addToSum, merge: mergeSums, value: func(a *accumulator, _ flow.Aggregate) any { return number(a.Sum) }},
	"avg":            {add: addToSum, merge: mergeSums, value: average},
	"min":            bestOf(before),
	"max":            bestOf(func(v, best any) bool { return before(best, v) }),
	"count_distinct": {add: addDistinct, merge: mergeDistinct, value: func(a *accumulator, _ flow.Aggregate) any { return len(a.Distinct) }},
	"top_k":          {add: addToCounts, merge: mergeCounts, value: topK},
	"first":          keptBy(func(at, keptAt int64) bool { return at < keptAt }),
	"last":           keptBy(func(at, keptAt int64) bool { return at >= keptAt }),
	"max_by":         pickedBy(1),
	"min_by":         pickedBy(-1),
}

// aggregateField is one field of an aggregate's results, with its function.
type aggregateField struct {
	flow.Aggregate
	fn aggregateFunction
}

// add folds one value of a field of function fn in: nulls count for count() only.
func (a *accumulator) add(fn aggregateFunction, v any, at int64) {
	if v == nil && !fn.countsNulls {
		return
	}
	fn.add(a, v, at)
}

// addToSum adds a number, or a string that holds one, for sum and avg; other values do not count.
func addToSum(a *accumulator, v any, _ int64) {
	if f, ok := toFloat(v); ok {
		a.Sum += f
		a.N++
	}
}

// mergeSums adds the counts and sums of count, sum and avg.
func mergeSums(a, b *accumulator) {
	a.N += b.N
	a.Sum += b.Sum
}

func average(a *accumulator, _ flow.Aggregate) any {
	if a.N == 0 {
		return nil
	}
	return number(a.Sum / float64(a.N))
}

// bestOf is min or max: it keeps the value that is better than every other by better.
func bestOf(better func(v, best any) bool) aggregateFunction {
	keep := func(a *accumulator, v any) {
		if !a.Set || better(v, a.Best) {
			a.Best, a.Set = v, true
		}
	}
	return aggregateFunction{
		add: func(a *accumulator, v any, _ int64) { keep(a, v) },
		merge: func(a, b *accumulator) {
			if b.Set {
				keep(a, b.Best)
			}
		},
		value: func(a *accumulator, _ flow.Aggregate) any { return a.Best },
	}
}

// keptBy is first or last: it keeps the value whose event time wins over every other's by wins.
func keptBy(wins func(at, keptAt int64) bool) aggregateFunction {
	keep := func(a *accumulator, v any, at int64) {
		if !a.Set || wins(at, a.At) {
			a.Value, a.At, a.Set = v, at, true
		}
	}
	return aggregateFunction{
		add: keep,
		merge: func(a, b *accumulator) {
			if b.Set {
				keep(a, b.Value, b.At)
			}
		},
		value: func(a *accumulator, _ flow.Aggregate) any { return a.Value },
	}
}

// byArgs are the two arguments of max_by or min_by on one message, which the stage passes to add
// as one value.
type byArgs struct{ value, by any }

// pickedBy is max_by (sign 1) or min_by (sign -1): the VALUE of the message whose (BY, VALUE) is the
// largest or the smallest by compareValues, a total order, so that which message wins depends on
// the messages only, never on their order of arrival or on how sessions merge. A message whose BY
// is null does not count; its VALUE may be null. Values are kept as JSON decodes them (numbers as
// float64), so that a comparison gives the same answer before and after the state is reloaded.
func pickedBy(sign int) aggregateFunction {
	keep := func(a *accumulator, v, by any) {
		if !a.Set || sign*cmp.Or(compareValues(by, a.By), compareValues(v, a.Value)) > 0 {
			a.Value, a.By, a.Set = v, by, true
		}
	}
	return aggregateFunction{
		add: func(a *accumulator, v any, _ int64) {
			args, _ := v.(byArgs)
			if args.by == nil {
				return
			}
			keep(a, asDecoded(args.value), asDecoded(args.by))
		},
		merge: func(a, b *accumulator) {
			if b.Set {
				keep(a, b.Value, b.By)
			}
		},
		value: func(a *accumulator, _ flow.Aggregate) any { return a.Value },
	}
}

// compareValues orders any two values totally, for max_by and min_by: numbers (and strings that
// hold one) before other values, and by value; other values by their text; values equal so far by
// their JSON. Only values with the same JSON compare equal.
func compareValues(v, w any) int {
	fv, vNum := toOrderedFloat(v)
	fw, wNum := toOrderedFloat(w)
	switch {
	case vNum && wNum:
		if c := cmp.Compare(fv, fw); c != 0 {
			return c
		}
	case vNum:
		return -1
	case wNum:
		return 1
	default:
		if c := strings.Compare(fmt.Sprint(v), fmt.Sprint(w)); c != 0 {
			return c
		}
	}
	return strings.Compare(canonical(v), canonical(w))
}

// toOrderedFloat is toFloat without NaN, which no number is less or greater than.
func toOrderedFloat(v any) (float64, bool) {
	f, ok := toFloat(v)
	return f, ok && !math.IsNaN(f)
}

// asDecoded is a value as it reads back from the state's JSON: a json.Number as float64, and a list
// or an object through JSON, whose numbers may be json.Numbers.
func asDecoded(v any) any {
	switch x := v.(type) {
	case nil, bool, string, float64:
		return v
	case json.Number:
		if f, err := x.Float64(); err == nil {
			return f
		}
		return x.String()
	}
	b, err := json.Marshal(v)
	if err != nil {
		return v
	}
	var out any
	if json.Unmarshal(b, &out) != nil {
		return v
	}
	return out
}

func addDistinct(a *accumulator, v any, _ int64) { a.Distinct = put(a.Distinct, canonical(v), true) }

func mergeDistinct(a, b *accumulator) {
	for v := range b.Distinct {
		a.Distinct = put(a.Distinct, v, true)
	}
}

func addToCounts(a *accumulator, v any, _ int64) {
	if a.Counts == nil {
		a.Counts = map[string]int64{}
	}
	a.Counts[canonical(v)]++
}

func mergeCounts(a, b *accumulator) {
	for v, n := range b.Counts {
		a.Counts = put(a.Counts, v, a.Counts[v]+n)
	}
}

// topK is top_k's result: its k most frequent values, most frequent first, equally frequent ones
// in the order of their JSON.
func topK(a *accumulator, f flow.Aggregate) any {
	values := make([]string, 0, len(a.Counts))
	for v := range a.Counts {
		values = append(values, v)
	}
	sort.Slice(values, func(i, j int) bool {
		if a.Counts[values[i]] != a.Counts[values[j]] {
			return a.Counts[values[i]] > a.Counts[values[j]]
		}
		return values[i] < values[j]
	})
	top := make([]any, 0, min(f.K, len(values)))
	for _, v := range values[:min(f.K, len(values))] {
		var x any
		if json.Unmarshal([]byte(v), &x) != nil {
			x = v
		}
		top = append(top, x)
	}
	return top
}

func put[V any](m map[string]V, k string, v V) map[string]V {
	if m == nil {
		m = map[string]V{}
	}
	m[k] = v
	return m
}

// canonical is a value's JSON, for counting equal values together.
func canonical(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	return string(b)
}

func toFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case json.Number:
		f, err := x.Float64()
		return f, err == nil
	case string:
		f, err := strconv.ParseFloat(x, 64)
		return f, err == nil
	}
	return 0, false
}

// before orders values for min and max: numbers by value, anything else by its text.
func before(v, w any) bool {
	fv, vNum := toFloat(v)
	fw, wNum := toFloat(w)
	if vNum && wNum {
		return fv < fw
	}
	return fmt.Sprint(v) < fmt.Sprint(w)
}

// number is a float64 result, as a whole number when it is one.
func number(f float64) any {
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return int64(f)
	}
	return f
}
