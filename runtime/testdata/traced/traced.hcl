# Three stages chained by reference, into a topic that a sink reads: the hops a message's trace
# follows (tracing_test.go, metrics_test.go). gen.hcl beside it feeds topic in: the directory is
# the whole pipeline, and this file alone the pipeline whose topic the test feeds.

pipeline "traced" {}
topic "in" {
  partitions = 2
  key        = msg.k
}
stage "a" {
  kind  = "map"
  input = topic.in
  set   = { a = true }
}
stage "b" {
  kind  = "filter"
  input = stage.a
  where = true
}
stage "c" {
  kind   = "map"
  input  = stage.b
  output = topic.out
  set    = { c = true }
}
topic "out" { partitions = 2 }
sink "print" {
  kind  = "stdout"
  input = topic.out
}
