// Command flowrun-acme is flowrun with ACME's stage functions built in: the whole of a custom binary.
package main

import (
	"github.com/flowrun/flowrun/cmd"

	_ "github.com/flowrun/flowrun/examples/plugins/acme" // registers acme.score
)

func main() { cmd.Main() }
