// Command flowrun-shutdown is flowrun with the Go stage functions of internal/teststages, for the
// tests that stop a flowrun process while a Go stage has work in flight.
package main

import (
	"github.com/flowrun/flowrun/cmd"
	_ "github.com/flowrun/flowrun/internal/teststages"
)

func main() { cmd.Main() }
