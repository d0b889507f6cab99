# test.twice (failures_test.go) with a retry policy of three attempts, durable or in place, from a
# keyed topic into a file. gen.hcl beside it feeds the topic: the directory is the whole pipeline,
# and this file alone the pipeline whose topic the test feeds.

pipeline "retries" {}
variable "out" {}
variable "in_place" { default = false }
variable "run" {}
retry "three" {
  max_attempts = 3
  backoff      = "constant"
  initial      = "30ms"
}
topic "in" {
  partitions = 2
  key        = msg.key
}
stage "twice" {
  kind           = "go"
  func           = "test.twice"
  input          = topic.in
  retry          = retry.three
  retry_in_place = var.in_place
}
sink "out" {
  kind  = "file"
  input = stage.twice
  path  = var.out
}
