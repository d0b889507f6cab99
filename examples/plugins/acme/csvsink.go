package acme

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"

	"github.com/flowrun/flowrun/flow"
	"github.com/flowrun/flowrun/stages"
)

// A sink kind of ACME's own, registered the way flowrun registers its built-in kinds: the spec
// (attributes, docs, example) goes to the language, so that validation, `flowrun-acme schema` and
// its reference docs know the kind, and the constructor to the runtime.
func init() {
	stages.RegisterSink(stages.SinkKind{
		Spec: &flow.Kind{
			Name: "acme_csv",
			Doc: "Appends chosen fields of each message as a CSV row to a file, for the review team's " +
				"spreadsheet. The file is synced before a batch is acknowledged.",
			Attributes: []flow.Attribute{
				{Name: "path", Type: flow.TypeString, Required: true, Doc: "The CSV file to append to."},
				{Name: "columns", Type: flow.TypeStringList, Required: true, Doc: "The message fields to write, in order; a missing field is an empty cell."},
				{Name: "header", Type: flow.TypeBool, Default: true, Doc: "Whether a new (empty) file starts with a row of the column names."},
			},
			Example: `sink "review_sheet" {
  kind    = "acme_csv"
  input   = topic.risky
  path    = "review.csv"
  columns = ["id", "customer", "risk"]
}`,
			Check: func(c *flow.KindCheck) {
				if len(c.Config.Strings("columns")) == 0 {
					c.Errorf("columns", "No columns", "An acme_csv sink needs at least one column.")
				}
			},
		},
		Traits: stages.SinkTraits{Inline: true},
		New: func(s *flow.Sink, _ stages.Env) (stages.Sink, error) {
			return &csvSink{path: s.Config.String("path"), columns: s.Config.Strings("columns"), header: s.Config.Bool("header")}, nil
		},
	})
}

// csvSink writes rows to a file. Its deliveries of different partitions come concurrently.
type csvSink struct {
	path    string
	columns []string
	header  bool

	mu sync.Mutex
	f  *os.File
	w  *csv.Writer
}

func (s *csvSink) Open(context.Context) error {
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	s.f, s.w = f, csv.NewWriter(f)
	if st, err := f.Stat(); err == nil && st.Size() == 0 && s.header {
		return s.w.Write(s.columns)
	}
	return nil
}

func (s *csvSink) Deliver(_ context.Context, m *stages.Message, out []stages.Write) ([]stages.Write, error) {
	if err := m.Decode(); err != nil {
		return out, err
	}
	row := make([]string, len(s.columns))
	for i, c := range s.columns {
		if v, ok := m.Value[c]; ok && v != nil {
			row[i] = fmt.Sprint(v)
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return out, s.w.Write(row)
}

// Flush writes the buffered rows and syncs the file: only then may the batch be acknowledged.
func (s *csvSink) Flush(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.w.Flush()
	if err := s.w.Error(); err != nil {
		// A csv.Writer's error sticks: start a new one, and let the runtime deliver the batch again.
		s.w = csv.NewWriter(s.f)
		return err
	}
	return s.f.Sync()
}

func (s *csvSink) Close() error {
	if s.f == nil {
		return nil
	}
	return errors.Join(s.Flush(context.Background()), s.f.Close())
}

var _ io.Closer = (*csvSink)(nil)
