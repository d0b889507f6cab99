package flowtest

import (
	"encoding/xml"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// WriteJUnit writes `flowrun test -junit-xml FILE`: the JUnit XML that CI test reporters read
// (Jenkins, GitLab, GitHub actions that publish test results). Each test file is a testsuite named
// after its path, each run a testcase with the file as its classname. A run whose expectations
// failed gets a <failure> (its message the first failure's summary), one that could not be carried
// out an <error>; the element's text has every failure's place, summary, diff and why lines.
func WriteJUnit(w io.Writer, results []*RunResult) error {
	doc := junitSuites{}
	index := map[string]int{} // file → its suite in doc.Suites, in order of first result
	var total time.Duration
	for _, r := range results {
		i, ok := index[r.File]
		if !ok {
			i = len(doc.Suites)
			index[r.File] = i
			doc.Suites = append(doc.Suites, junitSuite{Name: r.File})
		}
		s := &doc.Suites[i]
		c := junitCase{Classname: r.File, Name: r.Run, Time: seconds(r.Wall)}
		switch {
		case r.Err != nil:
			c.Error = &junitProblem{Message: firstLine(r.Err.Error()), Type: "error", Text: cdata(junitText(r))}
			s.Errors++
		case len(r.Failures) > 0:
			c.Failure = &junitProblem{Message: firstLine(r.Failures[0].Summary), Type: "expectation", Text: cdata(junitText(r))}
			s.Failures++
		}
		s.Tests++
		s.wall += r.Wall
		s.Cases = append(s.Cases, c)
		total += r.Wall
	}
	for i := range doc.Suites {
		s := &doc.Suites[i]
		s.Time = seconds(s.wall)
		doc.Tests += s.Tests
		doc.Failures += s.Failures
		doc.Errors += s.Errors
	}
	doc.Time = seconds(total)

	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Tests    int          `xml:"tests,attr"`
	Failures int          `xml:"failures,attr"`
	Errors   int          `xml:"errors,attr"`
	Time     string       `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name     string      `xml:"name,attr"`
	Tests    int         `xml:"tests,attr"`
	Failures int         `xml:"failures,attr"`
	Errors   int         `xml:"errors,attr"`
	Time     string      `xml:"time,attr"`
	Cases    []junitCase `xml:"testcase"`

	wall time.Duration
}

type junitCase struct {
	Classname string        `xml:"classname,attr"`
	Name      string        `xml:"name,attr"`
	Time      string        `xml:"time,attr"`
	Failure   *junitProblem `xml:"failure,omitempty"`
	Error     *junitProblem `xml:"error,omitempty"`
}

// junitProblem's text is CDATA so that a diff keeps its lines readable in the file; encoding/xml
// would write every newline of character data as &#xA;.
type junitProblem struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
	Text    string `xml:",cdata"`
}

// junitText is the full text of a failed run: each failure's place, summary, diff and why, then
// the error.
func junitText(r *RunResult) string {
	var sb strings.Builder
	for _, f := range r.Failures {
		if f.Range.Filename != "" {
			fmt.Fprintf(&sb, "%s:%d: ", f.Range.Filename, f.Range.Start.Line)
		}
		sb.WriteString(f.Summary + "\n")
		if detail := failureDetail(&f); detail != "" {
			sb.WriteString(detail + "\n")
		}
		sb.WriteString("\n")
	}
	if r.Err != nil {
		sb.WriteString("error: " + r.Err.Error() + "\n")
	}
	return strings.TrimRight(sb.String(), "\n")
}

// cdata makes s safe inside CDATA: characters XML 1.0 does not allow (most control characters, say
// from a payload) become U+FFFD, as encoding/xml does for attributes and character data but not for
// CDATA. encoding/xml itself splits a "]]>" in CDATA.
func cdata(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' ||
			r >= 0x20 && r <= 0xD7FF || r >= 0xE000 && r <= 0xFFFD || r >= 0x10000 && r <= 0x10FFFF {
			return r
		}
		return utf8.RuneError
	}, s)
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}

// seconds writes a duration as JUnit's time attribute: seconds with milliseconds.
func seconds(d time.Duration) string {
	return fmt.Sprintf("%.3f", d.Seconds())
}
