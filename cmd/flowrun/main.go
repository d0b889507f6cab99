// Command flowrun compiles and runs declarative stream-processing pipelines on Redis.
//
// The commands live in package github.com/flowrun/flowrun/cmd so that a custom binary with extra
// Go stage functions is a blank import plus a call to cmd.Main (see examples/plugins).
package main

import "github.com/flowrun/flowrun/cmd"

func main() { cmd.Main() }
