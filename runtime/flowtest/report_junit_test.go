package flowtest

import (
	"encoding/xml"
	"strings"
	"testing"
)

// The JUnit schema as CI parsers read it, decoded independently of the writer's types.
type parsedJUnit struct {
	Tests    int    `xml:"tests,attr"`
	Failures int    `xml:"failures,attr"`
	Errors   int    `xml:"errors,attr"`
	Time     string `xml:"time,attr"`
	Suites   []struct {
		Name     string `xml:"name,attr"`
		Tests    int    `xml:"tests,attr"`
		Failures int    `xml:"failures,attr"`
		Errors   int    `xml:"errors,attr"`
		Time     string `xml:"time,attr"`
		Cases    []struct {
			Classname string `xml:"classname,attr"`
			Name      string `xml:"name,attr"`
			Time      string `xml:"time,attr"`
			Failure   *struct {
				Message string `xml:"message,attr"`
				Type    string `xml:"type,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

func TestWriteJUnit(t *testing.T) {
	results := sampleResults()
	var sb strings.Builder
	if err := WriteJUnit(&sb, results); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	if !strings.HasPrefix(out, xml.Header) {
		t.Errorf("no XML header:\n%s", out)
	}
	var doc parsedJUnit
	if err := xml.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("does not parse: %v\n%s", err, out)
	}
	if doc.Tests != 3 || doc.Failures != 1 || doc.Errors != 1 || doc.Time != "1.014" {
		t.Errorf("testsuites tests=%d failures=%d errors=%d time=%s", doc.Tests, doc.Failures, doc.Errors, doc.Time)
	}
	if len(doc.Suites) != 2 || doc.Suites[0].Name != "tests/a.flowtest.hcl" || doc.Suites[1].Name != "tests/b.flowtest.hcl" {
		t.Fatalf("suites %+v", doc.Suites)
	}
	a, b := doc.Suites[0], doc.Suites[1]
	if a.Tests != 2 || a.Failures != 1 || a.Errors != 0 || len(a.Cases) != 2 || b.Tests != 1 || b.Errors != 1 || len(b.Cases) != 1 {
		t.Errorf("suite counts %+v %+v", a, b)
	}
	pass, fail, crash := a.Cases[0], a.Cases[1], b.Cases[0]
	if pass.Name != "happy path" || pass.Classname != "tests/a.flowtest.hcl" || pass.Time != "0.012" || pass.Failure != nil || pass.Error != nil {
		t.Errorf("passing case %+v", pass)
	}
	if fail.Name != results[1].Run {
		t.Errorf("name %q did not survive escaping, want %q", fail.Name, results[1].Run)
	}
	if fail.Failure == nil || fail.Failure.Type != "expectation" || fail.Failure.Message != results[1].Failures[0].Summary {
		t.Fatalf("failure %+v", fail.Failure)
	}
	for _, want := range []string{
		"t.flowtest.hcl:7: sink.out: 1 of 1 expected message did not arrive",
		"- {\"a\":\"<&>\"}\n+ {\"a\":\"]]>\uFFFD\"}",
		"What happened:\n  stage.x retried 2 times",
	} {
		if !strings.Contains(fail.Failure.Text, want) {
			t.Errorf("failure text lacks %q:\n%s", want, fail.Failure.Text)
		}
	}
	if crash.Error == nil || crash.Error.Message != "pipeline stopped:" || !strings.Contains(crash.Error.Text, "boom") || crash.Failure != nil {
		t.Errorf("error case %+v", crash)
	}
	if strings.Contains(out, "&#xA;- ") {
		t.Errorf("the diff's newlines are escaped, not kept:\n%s", out)
	}
}

func TestWriteJUnitEmpty(t *testing.T) {
	var sb strings.Builder
	if err := WriteJUnit(&sb, nil); err != nil {
		t.Fatal(err)
	}
	var doc parsedJUnit
	if err := xml.Unmarshal([]byte(sb.String()), &doc); err != nil || doc.Tests != 0 {
		t.Errorf("%v %+v\n%s", err, doc, sb.String())
	}
}
