# A filter that passes everything, from a topic of two partitions to stdout: the pipeline of the
# tests of the HTTP endpoints, the live page and the rates (http_test.go, visible_test.go).

pipeline "web" {}
topic "in" { partitions = 2 }
stage "pass" {
  kind  = "filter"
  input = topic.in
  where = true
}
sink "out" {
  kind  = "stdout"
  input = stage.pass
}
