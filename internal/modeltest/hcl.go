package modeltest

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Files are where a run of a draw keeps what the pipeline file names.
type Files struct {
	KeyPrefix string   // the pipeline's key_prefix
	Inputs    []string // the file each source reads, by Source.Input
	// Stream names the Redis stream a sink writes to.
	Stream func(sink string) string
}

// HCL renders the draw's pipeline as a pipeline file.
func (d *Draw) HCL(f Files) string {
	p := d.Pipeline
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w("# Drawn by internal/modeltest: %s\n", d)
	w("pipeline \"drawn\" {\n  key_prefix = %q\n  delivery   = %q\n", f.KeyPrefix, p.Delivery)
	if p.OffloadOver != "" {
		w("  offload_over = %q\n", p.OffloadOver)
	}
	w("}\n")
	for _, t := range p.Topics {
		w("\ntopic %q {\n  partitions = %d\n", t.Name, t.Partitions)
		if t.Key != nil {
			w("  key        = %s\n", t.Key.HCL)
		}
		w("}\n")
	}
	for _, t := range p.Tables {
		w("\ntable %q {\n  input = topic.%s\n", t.Name, t.Input.Name)
		if t.Key != nil {
			w("  key   = %s\n", t.Key.HCL)
		}
		if t.Versioned {
			w("  history    = \"1000h\"\n  event_time = msg.upd\n")
		}
		w("}\n")
	}
	for _, s := range p.Sources {
		w("\nsource %q {\n  kind   = \"file\"\n  path   = %q\n  output = topic.%s\n}\n", s.Name, f.Inputs[s.Input], s.Output.Name)
	}
	for _, s := range p.Stages {
		if s.Kind == "join" {
			w("\nstage %q {\n  kind  = \"join\"\n", s.Name)
		} else {
			w("\nstage %q {\n  kind  = %q\n  input = %s\n", s.Name, s.Kind, s.Input.HCL())
		}
		if s.Output != nil {
			w("  output = topic.%s\n", s.Output.Name)
		}
		switch s.Kind {
		case "filter":
			w("  where = %s\n", s.Where.HCL)
		case "map":
			if len(s.Set) > 0 {
				w("  set = {\n")
				for _, f := range s.Set {
					w("    %s = %s\n", f.Name, f.Expr.HCL)
				}
				w("  }\n")
			}
			if len(s.Drop) > 0 {
				names, _ := json.Marshal(s.Drop)
				w("  drop = %s\n", names)
			}
		case "route":
			for _, c := range s.Cases {
				w("  case {\n    when   = %s\n    output = topic.%s\n  }\n", c.When.HCL, c.Output.Name)
			}
			if s.Default != nil {
				w("  default = topic.%s\n", s.Default.Name)
			}
		case "dedupe":
			w("  key        = %s\n  within     = %q\n  event_time = %s\n", s.Key.HCL, duration(s.Within), s.EventTime.HCL)
			if s.Duplicates != nil {
				w("  duplicates = topic.%s\n", s.Duplicates.Name)
			}
		case "aggregate":
			w("  group_by = %s\n", s.GroupBy.HCL)
			if s.EventTime != nil {
				w("  event_time = %s\n", s.EventTime.HCL)
			}
			w("  grace = %q\n", duration(s.Grace))
			if s.LateTopic != nil {
				w("  late  = topic.%s\n", s.LateTopic.Name)
			} else {
				w("  late  = %q\n", s.Late)
			}
			// Only events and the end of the job move watermarks: which windows close mid-stream
			// depends on the data, not on how long the run takes.
			w("  idle_timeout = \"0s\"\n")
			w("  window {\n    type = %q\n", s.Window.Type)
			switch s.Window.Type {
			case "session":
				w("    gap  = %q\n", duration(s.Window.Gap))
			case "hopping":
				w("    size    = %q\n    advance = %q\n", duration(s.Window.Size), duration(s.Window.Advance))
			default:
				w("    size = %q\n", duration(s.Window.Size))
			}
			w("  }\n  aggregate = {\n")
			for _, a := range s.Aggregates {
				switch {
				case a.Arg == nil:
					w("    %s = %s()\n", a.Name, a.Func)
				case a.By != nil:
					w("    %s = %s(%s, %s)\n", a.Name, a.Func, a.Arg.HCL, a.By.HCL)
				case a.Func == "top_k":
					w("    %s = top_k(%s, %d)\n", a.Name, a.Arg.HCL, a.K)
				default:
					w("    %s = %s(%s)\n", a.Name, a.Func, a.Arg.HCL)
				}
			}
			w("  }\n")
		case "join":
			w("  type   = %q\n  before = %q\n  after  = %q\n  grace  = %q\n", s.JoinType, duration(s.Before), duration(s.After), duration(s.Grace))
			w("  late         = \"dead_letter\"\n  idle_timeout = \"0s\"\n")
			w("  left {\n    input      = %s\n    key        = %s\n    event_time = %s\n  }\n", s.Input.HCL(), s.Key.HCL, s.EventTime.HCL)
			w("  right {\n    input      = %s\n    key        = %s\n    event_time = %s\n  }\n", s.Right.HCL(), s.RightKey.HCL, s.RightEventTime.HCL)
			w("  select = {\n")
			for _, f := range s.Select {
				w("    %s = %s\n", f.Name, f.Expr.HCL)
			}
			w("  }\n")
		case "rate_limit":
			if s.Key != nil {
				w("  key   = %s\n", s.Key.HCL)
			}
			w("  rate  = %d\n  per   = \"1s\"\n  burst = %d\n", s.Rate, s.Burst)
		case "lookup":
			w("  table   = table.%s\n  key     = %s\n  as      = %q\n  missing = %q\n", s.Table.Name, s.Key.HCL, s.As, s.Missing)
			if s.AsOf != nil {
				w("  as_of   = %s\n", s.AsOf.HCL)
			}
		case "pattern":
			w("  key        = %s\n  event_time = %s\n  within     = %q\n  grace      = %q\n", s.Key.HCL, s.EventTime.HCL, duration(s.Within), duration(s.Grace))
			w("  late         = \"dead_letter\"\n  idle_timeout = \"0s\"\n  sequence = [\n")
			for _, step := range s.Steps {
				w("    { name = %q, where = %s },\n", step.Name, step.Where.HCL)
			}
			w("  ]\n  select = {\n")
			for _, f := range s.Select {
				w("    %s = %s\n", f.Name, f.Expr.HCL)
			}
			w("  }\n")
		}
		w("}\n")
	}
	for _, s := range p.Sinks {
		w("\nsink %q {\n  kind   = \"redis_stream\"\n  input  = %s\n  stream = %q\n}\n", s.Name, s.Input.HCL(), f.Stream(s.Name))
	}
	return b.String()
}

// Input is a source's input as JSON lines.
func (d *Draw) Input(i int) string {
	var b strings.Builder
	for _, m := range d.Inputs[i] {
		line, err := json.Marshal(m)
		if err != nil {
			panic(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.String()
}

// duration writes a duration as the language reads it, in whole milliseconds.
func duration(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
}
