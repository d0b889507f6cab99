# Reads keyed messages through test.gate (faults_test.go), and a filter fused after it, into a
# stream out that other applications read.

pipeline "faults" {}
variable "out" {}
topic "in" {
  partitions = 4
  key        = msg.k
}
stage "work" {
  kind        = "go"
  func        = "test.gate"
  input       = topic.in
  concurrency = 4
}
stage "pass" {
  kind  = "filter"
  input = stage.work
  where = true
}
sink "out" {
  kind   = "redis_stream"
  input  = stage.pass
  stream = var.out
}
