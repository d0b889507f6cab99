// Command flowrun-acme is flowrun with ACME's stage functions and sink kind built in: the whole of a
// custom binary.
package main

import (
	"github.com/flowrun/flowrun/cmd"

	_ "github.com/flowrun/flowrun/examples/plugins/acme" // registers acme.score, acme.velocity and the acme_csv sink
)

func main() { cmd.Main() }
