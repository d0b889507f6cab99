package expr

import (
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/hcl/v2/ext/tryfunc"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
	"github.com/zclconf/go-cty/cty/function/stdlib"
	"golang.org/x/text/unicode/norm"
)

var (
	builtinsOnce sync.Once
	builtins     map[string]function.Function
)

// Functions returns the function table flowrun offers: the common cty
// stdlib functions (with Terraform's names: reverse is for lists, strrev
// for strings), the conversion functions tostring, tonumber, tobool,
// tolist, tomap and toset, startswith, endswith and strcontains, length
// (strings count grapheme clusters, objects count attributes), uuid and
// timestamp, and the try and can special forms. The map is a fresh copy:
// callers add their own config-time functions (env, file) to it.
func Functions() map[string]function.Function {
	builtinsOnce.Do(func() {
		builtins = map[string]function.Function{
			"abs":             stdlib.AbsoluteFunc,
			"can":             tryfunc.CanFunc,
			"ceil":            stdlib.CeilFunc,
			"chomp":           stdlib.ChompFunc,
			"chunklist":       stdlib.ChunklistFunc,
			"coalesce":        stdlib.CoalesceFunc,
			"coalescelist":    stdlib.CoalesceListFunc,
			"compact":         stdlib.CompactFunc,
			"concat":          stdlib.ConcatFunc,
			"contains":        stdlib.ContainsFunc,
			"csvdecode":       stdlib.CSVDecodeFunc,
			"distinct":        stdlib.DistinctFunc,
			"element":         stdlib.ElementFunc,
			"endswith":        endsWithFunc,
			"flatten":         stdlib.FlattenFunc,
			"floor":           stdlib.FloorFunc,
			"format":          stdlib.FormatFunc,
			"formatdate":      stdlib.FormatDateFunc,
			"formatlist":      stdlib.FormatListFunc,
			"indent":          stdlib.IndentFunc,
			"join":            stdlib.JoinFunc,
			"jsondecode":      stdlib.JSONDecodeFunc,
			"jsonencode":      stdlib.JSONEncodeFunc,
			"keys":            stdlib.KeysFunc,
			"length":          lengthFunc,
			"log":             stdlib.LogFunc,
			"lookup":          stdlib.LookupFunc,
			"lower":           stdlib.LowerFunc,
			"max":             stdlib.MaxFunc,
			"merge":           stdlib.MergeFunc,
			"min":             stdlib.MinFunc,
			"parseint":        stdlib.ParseIntFunc,
			"pow":             stdlib.PowFunc,
			"range":           stdlib.RangeFunc,
			"regex":           stdlib.RegexFunc,
			"regexall":        stdlib.RegexAllFunc,
			"replace":         stdlib.ReplaceFunc,
			"reverse":         stdlib.ReverseListFunc,
			"setintersection": stdlib.SetIntersectionFunc,
			"setproduct":      stdlib.SetProductFunc,
			"setsubtract":     stdlib.SetSubtractFunc,
			"setunion":        stdlib.SetUnionFunc,
			"signum":          stdlib.SignumFunc,
			"slice":           stdlib.SliceFunc,
			"sort":            stdlib.SortFunc,
			"split":           stdlib.SplitFunc,
			"startswith":      startsWithFunc,
			"strcontains":     strContainsFunc,
			"strrev":          stdlib.ReverseFunc,
			"substr":          stdlib.SubstrFunc,
			"sum":             sumFunc,
			"timeadd":         stdlib.TimeAddFunc,
			"timestamp":       timestampFunc,
			"title":           stdlib.TitleFunc,
			"tobool":          stdlib.MakeToFunc(cty.Bool),
			"tolist":          stdlib.MakeToFunc(cty.List(cty.DynamicPseudoType)),
			"tomap":           stdlib.MakeToFunc(cty.Map(cty.DynamicPseudoType)),
			"tonumber":        stdlib.MakeToFunc(cty.Number),
			"toset":           stdlib.MakeToFunc(cty.Set(cty.DynamicPseudoType)),
			"tostring":        stdlib.MakeToFunc(cty.String),
			"trim":            stdlib.TrimFunc,
			"trimprefix":      stdlib.TrimPrefixFunc,
			"trimspace":       stdlib.TrimSpaceFunc,
			"trimsuffix":      stdlib.TrimSuffixFunc,
			"try":             tryfunc.TryFunc,
			"upper":           stdlib.UpperFunc,
			"uuid":            uuidFunc,
			"values":          stdlib.ValuesFunc,
			"zipmap":          stdlib.ZipmapFunc,
		}
	})
	out := make(map[string]function.Function, len(builtins))
	for k, v := range builtins {
		out[k] = v
	}
	return out
}

