# Reads a file into a one-partition topic capped at max_lag = 50, which a sink copies to the stream
# out: a run of the source alone is held back once it has written 50 lines (safety_test.go).

pipeline "srclease" {
  delivery = var.delivery
}
variable "delivery" {}
variable "out" {}
variable "path" {}
topic "in" {
  max_lag = 50
}
source "lines" {
  kind   = "file"
  path   = var.path
  output = topic.in
}
sink "out" {
  kind   = "redis_stream"
  input  = topic.in
  stream = var.out
}
