# Its stage reads a topic that its source writes, so that a message arriving there without trace
# context is one whose trace the source did not sample: only a traceparent that was dropped makes
# the stage start a trace (hostile_test.go).

pipeline "garbage" {}
topic "in" {}
topic "out" {}
source "gen" {
  kind     = "generate"
  count    = 1
  output   = topic.in
  template = { n = 0 }
}
stage "a" {
  kind   = "map"
  input  = topic.in
  output = topic.out
  set    = { a = true }
}
sink "print" {
  kind  = "stdout"
  input = topic.out
}