// The functions cty's stdlib lacks.

var lengthFunc = function.New(&function.Spec{
	Description: "Returns the number of elements of a list, map or object, or the number of characters (grapheme clusters) of a string.",
	Params: []function.Parameter{{
		Name: "value", Type: cty.DynamicPseudoType, AllowDynamicType: true, AllowUnknown: true,
	}},
	Type: func(args []cty.Value) (cty.Type, error) {
		ty := args[0].Type()
		if ty == cty.String || ty.IsCollectionType() || ty.IsTupleType() || ty.IsObjectType() || ty == cty.DynamicPseudoType {
			return cty.Number, nil
		}
		return cty.NilType, function.NewArgErrorf(0, "argument must be a string, a collection type, or a structural type")
	},
	Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
		v := args[0]
		if !v.IsKnown() {
			return cty.UnknownVal(cty.Number), nil
		}
		switch ty := v.Type(); {
		case ty == cty.String:
			return stdlib.Strlen(v)
		case ty.IsObjectType():
			return cty.NumberIntVal(int64(len(ty.AttributeTypes()))), nil
		}
		return v.Length(), nil
	},
})

func stringPredicate(desc string, f func(s, part string) bool) function.Function {
	return function.New(&function.Spec{
		Description: desc,
		Params: []function.Parameter{
			{Name: "str", Type: cty.String},
			{Name: "part", Type: cty.String},
		},
		Type: function.StaticReturnType(cty.Bool),
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			return cty.BoolVal(f(args[0].AsString(), args[1].AsString())), nil
		},
	})
}

var (
	startsWithFunc  = stringPredicate("Reports whether str begins with part.", strings.HasPrefix)
	endsWithFunc    = stringPredicate("Reports whether str ends with part.", strings.HasSuffix)
	strContainsFunc = stringPredicate("Reports whether part occurs within str.", strings.Contains)
)

var sumFunc = function.New(&function.Spec{
	Description: "Returns the sum of a list of numbers; 0 for an empty list.",
	Params:      []function.Parameter{{Name: "list", Type: cty.List(cty.Number)}},
	Type:        function.StaticReturnType(cty.Number),
	Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
		total := cty.Zero
		for i, v := range args[0].AsValueSlice() {
			if v.IsNull() {
				return cty.NilVal, function.NewArgErrorf(0, "element %d is null", i)
			}
			total = total.Add(v)
		}
		return total, nil
	},
})

var uuidFunc = function.New(&function.Spec{
	Description: "Returns a new random (version 4) UUID string.",
	Type:        function.StaticReturnType(cty.String),
	Impl: func([]cty.Value, cty.Type) (cty.Value, error) {
		return cty.StringVal(newUUID()), nil
	},
})

var timestampFunc = function.New(&function.Spec{
	Description: "Returns the current UTC time in RFC 3339 format.",
	Type:        function.StaticReturnType(cty.String),
	Impl: func([]cty.Value, cty.Type) (cty.Value, error) {
		return cty.StringVal(now()), nil
	},
})

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func now() string { return time.Now().UTC().Format(time.RFC3339) }

// Native implementations.
//
// A native function handles the ordinary cases of its cty twin directly on
// JSON values. When it meets anything unusual (null where cty would
// complain, a type cty would convert in some subtle way, a malformed
// argument) it returns handled == false and the call goes through cty for
// that message, which gives exactly cty's result or error. Natives are used
// only when Scope.Functions holds the very function from Functions(), so a
// caller's own function of the same name is always respected.

