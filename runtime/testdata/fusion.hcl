# Three Go stages fused in one hop (fusion.first, fusion.split, fusion.flaky: fusion_test.go) into
# a file. in_place retries the third stage's failures in place.

pipeline "fusion" {
  delivery = var.delivery
}
variable "out" {}
variable "run" {}
variable "delivery" { default = "at_least_once" }
variable "in_place" { default = false }
retry "later" {
  max_attempts = 3
  backoff      = "constant"
  initial      = "20ms"
}
topic "in" {
  partitions = 2
  key        = msg.key
}
stage "first" {
  kind  = "go"
  func  = "fusion.first"
  input = topic.in
}
stage "split" {
  kind  = "go"
  func  = "fusion.split"
  input = stage.first
}
stage "flaky" {
  kind           = "go"
  func           = "fusion.flaky"
  input          = stage.split
  retry          = retry.later
  retry_in_place = var.in_place
}
sink "out" {
  kind  = "file"
  input = stage.flaky
  path  = var.out
}
