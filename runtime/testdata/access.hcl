# Uses every kind of key and operation a run has: producing and stream sources, a file source's
# position, leases, durable retries, a dead-letter topic and the nodes' own dead-letter streams, a
# stage without leases, a stage read by reference, a redis_stream sink, retention, topics with a
# max_lag written by a source and by a stage, and a side output (a dedupe's duplicates) into a topic
# with a max_lag; offloaded payloads when offload_over is small. access_test.go: the access check
# covers a run, and a run without permissions fails.

pipeline "access" {
  delivery     = var.delivery
  offload_over = var.offload_over
}
variable "delivery" {}
variable "offload_over" {
  default = "64KiB"
}
variable "run" {}
variable "ext_in" {}
variable "ext_out" {}
variable "lines" {}
retry "twice" {
  max_attempts = 4
  backoff      = "constant"
  initial      = "20ms"
}
topic "orders" {
  partitions = 2
  key        = msg.key
  retention {
    max_len = 5
  }
}
topic "failed" {
  partitions = 1
  max_lag    = 1000
}
topic "lines" {
  partitions = 2
  max_lag    = 1000
}
source "file" {
  kind   = "file"
  path   = var.lines
  output = topic.lines
}
sink "echo" {
  kind  = "stdout"
  input = topic.lines
}
source "gen" {
  kind     = "generate"
  count    = 20
  output   = topic.orders
  template = { key = "k${index % 3}", seq = index, run = var.run }
}
source "ext" {
  kind   = "redis_stream"
  stream = var.ext_in
  output = topic.orders
}
stage "twice" {
  kind        = "go"
  func        = "test.twice"
  input       = topic.orders
  retry       = retry.twice
  dead_letter = topic.failed
}
stage "strict" {
  kind   = "map"
  input  = topic.orders
  output = topic.failed
  set    = { doubled = msg.missing * 2 }
}
stage "pick" {
  kind     = "filter"
  input    = stage.twice
  ordering = "none"
  where    = msg.seq >= 0
}
sink "out" {
  kind   = "redis_stream"
  input  = stage.pick
  stream = var.ext_out
}
sink "print" {
  kind  = "stdout"
  input = topic.failed
}
# Stateful, through a repartition topic: its state, its timers and its writers' watermarks.
stage "per_run" {
  kind     = "aggregate"
  input    = topic.orders
  group_by = msg.run
  window {
    type = "tumbling"
    size = "1h"
  }
  aggregate = { n = count() }
}
sink "counted" {
  kind  = "stdout"
  input = stage.per_run
}
# Keyed like its input (no repartition topic); its duplicates go to a topic of their own.
stage "once" {
  kind       = "dedupe"
  input      = topic.orders
  key        = msg.key
  within     = "1h"
  duplicates = topic.dupes
}
topic "dupes" {
  partitions = 2
  max_lag    = 1000
}
sink "dupes_out" {
  kind  = "stdout"
  input = topic.dupes
}
sink "firsts" {
  kind  = "stdout"
  input = stage.once
}