type nativeFn func(args []Value) (result Value, handled bool)

type native struct {
	fn  nativeFn
	typ styp // static result type
}

var natives map[string]native

func init() {
	natives = map[string]native{
		"upper":       {nUpper, tString},
		"lower":       {nLower, tString},
		"length":      {nLength, tNumber},
		"contains":    {nContains, tBool},
		"coalesce":    {nCoalesce, tAny},
		"format":      {nFormat, tString},
		"jsonencode":  {nJSONEncode, tString},
		"jsondecode":  {nJSONDecode, tAny},
		"tostring":    {nToString, tString},
		"tonumber":    {nToNumber, tNumber},
		"tobool":      {nToBool, tBool},
		"concat":      {nConcat, tList},
		"keys":        {nKeys, tList},
		"values":      {nValues, tList},
		"lookup":      {nLookup, tAny},
		"merge":       {nMerge, tObject},
		"abs":         {numFn(math.Abs), tNumber},
		"ceil":        {numFn(math.Ceil), tNumber},
		"floor":       {numFn(math.Floor), tNumber},
		"min":         {nMinMax(false), tNumber},
		"max":         {nMinMax(true), tNumber},
		"trimspace":   {strFn(strings.TrimSpace), tString},
		"trimprefix":  {str2Fn(strings.TrimPrefix), tString},
		"trimsuffix":  {str2Fn(strings.TrimSuffix), tString},
		"replace":     {nReplace, tString},
		"split":       {nSplit, tList},
		"join":        {nJoin, tString},
		"substr":      {nSubstr, tString},
		"sum":         {nSum, tNumber},
		"startswith":  {predFn(strings.HasPrefix), tBool},
		"endswith":    {predFn(strings.HasSuffix), tBool},
		"strcontains": {predFn(strings.Contains), tBool},
		"uuid":        {func([]Value) (Value, bool) { return strVal(newUUID()), true }, tString},
		"timestamp":   {func([]Value) (Value, bool) { return strVal(now()), true }, tString},
	}
}

// str is a string argument: strings, numbers and bools convert, as cty
// converts arguments to string parameters. Non-ASCII text is NFC-normalized
// like every cty string.
func str(v Value) (string, bool) {
	s, msg := v.asString()
	if msg != "" {
		return "", false
	}
	if v.k == String && !isASCII(s) {
		s = norm.NFC.String(s)
	}
	return s, true
}

func num(v Value) (float64, bool) {
	if v.k == Number {
		return v.n, true
	}
	f, msg := toNumber(v)
	return f, msg == "" && v.k != Null
}

func strFn(f func(string) string) nativeFn {
	return func(a []Value) (Value, bool) {
		s, ok := str(a[0])
		if !ok {
			return Value{}, false
		}
		return strVal(f(s)), true
	}
}

func str2Fn(f func(string, string) string) nativeFn {
	return func(a []Value) (Value, bool) {
		s, ok1 := str(a[0])
		t, ok2 := str(a[1])
		if !ok1 || !ok2 {
			return Value{}, false
		}
		return strVal(f(s, t)), true
	}
}

func predFn(f func(string, string) bool) nativeFn {
	return func(a []Value) (Value, bool) {
		s, ok1 := str(a[0])
		t, ok2 := str(a[1])
		if !ok1 || !ok2 {
			return Value{}, false
		}
		return boolVal(f(s, t)), true
	}
}

func numFn(f func(float64) float64) nativeFn {
	return func(a []Value) (Value, bool) {
		x, ok := num(a[0])
		if !ok {
			return Value{}, false
		}
		return numVal(f(x)), true
	}
}

func nUpper(a []Value) (Value, bool) {
	if a[0].k == String && isASCII(a[0].s) {
		return strVal(strings.ToUpper(a[0].s)), true
	}
	s, ok := str(a[0])
	if !ok {
		return Value{}, false
	}
	return strVal(norm.NFC.String(strings.ToUpper(s))), true
}

func nLower(a []Value) (Value, bool) {
	if a[0].k == String && isASCII(a[0].s) {
		return strVal(strings.ToLower(a[0].s)), true
	}
	s, ok := str(a[0])
	if !ok {
		return Value{}, false
	}
	return strVal(norm.NFC.String(strings.ToLower(s))), true
}

func nLength(a []Value) (Value, bool) {
	switch v := a[0]; v.k {
	case String:
		return numVal(float64(graphemeCount(norm.NFC.String(v.s)))), true
	case List:
		return numVal(float64(len(v.list()))), true
	case Object:
		return numVal(float64(len(v.object()))), true
	}
	return Value{}, false
}

// nSum adds a list of numbers; anything else (strings to convert, nulls) goes through cty.
func nSum(a []Value) (Value, bool) {
	if a[0].k != List {
		return Value{}, false
	}
	total := 0.0
	for _, x := range a[0].list() {
		v := ValueOf(x)
		if v.k != Number {
			return Value{}, false
		}
		total += v.n
	}
	return numVal(total), true
}

func nContains(a []Value) (Value, bool) {
	if a[0].k != List {
		return Value{}, false
	}
	for _, x := range a[0].list() {
		if equal(ValueOf(x), a[1]) {
			return boolVal(true), true
		}
	}
	return boolVal(false), true
}

// nCoalesce handles arguments of one primitive type; mixed types, which
// cty unifies (coalesce(null, 1, "a") is "1"), go through cty.
func nCoalesce(a []Value) (Value, bool) {
	var first Value
	found := false
	for _, v := range a {
		switch v.k {
		case Null:
			continue
		case List, Object:
			return Value{}, false
		}
		if !found {
			first, found = v, true
		} else if v.k != first.k {
			return Value{}, false
		}
	}
	return first, found
}

func nToString(a []Value) (Value, bool) {
	switch a[0].k {
	case Null, String:
		return a[0], true
	case Number, Bool:
		s, _ := a[0].asString()
		return strVal(s), true
	}
	return Value{}, false
}

func nToNumber(a []Value) (Value, bool) {
	switch a[0].k {
	case Null, Number:
		return a[0], true
	case String:
		return parseNumber(a[0].s)
	}
	return Value{}, false
}

func nToBool(a []Value) (Value, bool) {
	switch a[0].k {
	case Null, Bool:
		return a[0], true
	case String:
		b, msg := toBool(a[0])
		return boolVal(b), msg == ""
	}
	return Value{}, false
}

func nConcat(a []Value) (Value, bool) {
	if len(a) == 0 {
		return Value{}, false
	}
	var out []any
	for _, v := range a {
		if v.k != List {
			return Value{}, false
		}
		out = append(out, v.list()...)
	}
	if out == nil {
		out = []any{}
	}
	return listVal(out), true
}

func sortedKeys(m map[string]any) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

func nKeys(a []Value) (Value, bool) {
	if a[0].k != Object {
		return Value{}, false
	}
	ks := sortedKeys(a[0].object())
	out := make([]any, len(ks))
	for i, k := range ks {
		out[i] = k
	}
	return listVal(out), true
}

func nValues(a []Value) (Value, bool) {
	if a[0].k != Object {
		return Value{}, false
	}
	m := a[0].object()
	ks := sortedKeys(m)
	out := make([]any, len(ks))
	for i, k := range ks {
		out[i] = m[k]
	}
	return listVal(out), true
}

func nLookup(a []Value) (Value, bool) {
	if a[0].k != Object || len(a) != 3 {
		return Value{}, false
	}
	k, ok := str(a[1])
	if !ok {
		return Value{}, false
	}
	if x, ok := a[0].object()[k]; ok {
		return ValueOf(x), true
	}
	return a[2], true
}

func nMerge(a []Value) (Value, bool) {
	out := map[string]any{}
	for _, v := range a {
		switch v.k {
		case Null:
			continue
		case Object:
			for k, x := range v.object() {
				out[k] = x
			}
		default:
			return Value{}, false
		}
	}
	return objVal(out), true
}

func nMinMax(isMax bool) nativeFn {
	return func(a []Value) (Value, bool) {
		if len(a) == 0 {
			return Value{}, false
		}
		var best float64
		for i, v := range a {
			x, ok := num(v)
			if !ok {
				return Value{}, false
			}
			if i == 0 || (isMax && x > best) || (!isMax && x < best) {
				best = x
			}
		}
		return numVal(best), true
	}
}

func nReplace(a []Value) (Value, bool) {
	s, ok1 := str(a[0])
	old, ok2 := str(a[1])
	repl, ok3 := str(a[2])
	if !ok1 || !ok2 || !ok3 {
		return Value{}, false
	}
	return strVal(strings.ReplaceAll(s, old, repl)), true
}

func nSplit(a []Value) (Value, bool) {
	sep, ok1 := str(a[0])
	s, ok2 := str(a[1])
	if !ok1 || !ok2 {
		return Value{}, false
	}
	parts := strings.Split(s, sep)
	out := make([]any, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return listVal(out), true
}

func nJoin(a []Value) (Value, bool) {
	sep, ok := str(a[0])
	if !ok || len(a) < 2 {
		return Value{}, false
	}
	var b strings.Builder
	n := 0
	for _, l := range a[1:] {
		if l.k != List {
			return Value{}, false
		}
		for _, x := range l.list() {
			s, ok := str(ValueOf(x))
			if !ok {
				return Value{}, false
			}
			if n > 0 {
				b.WriteString(sep)
			}
			b.WriteString(s)
			n++
		}
	}
	return strVal(b.String()), true
}

// nSubstr handles ASCII text without carriage returns, where every byte is
// one grapheme cluster; cty counts clusters, so anything else goes to cty.
func nSubstr(a []Value) (Value, bool) {
	s, ok := str(a[0])
	off, ok2 := num(a[1])
	length, ok3 := num(a[2])
	if !ok || !ok2 || !ok3 || !isASCII(s) || strings.IndexByte(s, '\r') >= 0 ||
		off != math.Trunc(off) || length != math.Trunc(length) || math.Abs(off) > 1<<31 || math.Abs(length) > 1<<31 {
		return Value{}, false
	}
	o, l := int(off), int(length)
	if o < 0 {
		o += len(s)
		if o < 0 {
			return Value{}, false
		}
	} else if l == 0 {
		return strVal(""), true
	}
	if o > len(s) || (o == len(s) && o > 0) {
		if l < 0 || o >= len(s) {
			return strVal(""), true
		}
	}
	sub := s[o:]
	if l < 0 || l >= len(sub) {
		return strVal(sub), true
	}
	return strVal(sub[:l]), true
}

// nFormat handles format strings made of %s, %d, %v, %t, %f/%e/%g with an
// explicit precision, and %%, with flags and width where fmt and cty agree.
// Anything else (%q, %[n] indexes, padded %s) goes through cty.
func nFormat(a []Value) (Value, bool) {
	f, ok := str(a[0])
	if !ok {
		return Value{}, false
	}
	args := a[1:]
	var b strings.Builder
	next := 0
	for i := 0; i < len(f); i++ {
		if f[i] != '%' {
			b.WriteByte(f[i])
			continue
		}
		j := i + 1
		for j < len(f) && strings.IndexByte("-+# 0", f[j]) >= 0 {
			j++
		}
		flags := f[i+1 : j]
		w := j
		for j < len(f) && f[j] >= '0' && f[j] <= '9' {
			j++
		}
		hasWidth := j > w
		hasPrec := false
		if j < len(f) && f[j] == '.' {
			hasPrec = true
			j++
			for j < len(f) && f[j] >= '0' && f[j] <= '9' {
				j++
			}
		}
		if j >= len(f) {
			return Value{}, false
		}
		verb, spec := f[j], f[i:j+1]
		i = j
		if verb == '%' {
			if spec != "%%" {
				return Value{}, false
			}
			b.WriteByte('%')
			continue
		}
		if next >= len(args) {
			return Value{}, false
		}
		arg := args[next]
		next++
		if arg.k == Null && verb != 'v' {
			return Value{}, false
		}
		switch verb {
		case 's':
			s, ok := str(arg)
			if !ok || hasWidth || hasPrec || flags != "" {
				return Value{}, false
			}
			b.WriteString(s)
		case 'v':
			if hasWidth || hasPrec || flags != "" {
				return Value{}, false
			}
			switch arg.k {
			case String:
				b.WriteString(arg.s)
			case Number:
				if arg.s != "" {
					return Value{}, false
				}
				b.WriteString(strconv.FormatFloat(arg.n, 'g', -1, 64))
			case Bool, Null:
				s := "null"
				if arg.k == Bool {
					s, _ = arg.asString()
				}
				b.WriteString(s)
			default:
				return Value{}, false
			}
		case 't':
			v, msg := toBool(arg)
			if msg != "" || flags != "" || hasWidth || hasPrec {
				return Value{}, false
			}
			b.WriteString(strconv.FormatBool(v))
		case 'd':
			x, ok := num(arg)
			if !ok || x != math.Trunc(x) || math.Abs(x) >= exactInt || hasPrec {
				return Value{}, false
			}
			fmt.Fprintf(&b, spec, int64(x))
		case 'f', 'e', 'E', 'g', 'G':
			x, ok := num(arg)
			if !ok || !hasPrec || math.IsInf(x, 0) || arg.s != "" {
				return Value{}, false
			}
			fmt.Fprintf(&b, spec, x)
		default:
			return Value{}, false
		}
	}
	if next != len(args) {
		return Value{}, false // cty reports unused arguments
	}
	return strVal(b.String()), true
}

func nJSONEncode(a []Value) (Value, bool) {
	b, ok := appendJSON(nil, a[0])
	if !ok {
		return Value{}, false
	}
	return strVal(string(b)), true
}

// appendJSON encodes like cty's JSON marshaller: object keys sorted,
// numbers in cty's decimal form, strings as encoding/json writes them.
func appendJSON(b []byte, v Value) ([]byte, bool) {
	switch v.k {
	case Null:
		return append(b, "null"...), true
	case Bool:
		return strconv.AppendBool(b, v.boolean()), true
	case Number:
		if math.IsInf(v.n, 0) || math.IsNaN(v.n) {
			return nil, false
		}
		return append(b, formatNumber(v)...), true
	case String:
		s, err := json.Marshal(norm.NFC.String(v.s))
		if err != nil {
			return nil, false
		}
		return append(b, s...), true
	case List:
		b = append(b, '[')
		for i, x := range v.list() {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendJSON(b, ValueOf(x)); !ok {
				return nil, false
			}
		}
		return append(b, ']'), true
	case Object:
		m := v.object()
		b = append(b, '{')
		for i, k := range sortedKeys(m) {
			if i > 0 {
				b = append(b, ',')
			}
			ks, _ := json.Marshal(k)
			b = append(b, ks...)
			b = append(b, ':')
			var ok bool
			if b, ok = appendJSON(b, ValueOf(m[k])); !ok {
				return nil, false
			}
		}
		return append(b, '}'), true
	}
	return nil, false
}

func nJSONDecode(a []Value) (Value, bool) {
	s, ok := str(a[0])
	if !ok {
		return Value{}, false
	}
	var out any
	if err := decodeJSON([]byte(s), &out); err != nil {
		return Value{}, false
	}
	return ValueOf(out), true
}

// decodeJSON decodes one JSON document keeping numbers exact.
func decodeJSON(b []byte, out *any) error {
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.UseNumber()
	if err := dec.Decode(out); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("extra data after the JSON value")
	}
	var extra any
	if err := dec.Decode(&extra); err == nil {
		return fmt.Errorf("extra data after the JSON value")
	}
	return nil
}
